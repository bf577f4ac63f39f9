"""The ``fedsweep`` command line (Typer + rich)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from flcore.errors import FedSweepError

__all__ = ["app", "main"]

app = typer.Typer(
    name="fedsweep",
    help="Privacy/utility sweeps of federated learning algorithms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)
T = TypeVar("T")


class Listable(StrEnum):
    algorithms = "algorithms"
    datasets = "datasets"
    partitioners = "partitioners"
    models = "models"


def _fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@contextmanager
def _stdout_to_stderr():
    """Send everything written to fd 1 (ours, libraries', child processes') to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield os.fdopen(os.dup(saved), "w")
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _deliver(as_json: bool, work: Callable[[], T], show: Callable[[T], None]) -> None:
    """Do a command's work and report it: with ``--json`` as one JSON document on stdout (all
    else the work prints, ours or a library's, goes to stderr), otherwise ``show``n for people.
    A FedSweepError ends the command with its message."""
    try:
        if as_json:
            with _stdout_to_stderr() as real_stdout:
                result = work()
            real_stdout.write(json.dumps(_jsonable_tree(result)) + "\n")
            real_stdout.flush()
        else:
            show(work())
    except FedSweepError as exc:
        _fail(str(exc))


def jsonable(value: Any) -> Any:
    """A metric for strict JSON: +-inf (epsilon without DP) as "inf"/"-inf", nan as null."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override: key=value (dotted)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON document on stdout")
    ] = False,
    resume: Annotated[Path | None, typer.Option(help="continue from this checkpoint")] = None,
) -> None:
    """Run one FL experiment in-process, logging to MLflow and Parquet."""
    from flcore.config import load_config

    try:
        cfg = load_config(config, set_ or [])
    except FedSweepError as exc:
        _fail(f"invalid config {config}: {exc}")
    if resume is not None and not resume.is_file():
        _fail(f"--resume: no checkpoint at {resume}")

    from sweeps.experiment import run_experiment

    _deliver(
        as_json, lambda: run_experiment(cfg, progress=True, resume_from=resume), _print_summary
    )


@app.command()
def attack(
    config: Annotated[Path, typer.Argument(help="experiment YAML (its `attack` mapping)")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override: key=value (dotted)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print one JSON document on stdout")
    ] = False,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="attack a trained run: restore this checkpoint, attack the next round"),
    ] = None,
) -> None:
    """A standalone privacy evaluation: train up to the attacked round, attack, report.

    Uses the config's `attack` mapping (default: IG, HyperFL's protocol, on 10 records of
    client 0 in the last round); training stops after the last attacked round. Logged to
    MLflow like `fedsweep run` (tag fedsweep.kind=attack), with the image grid as artifact.
    """
    from flcore.config import load_config

    try:
        cfg = load_config(config, set_ or [])
    except FedSweepError as exc:
        _fail(f"invalid config {config}: {exc}")
    if checkpoint is not None and not checkpoint.is_file():
        _fail(f"--checkpoint: no checkpoint at {checkpoint}")
    try:
        cfg = _attack_config(cfg, checkpoint)
    except FedSweepError as exc:
        _fail(f"invalid config {config}: {exc}")
    from sweeps.experiment import run_experiment

    assert cfg.attack is not None and cfg.attack.rounds
    stop = max(cfg.attack.resolved_rounds(cfg.rounds))  # first/middle/last resolved

    def go() -> dict[str, Any]:
        return run_experiment(
            cfg,
            progress=True,
            resume_from=checkpoint,
            stop_after=stop,
            tags={"fedsweep.kind": "attack"},
        )

    _deliver(as_json, lambda: _attack_doc(go(), cfg), _print_attack)


def _attack_config(cfg: Any, checkpoint: Path | None) -> Any:
    """The config with an attack mapping (the default one if it has none) whose rounds are
    explicit; with a checkpoint, the attacked round defaults to the one after it."""
    from flcore.config import AttackConfig, validate_config

    attack = cfg.attack or AttackConfig()
    rounds = attack.rounds
    if rounds is None:
        if checkpoint is not None:
            import torch

            done = int(torch.load(checkpoint, weights_only=False, map_location="cpu")["round"])
            rounds = [done + 1]
        else:
            rounds = [cfg.rounds]
    raw = cfg.model_dump(mode="json")
    raw["attack"] = attack.model_dump(mode="json") | {"rounds": rounds}
    return validate_config(raw)


def _attack_doc(result: dict[str, Any], cfg: Any) -> dict[str, Any]:
    from flcore.attacks.evaluation import LEAK_METRICS

    doc = {k: result.get(k) for k in LEAK_METRICS}
    doc |= {
        "images": result.get("leak_images", 0),
        "iterations": result.get("leak_iterations"),
        "attack": cfg.attack.name,
        "algorithm": cfg.algorithm,
        "rounds": list(cfg.attack.resolved_rounds(cfg.rounds)),
        "clients": cfg.attack.clients,
        "label_accuracy": result.get("leak_label_accuracy"),
        "attack_seconds": result.get("leak_seconds"),
        "reason": result.get("leak_reason"),
        "lpips_reason": result.get("leak_lpips_reason"),
        "run_id": result.get("run_id"),
        "grid": result.get("attack_grid"),
    }
    if "leak_embedding_cosine" in result:
        doc["embedding_cosine"] = result["leak_embedding_cosine"]
    return doc


def _print_attack(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{doc['attack']} on {doc['algorithm']}: leakage", show_header=False)
    for key, value in doc.items():
        if value is None or key in ("attack", "algorithm", "reason", "lpips_reason"):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown)
    Console().print(table)
    for key in ("reason", "lpips_reason"):
        if doc.get(key):
            err_console.print(f"[yellow]{key}:[/] {doc[key]}", highlight=False)


@app.command()
def sweep(
    spec_path: Annotated[Path, typer.Argument(metavar="SWEEP.yaml", help="sweep spec")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override: key=value; base.* reaches the experiment"),
    ] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address, or 'auto'")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="finish an interrupted sweep")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="validate and print the plan; start nothing")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print only the final JSON document on stdout")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", help="Ray Tune's own result tables and the trials' output, no live view"
        ),
    ] = False,
) -> None:
    """Run a multi-objective sweep: Ray Tune trials, Optuna search, MLflow parent/child runs.

    Shows one live view while it runs (trials done / running / pending / failed, the current
    front, elapsed time and ETA, a line per failure), then the sweep's front."""
    from sweeps.spec import load_spec
    from sweeps.sweep import plan, run_sweep

    try:
        spec = load_spec(spec_path, set_ or [])
    except FedSweepError as exc:
        _fail(f"invalid sweep spec {spec_path}: {exc}")
    if dry_run:
        p = plan(spec, address=address)
        if as_json:
            typer.echo(json.dumps(p))
        else:
            _print_plan(p)
        return
    if as_json and verbose:
        _fail("--json prints only the final JSON document: drop --verbose")
    _deliver(
        as_json,
        lambda: run_sweep(
            spec,
            resume=resume,
            address=address,
            verbose=2 if verbose else 0,
            live=not (as_json or verbose),
        ),
        _print_front,
    )


