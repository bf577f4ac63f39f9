"""One self-contained HTML page about a sweep: spec, fronts, best configs, communication,
attacks, the paper's numbers beside ours, provenance.

:func:`render_report` is a pure function of a :class:`ReportData` (frames, image bytes, dicts):
images become base64 ``data:`` URIs and plotly.js is inlined, so the page needs no network and
no other file. :mod:`analysis.collect` gathers a ``ReportData`` from MLflow.

The summary counts the runs left out of the fronts as invalid, by reason (not FINISHED, a trial
FAILED or PRUNED, stopped early, an objective not measured: :mod:`analysis.validity`), with the
failure reasons the runs were tagged with. The front table shows what each epsilon guarantees
(``dp_guarantee``, ``dp_relation``), and the notes of the front (epsilons under different
neighbouring relations) stand above the plot and the table.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import pandas as pd

from analysis.fronts import FrontAnalysis
from analysis.paper import ATTACK_DATASETS, PAPER, accuracy_comparison, attack_comparison
from analysis.pareto import Objective
from analysis.tables import (
    best_configs,
    communication,
    fmt,
    fmt_bytes,
    mean_std,
    run_ids_of,
    shared_config,
)

__all__ = ["AttackGrid", "ReportData", "SweepInfo", "render_report", "run_url"]

_LEAK = ("leak_psnr", "leak_ssim", "leak_lpips", "leak_psnr_max", "leak_ssim_max")
#: beside each attack grid: the raw figures, then what they gain over a no-information guess
_LEAK_CAPTION = (
    *_LEAK,
    "leak_psnr_gain",
    "leak_identified",
    "leak_identified_p",
    "leak_informative",
    "leak_psnr_gain_worst_round",
    "leak_identified_worst_round",
)
#: shown beside each attack grid, not as provenance
_ATTACK_TAGS = {
    "tags.leak_lpips_reason",
    "tags.leak_reason",
    "tags.leak_identified_by",
    "tags.attack",
    "tags.attack.labels",
}


@dataclass(frozen=True)
class SweepInfo:
    """A sweep's parent run: its name, id, the ``sweep.*`` params and the logged spec."""

    name: str
    run_id: str
    experiment_id: str
    params: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class AttackGrid:
    """One run's attack reconstructions image (PNG bytes)."""

    run_id: str
    algorithm: str
    png: bytes


@dataclass
class ReportData:
    """Everything the page shows. Frames are those of :mod:`analysis.load` /
    :mod:`analysis.fronts`; images are PNG bytes."""

    title: str
    experiments: list[tuple[str, str]]  # (name, id)
    tracking_uri: str
    mlflow_url: str
    generated: str
    runs: pd.DataFrame
    analysis: FrontAnalysis
    by: str = "algorithm"
    sweeps: list[SweepInfo] = field(default_factory=list)
    pareto_png: bytes | None = None
    pareto_html: str | None = None
    curves_png: bytes | None = None
    curve_runs: list[str] = field(default_factory=list)
    #: accuracy against cumulative communication (``comm_units``), for decentralized runs
    comm_png: bytes | None = None
    attack_grids: list[AttackGrid] = field(default_factory=list)
    generator: dict[str, str] = field(default_factory=dict)
    filter_string: str = ""
    objectives_from: str = "--objectives"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI page of a run: ``<base>/#/experiments/<exp>/runs/<run>``."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _links(data: ReportData, ids: list[str]) -> list[dict[str, str]]:
    exp_of = (
        dict(zip(data.runs["run_id"], data.runs["experiment_id"], strict=True))
        if {"run_id", "experiment_id"} <= set(data.runs.columns)
        else {}
    )
    return [
        {"id": i, "short": i[:8], "url": run_url(data.mlflow_url, str(exp_of.get(i, "0")), i)}
        for i in ids
    ]


def _guarantee(row: pd.Series) -> str:
    """``"isrl (add-remove)"``; ``""`` for a run made before the tags existed."""
    parts = [row.get(c) for c in ("dp_guarantee", "dp_relation")]
    guarantee, relation = (p if isinstance(p, str) and p else None for p in parts)
    if guarantee is None:
        return ""
    return guarantee + (f" ({relation})" if relation else "")


def _front_rows(data: ReportData) -> list[dict[str, Any]]:
    result = data.analysis.result
    on_group = "on_group_front" in result.front.columns
    rows = []
    for _, row in result.front.iterrows():
        rows.append(
            {
                "group": fmt(row.get(data.by)) if data.by in row.index else "",
                "values": [mean_std(row, o.name) for o in result.objectives],
                "guarantee": _guarantee(row),
                "seeds": int(row["n_seeds"]) if "n_seeds" in row.index else None,
                "group_front": bool(row["on_group_front"]) if on_group else None,
                "runs": _links(data, run_ids_of(row)),
            }
        )
    return rows


def _best_rows(data: ReportData) -> list[dict[str, Any]]:
    if data.by not in data.runs.columns:
        return []
    tables = best_configs(data.runs, data.analysis, by=data.by)
    out = []
    for group, table in tables.items():
        columns = [c for c in table.columns if c != "runs"]
        out.append(
            {
                "group": group,
                "columns": columns,
                "rows": [
                    {"cells": [fmt(r[c]) for c in columns], "runs": _links(data, r["runs"])}
                    for r in table.to_dict("records")
                ],
            }
        )
    return out


