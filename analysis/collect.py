"""Gather what the HTML report shows from MLflow: the edge between the store and
:func:`analysis.report.render_report`.

Reads the runs (and sweep parent runs), chooses the objectives (the sweep's own unless given:
:mod:`analysis.sweep_objectives`), computes the fronts, draws the figures into memory, fetches
the round-by-round histories of the front's runs (a run without a formal DP guarantee at
``epsilon = inf`` there too, its shared part's spend as ``epsilon_shared``) and the attack image
grids, and records the provenance of the report itself.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.artifacts import attack_grid, sweep_spec
from analysis.fronts import FrontAnalysis, analyse_front
from analysis.guarantees import apply_guarantees_to_histories
from analysis.load import load_histories, load_runs, open_store
from analysis.pareto import Objective
from analysis.report import AttackGrid, ReportData, SweepInfo
from analysis.sweep_objectives import choose_objectives, sweep_objectives
from analysis.tables import fmt, run_ids_of

__all__ = ["CURVE_METRICS", "collect_report"]

#: the round-by-round panels of the report
CURVE_METRICS = ("accuracy", "round_bytes_up", "epsilon")
#: a decentralized (meta-learning) run's curves against communication (LoDMeta's Figures 1-4)
COMM_METRICS = ("comm_units", "unseen_accuracy")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _generator() -> dict[str, str]:
    from analysis.provenance import git_commit

    out = {"fedsweep.git_commit": git_commit(), "python": platform.python_version()}
    out |= {dist: _version(dist) for dist in ("fedsweep", "mlflow", "pandas", "plotly")}
    return out


def _sweeps(parents: pd.DataFrame, client: Any) -> list[SweepInfo]:
    infos = []
    for row in parents.to_dict("records"):
        params = {
            k[len("params.") :]: fmt(v)
            for k, v in row.items()
            if str(k).startswith("params.sweep.") and v is not None and v == v
        }
        infos.append(
            SweepInfo(
                name=str(row.get("sweep") or row.get("run_name")),
                run_id=row["run_id"],
                experiment_id=str(row["experiment_id"]),
                params=params,
                spec=sweep_spec(row["run_id"], client=client),
            )
        )
    return infos


def _chosen_runs(analysis: FrontAnalysis, limit: int) -> list[str]:
    """The runs whose rounds are drawn: the best (first-objective) run of each group's front,
    or the overall front's runs without groups."""
    fronts = list(analysis.result.per_group.values()) or [analysis.result.front]
    ids: list[str] = []
    for front in fronts:
        rows = front.head(1) if analysis.result.per_group else front
        for _, row in rows.iterrows():
            ids.extend(i for i in run_ids_of(row)[:1] if i not in ids)
    return ids[:limit]


def _grids(
    runs: pd.DataFrame, front_ids: list[str], client: Any, tmp: Path, per_group: int
) -> list[AttackGrid]:
    """Attack grids, front runs first, at most ``per_group`` per algorithm."""
    ok = runs[runs["status"] == "FINISHED"] if "status" in runs.columns else runs
    order = sorted(ok.to_dict("records"), key=lambda r: r["run_id"] not in front_ids)
    shown: dict[str, int] = {}
    grids = []
    for row in order:
        algorithm = str(row.get("algorithm"))
        if shown.get(algorithm, 0) >= per_group:
            continue
        path = attack_grid(row["run_id"], tmp / "grids", client=client)
        if path is not None:
            grids.append(AttackGrid(row["run_id"], algorithm, path.read_bytes()))
            shown[algorithm] = shown.get(algorithm, 0) + 1
    return grids