@app.command()
def export(
    experiment: Annotated[
        str | None, typer.Option(help="MLflow experiment name (default with --spec: its own)")
    ] = None,
    out: Annotated[Path, typer.Option(help="Parquet file to write")] = Path("results.parquet"),
    parent_run_id: Annotated[str | None, typer.Option(help="only this sweep's trials")] = None,
    spec: Annotated[Path | None, typer.Option(help=_SPEC_HELP)] = None,
) -> None:
    """Write one row per run (config, final metrics, status, durations) to Parquet."""
    from sweeps.export import export_sweep

    uri, names = _store_or_fail(spec, [experiment] if experiment else None)
    if not names:
        _fail("give --experiment NAME or --spec SWEEP.yaml")
    experiment = names[0]
    try:
        df = export_sweep(uri, experiment, out=out, parent_run_id=parent_run_id)
    except ValueError as exc:
        _fail(str(exc))
    if not len(df):
        _fail(f"experiment {experiment!r} has no runs to export")
    err_console.print(f"wrote {len(df)} runs to {out}")


# ---------------------------------------------------------------- analysis and dashboards


class QueryFormat(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"


_OBJECTIVES_HELP = (
    "objectives as name:max|min, comma-separated (default: the sweep's own objectives when "
    "the runs come from sweeps, else accuracy:max,epsilon:min)"
)
_QUERY_COLUMNS = (
    "run_id",
    "experiment",
    "algorithm",
    "status",
    "accuracy",
    "epsilon",
    "dp_guarantee",  # why an epsilon reads inf
    "bytes_up",
    "seconds",
)


def _wide_console() -> Console:
    """A console for tables of run ids: the terminal's width, or 200 columns into a pipe."""
    return Console(width=None if sys.stdout.isatty() else 200)


def _objectives_or_fail(spec: str) -> list[Any]:
    from analysis.pareto import parse_objectives

    try:
        return parse_objectives(spec)
    except ValueError as exc:
        _fail(f"--objectives: {exc}")


def _reference_or_fail(text: str | None, n: int) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"--reference {text!r}: give {n} comma-separated numbers, one per objective")
    if len(values) != n or not all(math.isfinite(v) for v in values):
        _fail(f"--reference {text!r}: give {n} finite numbers, one per objective")
    return values