def _communication_rows(runs: pd.DataFrame) -> dict[str, Any]:
    table = communication(runs)
    if not len(table):
        return {"columns": [], "rows": []}
    setting = [c for c in ("dataset", "num_clients", "client_fraction") if c in table.columns]
    columns = [
        "algorithm",
        *setting,
        "runs",
        "upload / round",
        "download / round",
        "upload × FedAvg",
    ]
    rows = [
        [
            str(r["algorithm"]),
            *[fmt(r[c]) for c in setting],
            str(r["runs"]),
            fmt_bytes(r["up_per_round"]),
            fmt_bytes(r["down_per_round"]),
            fmt(r["up_vs_fedavg"], 3),
        ]
        for r in table.to_dict("records")
    ]
    return {"columns": columns, "rows": rows}


def _paper_section(runs: pd.DataFrame) -> dict[str, Any]:
    acc = accuracy_comparison(runs)
    attack = attack_comparison(runs)
    settings = []
    if "dataset" in runs.columns:
        for dataset in sorted(runs["dataset"].dropna().astype(str).unique()):
            settings.append(dataset)
    return {
        "paper": PAPER,
        "accuracy": [
            [
                r["setting"],
                r["algorithm"],
                str(r["runs"]),
                fmt(r["ours"])
                + ("" if math.isnan(r["ours_std"]) else f" ± {fmt(r['ours_std'], 2)}"),
                "-" if math.isnan(r["ours_before"]) else fmt(r["ours_before"]),
                fmt(r["paper"]),
            ]
            for r in acc.to_dict("records")
        ],
        "attack": [
            [r["dataset"], r["algorithm"], str(r["runs"])]
            + [f"{fmt(r[m])} (paper {fmt(r['paper_' + m[5:]])})" for m in _LEAK[:3]]
            for r in attack.to_dict("records")
        ],
        "datasets": settings,
        "attack_datasets": list(ATTACK_DATASETS),
        "no_attack_figure": [d for d in settings if d not in ATTACK_DATASETS],
    }


def _attack_metrics(data: ReportData, run_id: str) -> str:
    row = data.runs[data.runs["run_id"] == run_id]
    if not len(row):
        return ""
    first = row.iloc[0]
    parts = [f"{m} {fmt(first[m])}" for m in _LEAK_CAPTION if m in row.columns]
    reason = first.get("tags.leak_lpips_reason")
    if isinstance(reason, str) and reason:
        parts.append(f"no LPIPS: {reason}")
    labels = first.get("tags.attack.labels")
    if isinstance(labels, str) and labels:
        parts.append(f"labels {labels}")
    return ", ".join(parts)


def _provenance(data: ReportData) -> list[tuple[str, str]]:
    rows = []
    for col in sorted(c for c in data.runs.columns if str(c).startswith("tags.")):
        values = sorted({str(v) for v in data.runs[col].dropna()})
        if values and col not in _ATTACK_TAGS:
            rows.append((col[len("tags.") :] + " (runs)", ", ".join(values)))
    rows += [(f"{k} (this report)", v) for k, v in data.generator.items()]
    return rows


def _context(data: ReportData) -> dict[str, Any]:
    result = data.analysis.result
    objectives: list[Objective] = result.objectives
    statuses = data.analysis.statuses
    failures: dict[str, int] = {}
    if {"failure_reason", "status"} <= set(data.runs.columns):
        bad = data.runs[data.runs["status"] != "FINISHED"]
        for reason in bad["failure_reason"].dropna():
            failures[str(reason)] = failures.get(str(reason), 0) + 1
    front = _front_rows(data)
    return {
        "d": data,
        "objectives": [str(o) for o in objectives],
        "objective_names": [o.name for o in objectives],
        "n_runs": result.n_runs,
        "n_failed": result.n_failed,
        "n_invalid": result.n_invalid,
        "invalid_reasons": result.invalid_reasons,
        "failures": failures,
        "notes": result.notes,
        "objectives_from": data.objectives_from,
        "show_guarantee": any(r["guarantee"] for r in front),
        "statuses": statuses,
        "seeds_averaged": data.analysis.seeds_averaged,
        "hypervolume": {k: fmt(v) for k, v in data.analysis.hypervolume.items()},
        "sweeps": [
            {
                "name": s.name,
                "link": {
                    "id": s.run_id,
                    "short": s.run_id[:8],
                    "url": run_url(data.mlflow_url, s.experiment_id, s.run_id),
                },
                "params": sorted(s.params.items()),
                "spec": json.dumps(s.spec, indent=1) if s.spec is not None else None,
            }
            for s in data.sweeps
        ],
        "shared": [(k, fmt(v)) for k, v in sorted(shared_config(data.runs).items())],
        "pareto_png": _data_uri(data.pareto_png) if data.pareto_png else None,
        "front": front,
        "best": _best_rows(data),
        "communication": _communication_rows(data.runs),
        "curves_png": _data_uri(data.curves_png) if data.curves_png else None,
        "comm_png": _data_uri(data.comm_png) if data.comm_png else None,
        "curve_runs": _links(data, data.curve_runs),
        "grids": [
            {
                "src": _data_uri(g.png),
                "algorithm": g.algorithm,
                "link": _links(data, [g.run_id])[0],
                "metrics": _attack_metrics(data, g.run_id),
            }
            for g in data.attack_grids
        ],
        "paper": _paper_section(data.runs),
        "provenance": _provenance(data),
    }


def render_report(data: ReportData) -> str:
    """The report as one HTML document (a string)."""
    from jinja2 import Environment, StrictUndefined

    template = resources.files("analysis").joinpath("templates/report.html.j2").read_text("utf-8")
    env = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True)
    env.filters["fmt"] = fmt
    return env.from_string(template).render(**_context(data))