def collect_report(
    experiments: Sequence[str],
    objectives: Sequence[Objective] | None = None,
    *,
    uri: str | None = None,
    filter_string: str = "",
    sweep: str | None = None,
    by: str = "algorithm",
    mlflow_url: str = "http://127.0.0.1:5000",
    reference: Sequence[float] | None = None,
    max_curves: int = 8,
    grids_per_group: int = 2,
    title: str | None = None,
    interactive: bool = True,
) -> ReportData:
    """Everything :func:`analysis.report.render_report` needs, read from the tracking store.

    ``objectives`` None: the sweep's own (:mod:`analysis.sweep_objectives`).

    Raises:
        analysis.load.LoadError: a missing store, an unknown experiment, a malformed filter.
        analysis.fronts.ObjectiveError: an objective no run reports, or (objectives None)
            runs from sweeps with different objectives.
        ValueError: a ``by`` column the runs lack.
    """
    from analysis.interactive import figure_html, pareto_figure
    from analysis.plots import plot_pareto_2d
    from analysis.rounds import plot_against, plot_rounds

    client = open_store(uri)
    frame = load_runs(
        experiments, filter_string=filter_string, sweep=sweep, uri=uri, include_parents=True
    )
    kind = frame["kind"] if "kind" in frame.columns else pd.Series("run", index=frame.index)
    parents, runs = frame[kind == "sweep"], frame[kind != "sweep"].reset_index(drop=True)
    source = "--objectives"
    if objectives is None:
        objectives, source = choose_objectives(sweep_objectives(frame, client))
    objectives = list(objectives)
    analysis = analyse_front(runs, objectives, by=by, reference=reference)
    table = analysis.result.table
    data = ReportData(
        title=title or f"FedSweep report: {', '.join(experiments)}",
        experiments=[
            (str(n), str(i))
            for n, i in frame[["experiment", "experiment_id"]].drop_duplicates().to_numpy()
        ],
        tracking_uri=client.tracking_uri,
        mlflow_url=mlflow_url,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        runs=runs,
        analysis=analysis,
        by=by,
        sweeps=_sweeps(parents, client),
        generator=_generator(),
        filter_string=filter_string,
        objectives_from=source,
    )
    with tempfile.TemporaryDirectory(prefix="fedsweep-report-") as tmp_name:
        tmp = Path(tmp_name)
        if len(objectives) >= 2:
            x, y = objectives[0], objectives[1]  # as `fedsweep sweep` and `pareto` draw it
            png = plot_pareto_2d(table, x, y, by=by, path=tmp / "pareto.png")
            data.pareto_png = png.read_bytes()
            if interactive:
                data.pareto_html = figure_html(pareto_figure(table, x, y, by=by))
        chosen = _chosen_runs(analysis, max_curves)
        if chosen:
            history = load_histories(
                chosen, (*CURVE_METRICS, *COMM_METRICS), uri=client.tracking_uri
            )
            history = apply_guarantees_to_histories(history, runs)
            if (history["metric"] == "comm_units").any():
                algorithm = dict(zip(runs["run_id"], runs["algorithm"], strict=True))
                ys = [m for m in ("accuracy", "unseen_accuracy") if (history["metric"] == m).any()]
                data.comm_png = plot_against(
                    history,
                    "comm_units",
                    ys,
                    tmp / "comm.png",
                    labels={i: f"{algorithm.get(i)} {i[:6]}" for i in chosen},
                ).read_bytes()
            history = history[history["metric"].isin(CURVE_METRICS)]
            if len(history):
                algorithm = dict(zip(runs["run_id"], runs["algorithm"], strict=True))
                labels = {i: f"{algorithm.get(i)} {i[:6]}" for i in chosen}
                shown = (*CURVE_METRICS, "epsilon_shared")  # a shared-only run's old epsilon
                metrics = [m for m in shown if (history["metric"] == m).any()]
                data.curves_png = plot_rounds(
                    history, metrics, tmp / "curves.png", labels=labels
                ).read_bytes()
                data.curve_runs = chosen
        front_ids = [i for _, r in analysis.result.front.iterrows() for i in run_ids_of(r)]
        data.attack_grids = _grids(runs, front_ids, client, tmp, grids_per_group)
    return data