def _count(text: str | None) -> int:
    return len(text.split(",")) if text is not None else 0


_SPEC_HELP = (
    "a sweep spec: read the store (tracking.uri) and experiment it writes to, resolved as "
    "`fedsweep sweep` resolves them"
)


def _store_or_fail(spec: Path | None, experiments: list[str] | None) -> tuple[str, list[str]]:
    """The tracking URI and experiments a reading command uses: those of a sweep spec (one
    resolver, sweeps.tracking.resolve_tracking_uri, for the sweep and every reader), else the
    environment's store and the experiments given. A bad spec exits with code 2."""
    from sweeps.tracking import tracking_uri

    if spec is None:
        return tracking_uri(), list(experiments or [])
    from sweeps.spec import load_spec
    from sweeps.sweep import experiment_name, sweep_tracking_uri

    try:
        loaded = load_spec(spec)
    except FedSweepError as exc:
        _fail(f"invalid sweep spec {spec}: {exc}")
    return sweep_tracking_uri(loaded), list(experiments or [experiment_name(loaded)])


def _runs_or_fail(
    experiments: list[str] | None,
    parquet: Path | None = None,
    filter_string: str = "",
    sweep_name: str | None = None,
    uri: str | None = None,
) -> Any:
    """The runs table from MLflow (the store ``uri``) or Parquet; bad input exits with code 2."""
    from analysis.load import LoadError, load_parquet, load_runs

    if bool(experiments) == (parquet is not None):
        _fail("give --experiment NAME (MLflow; repeat it for several) or --parquet FILE")
    try:
        if parquet is not None:
            df = load_parquet(parquet)
        else:
            df = load_runs(
                experiments or [], filter_string=filter_string, sweep=sweep_name, uri=uri
            )
    except LoadError as exc:
        _fail(str(exc))
    if not len(df):
        where = str(parquet) if parquet else f"experiment(s) {', '.join(experiments or [])}"
        _fail(
            f"no runs to analyse in {where}"
            + (f" matching {filter_string!r}" if filter_string else "")
        )
    return df


def _default_objectives_or_fail(df: Any, parquet: Path | None) -> tuple[list[Any], str]:
    """The sweep's own objectives (see :mod:`analysis.sweep_objectives`); exit 2 when the
    runs' sweeps disagree."""
    from analysis.fronts import ObjectiveError
    from analysis.load import LoadError, open_store
    from analysis.sweep_objectives import default_objectives

    try:
        client = open_store()
    except LoadError as exc:
        if parquet is None:
            _fail(str(exc))
        client = None  # a Parquet file read without its store: the default
    try:
        return default_objectives(df, client)
    except ObjectiveError as exc:
        _fail(str(exc))


def _left_out(result: Any) -> str:
    """``"3 left out as invalid: 2 stopped early, 1 FAILED"``."""
    if not result.n_invalid:
        return "none left out"
    reasons = ", ".join(f"{n} {r}" for r, n in result.invalid_reasons.items())
    return f"{result.n_invalid} left out as invalid: {reasons}"


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        Console().print(f"[bold yellow]note:[/] {note}", highlight=False)


def _print_fronts(analysis: Any, title: str, by: str | None) -> None:
    from rich.table import Table

    from analysis.tables import fmt, mean_std, run_ids_of

    result = analysis.result
    overall = set(result.front.get("run_id", []))
    names = [o.name for o in result.objectives]
    seeds = "n_seeds" in result.table.columns
    # What each epsilon guarantees (shared-only and none stand at inf), where runs say it.
    dp = "dp_guarantee" in result.table.columns and result.table["dp_guarantee"].notna().any()
    table = Table(title=title)
    columns = [by or "front", *names, *(["dp_guarantee"] if dp else [])]
    for col in [*columns, *(["seeds"] if seeds else []), "overall", "run_id(s)"]:
        table.add_column(col)
    fronts = result.per_group if by is not None else {"all": result.front}
    for group in sorted(fronts):
        for _, row in fronts[group].iterrows():
            table.add_row(
                group,
                *[mean_std(row, n) for n in names],
                *([fmt(row.get("dp_guarantee"))] if dp else []),
                *([fmt(row["n_seeds"])] if seeds else []),
                "*" if row.get("run_id") in overall else "",
                " ".join(run_ids_of(row)),
            )
    _wide_console().print(table)


@app.command()
def pareto(
    experiment: Annotated[
        list[str] | None,
        typer.Option("--experiment", "-e", help="MLflow experiment (repeat for several)"),
    ] = None,
    parquet: Annotated[
        Path | None, typer.Option(help="read the runs from this Parquet file instead")
    ] = None,
    objectives: Annotated[str | None, typer.Option(help=_OBJECTIVES_HELP)] = None,
    by: Annotated[str, typer.Option(help="a front per value of this column; 'none': one")] = (
        "algorithm"
    ),
    filter_: Annotated[str, typer.Option("--filter", help="MLflow filter string")] = "",
    sweep_name: Annotated[
        str | None, typer.Option("--sweep", help="only this sweep's runs")
    ] = None,
    reference: Annotated[
        str | None, typer.Option(help="hypervolume reference point, e.g. '0,10'")
    ] = None,
    out: Annotated[Path, typer.Option(help="folder for the PNG, CSVs and HTML")] = Path("."),
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
    spec: Annotated[Path | None, typer.Option(help=_SPEC_HELP)] = None,
) -> None:
    """Pareto fronts per group and overall: print them, write a PNG, CSVs and an HTML plot.

    Runs that are not FINISHED, trials FAILED or PRUNED or stopped early, and runs lacking an
    objective value are left out and counted as invalid; a run without a formal DP guarantee
    (dp_guarantee shared-only or none) stands at epsilon = inf."""
    from analysis.fronts import analyse_front
    from analysis.outputs import file_stem, write_front_files
    from analysis.tables import front_records, group_front_records

    objs = _objectives_or_fail(objectives) if objectives is not None else None
    if objs is not None:
        _reference_or_fail(reference, len(objs))  # bad input fails before reading the store
    group = None if by.lower() == "none" else by
    uri, names = _store_or_fail(spec, experiment)
    experiment = names or None
    df = _runs_or_fail(experiment, parquet, filter_, sweep_name, uri)
    source = "--objectives"
    if objs is None:
        objs, source = _default_objectives_or_fail(df, parquet)
    ref = _reference_or_fail(reference, len(objs))
    try:
        analysis = analyse_front(df, objs, by=group, reference=ref)
    except ValueError as exc:
        _fail(str(exc))
    stem = parquet.stem if parquet is not None else file_stem(experiment or [])
    stem += f"-{sweep_name}" if sweep_name else ""
    files = write_front_files(
        analysis, out.resolve(), stem, by=group, title=f"Pareto front: {stem}"
    )
    result = analysis.result
    if as_json:
        doc = {
            "experiments": experiment or [],
            "parquet": str(parquet) if parquet else None,
            "objectives": [str(o) for o in objs],
            "objectives_from": source,
            "by": group,
            "n_runs": result.n_runs,
            "n_failed": result.n_failed,
            "n_invalid": result.n_invalid,
            "invalid_reasons": result.invalid_reasons,
            "notes": result.notes,
            "statuses": analysis.statuses,
            "seeds_averaged": analysis.seeds_averaged,
            "front": front_records(analysis, group),
            "fronts_by_group": group_front_records(analysis, group),
            "hypervolume": analysis.hypervolume or None,
            "files": {k: str(v) for k, v in files.items()},
        }
        typer.echo(json.dumps(_jsonable_tree(doc)))
        return
    _print_fronts(
        analysis,
        f"Pareto fronts of {stem}{f' per {group}' if group else ''} ({result.n_runs} runs, "
        f"{_left_out(result)}; * = on the overall front)",
        group,
    )
    Console().print(f"objectives: {', '.join(map(str, objs))} ({source})", highlight=False)
    _print_notes(result.notes)
    if analysis.hypervolume:
        Console().print(
            "hypervolume: " + ", ".join(f"{k} {v:.6g}" for k, v in analysis.hypervolume.items())
        )
    Console().print("wrote " + ", ".join(str(p) for p in files.values()))


@app.command()
def query(
    filter_: Annotated[
        str,
        typer.Argument(
            metavar="FILTER",
            help="MLflow filter, e.g. \"metrics.accuracy > 0.8 and params.algorithm = 'hyperfl'\"",
        ),
    ],
    experiment: Annotated[
        list[str] | None,
        typer.Option("--experiment", "-e", help="MLflow experiment (repeatable)"),
    ] = None,
    format_: Annotated[QueryFormat, typer.Option("--format", help="output format")] = (
        QueryFormat.table
    ),
    out: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None,
    columns: Annotated[
        str | None, typer.Option(help="comma-separated columns (default: all; table: a few)")
    ] = None,
    spec: Annotated[Path | None, typer.Option(help=_SPEC_HELP)] = None,
) -> None:
    """Runs matching an MLflow filter, as a table, CSV or Parquet."""
    if format_ is QueryFormat.parquet and out is None:
        _fail("--format parquet needs --out FILE")
    from analysis.load import LoadError, load_runs

    uri, experiment = _store_or_fail(spec, experiment)
    if not experiment:
        _fail("give --experiment NAME (repeatable) or --spec SWEEP.yaml")
    try:
        df = load_runs(experiment, filter_string=filter_, uri=uri)
    except LoadError as exc:
        _fail(str(exc))
    if columns is not None:
        chosen = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in df.columns]
        if unknown and len(df):
            _fail(f"--columns: no column(s) {', '.join(unknown)}; columns: {', '.join(df.columns)}")
        df = df[[c for c in chosen if c in df.columns]]
    elif format_ is QueryFormat.table:
        df = df[[c for c in _QUERY_COLUMNS if c in df.columns]]
    err_console.print(f"{len(df)} run(s) match")
    _emit(df, format_, out)


def _emit(df: Any, format_: QueryFormat, out: Path | None) -> None:
    """Write a runs table as a rich table, CSV or Parquet, to ``out`` or stdout."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    if format_ is QueryFormat.parquet and out is not None:
        df.to_parquet(out, index=False)
    elif format_ is QueryFormat.csv:
        if out is None:
            typer.echo(df.to_csv(index=False), nl=False)
        else:
            df.to_csv(out, index=False)
    else:
        from rich.table import Table

        from analysis.tables import fmt

        table = Table()
        for col in df.columns:
            table.add_column(str(col))
        for row in df.itertuples(index=False):
            table.add_row(*[fmt(v) for v in row])
        if out is None:
            _wide_console().print(table)
        else:
            with out.open("w") as f:
                Console(file=f, width=200).print(table)
    if out is not None:
        err_console.print(f"wrote {out}")


@app.command()
def report(
    experiment: Annotated[
        list[str] | None,
        typer.Option("--experiment", "-e", help="MLflow experiment (repeatable)"),
    ] = None,
    out: Annotated[Path, typer.Option(help="the HTML file")] = Path("report.html"),
    objectives: Annotated[str | None, typer.Option(help=_OBJECTIVES_HELP)] = None,
    by: Annotated[str, typer.Option(help="the grouping column")] = "algorithm",
    filter_: Annotated[str, typer.Option("--filter", help="MLflow filter string")] = "",
    sweep_name: Annotated[
        str | None, typer.Option("--sweep", help="only this sweep's runs")
    ] = None,
    mlflow_url: Annotated[
        str, typer.Option(help="the MLflow UI that run ids link to")
    ] = "http://127.0.0.1:5000",
    reference: Annotated[
        str | None, typer.Option(help="hypervolume reference point, e.g. '0,10'")
    ] = None,
    spec: Annotated[Path | None, typer.Option(help=_SPEC_HELP)] = None,
) -> None:
    """One self-contained HTML page: spec, fronts, best configs, communication, attacks,
    the paper's numbers beside ours, provenance."""
    from analysis.collect import collect_report
    from analysis.load import LoadError
    from analysis.report import render_report

    objs = _objectives_or_fail(objectives) if objectives is not None else None
    # With the sweep's objectives the count is known only once the runs are read:
    # analyse_front then checks the length.
    ref = _reference_or_fail(reference, len(objs) if objs is not None else _count(reference))
    if out.exists() and out.is_dir():
        _fail(f"--out {out} is a folder; give a file name such as {out / 'report.html'}")
    uri, experiment = _store_or_fail(spec, experiment)
    if not experiment:
        _fail("give --experiment NAME (repeatable) or --spec SWEEP.yaml")
    try:
        data = collect_report(
            experiment,
            objs,
            uri=uri,
            filter_string=filter_,
            sweep=sweep_name,
            by=by,
            mlflow_url=mlflow_url,
            reference=ref,
        )
    except (LoadError, ValueError) as exc:
        _fail(str(exc))
    if not len(data.runs):
        _fail(f"no runs in experiment(s) {', '.join(experiment)}")
    html = render_report(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    result = data.analysis.result
    err_console.print(
        f"wrote {out} ({len(html) / 1e6:.1f} MB, {result.n_runs} runs, {_left_out(result)}, "
        f"{len(result.front)} on the front; objectives "
        f"{', '.join(map(str, result.objectives))} from {data.objectives_from})",
        highlight=False,
    )
    for note in result.notes:
        err_console.print(f"[bold yellow]note:[/] {note}", highlight=False)


@app.command()
def curves(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN_ID...", help="runs to draw")],
    metric: Annotated[
        list[str] | None, typer.Option("--metric", "-m", help="a panel per metric (repeatable)")
    ] = None,
    out: Annotated[Path, typer.Option(help="the PNG")] = Path("curves.png"),
) -> None:
    """Round-by-round curves of chosen runs (default: accuracy and bytes uploaded per round)."""
    from analysis.guarantees import apply_guarantees_to_histories
    from analysis.load import LoadError, load_histories, load_run_ids
    from analysis.rounds import plot_rounds

    metrics = metric or ["accuracy", "round_bytes_up"]
    try:
        runs = load_run_ids(run_ids)
        history = load_histories(run_ids, metrics)
    except LoadError as exc:
        _fail(str(exc))
    # A run without a formal guarantee has epsilon inf in every round, as on the fronts.
    history = apply_guarantees_to_histories(history, runs)
    history = history[history["metric"].isin(metrics)]
    if not len(history):
        _fail(f"none of these runs logged {', '.join(metrics)}")
    labels = {r: f"{a} {r[:6]}" for r, a in zip(runs["run_id"], runs["algorithm"], strict=True)}
    plot_rounds(history, metrics, out, labels=labels)
    err_console.print(f"wrote {out}")


@app.command()
def ui(
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (MLflow 5000, Optuna 8080)")
    ] = None,
    optuna: Annotated[
        bool, typer.Option("--optuna", help="the Optuna dashboard of a sweep's study instead")
    ] = False,
    spec: Annotated[
        Path | None,
        typer.Option(help="the sweep spec: its tracking store (with --optuna: its study)"),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help="--optuna: a storage URL, a store file, or a storage.path folder (default "
            "sweeps_out)"
        ),
    ] = None,
    study: Annotated[str | None, typer.Option(help="--optuna: the study to open")] = None,
) -> None:
    """Serve the MLflow UI on the tracking store (or, with --optuna, the Optuna dashboard) on
    127.0.0.1 until Ctrl-C; the server and its children are stopped on exit."""
    from sweeps.dashboards import (
        HOST,
        DashboardError,
        mlflow_ui_command,
        optuna_dashboard_command,
        optuna_target,
        require_free_port,
    )

    if not optuna and (storage or study):
        _fail("--storage and --study go with --optuna")
    port = port or (8080 if optuna else 5000)
    try:
        require_free_port(port)
        if optuna:
            target = optuna_target(spec, storage, study)
            cmd, env, url = optuna_dashboard_command(target.storage, port), None, target.url(port)
            what = f"Optuna dashboard ({target.storage})"
        else:
            uri, _ = _store_or_fail(spec, None)
            cmd, env = mlflow_ui_command(uri, port)
            url, what = f"http://{HOST}:{port}/", f"MLflow UI ({uri})"
    except DashboardError as exc:
        _fail(str(exc))
    _serve_until_stopped(cmd, env, what, url, f"http://{HOST}:{port}/", f"ready: {url}")


@app.command()
def server(
    backend_store_uri: Annotated[
        str,
        typer.Option(
            help="the tracking store: postgresql://USER@HOST:5432/DB (the cluster setup; the "
            "same PostgreSQL can hold the Optuna study) or sqlite:///PATH"
        ),
    ],
    artifacts_destination: Annotated[
        str,
        typer.Option(
            help="where the server keeps artifacts (a local path or an object-store URI); "
            "clients upload through the server, so they need no shared path"
        ),
    ],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 5000,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host headers to accept, comma-separated (MLflow accepts only localhost and "
            "private-range addresses by default), e.g. 'mlflow.lab.org,mlflow.lab.org:5000'"
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="server worker processes")] = 4,
) -> None:
    """A shared MLflow tracking server for cluster sweeps (PostgreSQL backend, proxied
    artifacts), until Ctrl-C. Sweeps reach it with tracking.uri: http://HOST:PORT."""
    from sweeps.dashboards import DashboardError, require_free_port, tracking_server_command

    if "://" not in artifacts_destination:
        Path(artifacts_destination).mkdir(parents=True, exist_ok=True)
        artifacts_destination = str(Path(artifacts_destination).resolve())
    try:
        require_free_port(port, host)
        cmd, env = tracking_server_command(
            backend_store_uri,
            artifacts_destination,
            host=host,
            port=port,
            allowed_hosts=allowed_hosts,
            workers=workers,
        )
    except DashboardError as exc:
        _fail(str(exc))
    url = f"http://{host}:{port}"
    ready = f"ready: {url} (tracking.uri: {url})"
    _serve_until_stopped(cmd, env, "MLflow tracking server", url, f"{url}/health", ready)


def _serve_until_stopped(
    cmd: list[str], env: dict[str, str] | None, what: str, url: str, ready_url: str, ready: str
) -> None:
    """Run a server (sweeps.dashboards.serve) until Ctrl-C, saying when it starts, is ready and
    stops; a server that exits on its own exits 1 with its status."""
    from sweeps.dashboards import serve

    err_console.print(f"starting the {what} on {url} (Ctrl-C stops it)")
    code = serve(cmd, env=env, ready_url=ready_url, on_ready=lambda: err_console.print(ready))
    if code:
        _fail(f"the server exited with status {code}", code=1)
    err_console.print("stopped")


def _jsonable_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable_tree(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):  # numpy / pandas scalars
        with contextlib.suppress(AttributeError, ValueError):
            value = value.item()
    return jsonable(value)


def _print_plan(p: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"sweep plan: {p['sweep']} (dry run: nothing started)", show_header=False)
    for key, value in p.items():
        table.add_row(key, json.dumps(value) if isinstance(value, list | dict) else str(value))
    Console().print(table)


def _print_front(summary: dict[str, Any]) -> None:
    from rich.table import Table

    trials = summary["trials"]
    left_out = summary.get("n_invalid", sum(t["status"] != "FINISHED" for t in trials))
    by_alg = summary.get("pareto_by_algorithm") or {}
    rows = [r for alg in sorted(by_alg) for r in by_alg[alg]]
    objectives = [
        k for k in (rows[0] if rows else {}) if k not in {"run_id", "algorithm", "on_overall_front"}
    ]
    table = Table(
        title=f"Pareto fronts of {summary['experiment']}, per algorithm "
        f"({len(trials)} trials, {left_out} left out; * = on the overall front)"
    )
    for col in ["algorithm", *objectives, "overall", "run_id"]:
        table.add_column(col)
    for row in rows:
        values = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in objectives]
        table.add_row(
            row["algorithm"], *values, "*" if row["on_overall_front"] else "", row["run_id"]
        )
    Console().print(table)
    reasons = summary.get("invalid_reasons") or {}
    if reasons:
        Console().print(
            "left out of the fronts: " + "; ".join(f"{n} {why}" for why, n in reasons.items())
        )
    for note in summary.get("notes") or []:
        Console().print(f"note: {note}")
    for png in summary.get("pareto_pngs") or [summary.get("pareto_png")] * bool(
        summary.get("pareto_png")
    ):
        Console().print(f"Pareto plot: {png}")
    Console().print(
        f"results: {summary['results_parquet']}; MLflow parent run "
        f"{summary['parent_run_id']} (browse: fedsweep ui; report: fedsweep report "
        f"--experiment {summary.get('experiment', 'quickstart')} --out report.html)"
    )


privacy_app = typer.Typer(
    help="Differential-privacy accounting (Opacus / dp-accounting).", no_args_is_help=True
)
app.add_typer(privacy_app, name="privacy")


class AccountantChoice(StrEnum):
    rdp = "rdp"
    prv = "prv"
    pld = "pld"


_POPULATION_HELP = (
    "N: fixed-size sampling of max(1, int(rate N)) of N parties (client-level DP's "
    "client_sampling: fixed), accounted under replace-one; omit for Poisson (add/remove)"
)


def _sampling(sample_rate: float, population: int | None) -> tuple[float, str]:
    """The accounted rate and scheme: Poisson at ``sample_rate``, or fixed-size ``m / N``
    with ``m`` drawn as client-level DP draws it."""
    if population is None:
        return sample_rate, "poisson"
    if not 0 < sample_rate <= 1:
        _fail(f"--sample-rate: must be in (0, 1], got {sample_rate}")
    return max(1, int(sample_rate * population)) / population, "fixed"


@privacy_app.command("epsilon")
def privacy_epsilon(
    noise_multiplier: Annotated[float, typer.Option(help="sigma: noise std / clipping norm")],
    sample_rate: Annotated[
        float,
        typer.Option(help="DP-SGD record sampling rate B/n, or client-level DP's client_fraction"),
    ],
    steps: Annotated[int, typer.Option(help="number of noisy steps composed")],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    population: Annotated[int | None, typer.Option(help=_POPULATION_HELP, min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Epsilon spent by ``steps`` subsampled Gaussian steps: Poisson sampling under add/remove,
    or with ``--population N`` fixed-size sampling under replace-one."""
    from flcore.privacy.accounting import compute_epsilon

    rate, sampling = _sampling(sample_rate, population)
    try:
        eps = compute_epsilon(
            [(noise_multiplier, rate, steps)],
            delta,
            accountant.value,
            sampling=sampling,
            population=population,
        )
    except FedSweepError as exc:
        _fail(str(exc))
    out = {
        "epsilon": eps,
        "delta": delta,
        "accountant": accountant.value,
        "dp_relation": "replace-one" if population else "add-remove",
    }
    typer.echo(
        json.dumps({k: jsonable(v) for k, v in out.items()})
        if as_json
        else f"epsilon = {eps:.6g} at delta = {delta:g} ({accountant.value}, {out['dp_relation']})"
    )


@privacy_app.command("sigma")
def privacy_sigma(
    epsilon: Annotated[float, typer.Option(help="target epsilon")],
    sample_rate: Annotated[
        float, typer.Option(help="DP-SGD record sampling rate B/n, or client_fraction")
    ],
    steps: Annotated[int, typer.Option(help="number of noisy steps")],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    max_noise_multiplier: Annotated[float, typer.Option(help="give up above this sigma")] = 100.0,
    population: Annotated[int | None, typer.Option(help=_POPULATION_HELP, min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The smallest noise multiplier whose epsilon is at most the target (sampling as for
    ``privacy epsilon``)."""
    from flcore.privacy.accounting import calibrate_noise

    rate, sampling = _sampling(sample_rate, population)
    try:
        sigma = calibrate_noise(
            epsilon,
            delta,
            rate,
            steps,
            accountant=accountant.value,
            max_noise_multiplier=max_noise_multiplier,
            sampling=sampling,
            population=population,
        )
    except FedSweepError as exc:
        _fail(str(exc))
    typer.echo(
        json.dumps({"noise_multiplier": sigma}) if as_json else f"noise_multiplier = {sigma:.6g}"
    )


def _print_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="result", show_header=False)
    for key in (
        "algorithm",
        "dataset",
        "accuracy",
        "accuracy_before",
        "global_accuracy",
        "rounds",
        "seconds",
        "bytes_up",
        "bytes_down",
        "run_id",
        "metrics_path",
    ):
        value = result.get(key)
        if isinstance(value, float):
            value = f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
        table.add_row(key, str(value))
    Console().print(table)


@app.command("list")
def list_(what: Annotated[Listable, typer.Argument(help="what to list")]) -> None:
    """Print registered names, one per line."""
    if what is Listable.algorithms:
        from flcore.algorithms import ALGORITHMS as reg

        names = reg.names()
    elif what is Listable.datasets:
        from flcore.data import DATASET_INFO

        names = sorted(DATASET_INFO)
    elif what is Listable.partitioners:
        from flcore.data import PARTITIONERS as reg

        names = reg.names()
    else:
        from flcore.models import MODELS as reg

        names = reg.names()
    for name in names:
        typer.echo(name)


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    app()


if __name__ == "__main__":
    main()
