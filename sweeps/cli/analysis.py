"""``fedsweep pareto``, ``query``, ``report`` and ``curves``: reading runs back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from sweeps.cli._app import app
from sweeps.cli.inputs import (
    OBJECTIVES_HELP,
    SPEC_HELP,
    count,
    default_objectives_or_fail,
    objectives_or_fail,
    out_file_or_fail,
    reference_or_fail,
    runs_or_fail,
    store_or_fail,
)
from sweeps.cli.output import err_console, fail, jsonable_tree
from sweeps.cli.render import QueryFormat, emit, left_out, print_fronts, print_notes

__all__ = ["curves", "pareto", "query", "report"]

QUERY_COLUMNS = (
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


@app.command()
def pareto(
    experiment: Annotated[
        list[str] | None,
        typer.Option("--experiment", "-e", help="MLflow experiment (repeat for several)"),
    ] = None,
    parquet: Annotated[
        Path | None, typer.Option(help="read the runs from this Parquet file instead")
    ] = None,
    objectives: Annotated[str | None, typer.Option(help=OBJECTIVES_HELP)] = None,
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
    spec: Annotated[Path | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Pareto fronts per group and overall: print them, write a PNG, CSVs and an HTML plot.

    Runs that are not FINISHED, trials FAILED or PRUNED or stopped early, and runs lacking an
    objective value are left out and counted as invalid; a run without a formal DP guarantee
    (dp_guarantee shared-only or none) stands at epsilon = inf."""
    from analysis.fronts import analyse_front
    from analysis.outputs import file_stem, write_front_files
    from analysis.tables import front_records, group_front_records

    objs = objectives_or_fail(objectives) if objectives is not None else None
    if objs is not None:
        reference_or_fail(reference, len(objs))  # bad input fails before reading the store
    group = None if by.lower() == "none" else by
    uri, names = store_or_fail(spec, experiment)
    experiment = names or None
    df = runs_or_fail(experiment, parquet, filter_, sweep_name, uri)
    source = "--objectives"
    if objs is None:
        objs, source = default_objectives_or_fail(df, parquet)
    ref = reference_or_fail(reference, len(objs))
    try:
        analysis = analyse_front(df, objs, by=group, reference=ref)
    except ValueError as exc:
        fail(str(exc))
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
        typer.echo(json.dumps(jsonable_tree(doc)))
        return
    print_fronts(
        analysis,
        f"Pareto fronts of {stem}{f' per {group}' if group else ''} ({result.n_runs} runs, "
        f"{left_out(result)}; * = on the overall front)",
        group,
    )
    Console().print(f"objectives: {', '.join(map(str, objs))} ({source})", highlight=False)
    print_notes(result.notes)
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
    spec: Annotated[Path | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Runs matching an MLflow filter, as a table, CSV or Parquet."""
    if format_ is QueryFormat.parquet and out is None:
        fail("--format parquet needs --out FILE")
    if out is not None:
        out_file_or_fail(out, f"runs.{'parquet' if format_ is QueryFormat.parquet else 'csv'}")
    from analysis.load import LoadError, load_runs

    uri, experiment = store_or_fail(spec, experiment)
    if not experiment:
        fail("give --experiment NAME (repeatable) or --spec SWEEP.yaml")
    try:
        df = load_runs(experiment, filter_string=filter_, uri=uri)
    except LoadError as exc:
        fail(str(exc))
    if columns is not None:
        chosen = [c.strip() for c in columns.split(",") if c.strip()]
        unknown = [c for c in chosen if c not in df.columns]
        if unknown and len(df):
            fail(f"--columns: no column(s) {', '.join(unknown)}; columns: {', '.join(df.columns)}")
        df = df[[c for c in chosen if c in df.columns]]
    elif format_ is QueryFormat.table:
        df = df[[c for c in QUERY_COLUMNS if c in df.columns]]
    err_console.print(f"{len(df)} run(s) match")
    emit(df, format_, out)


@app.command()
def report(
    experiment: Annotated[
        list[str] | None,
        typer.Option("--experiment", "-e", help="MLflow experiment (repeatable)"),
    ] = None,
    out: Annotated[Path, typer.Option(help="the HTML file")] = Path("report.html"),
    objectives: Annotated[str | None, typer.Option(help=OBJECTIVES_HELP)] = None,
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
    spec: Annotated[Path | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """One self-contained HTML page of the experiments' results.

    The sweep's spec, the fronts, the best configs, communication, attacks, the paper's numbers
    beside ours, provenance."""
    from analysis.collect import collect_report
    from analysis.load import LoadError
    from analysis.report import render_report

    objs = objectives_or_fail(objectives) if objectives is not None else None
    # With the sweep's objectives the count is known only once the runs are read:
    # analyse_front then checks the length.
    ref = reference_or_fail(reference, len(objs) if objs is not None else count(reference))
    out_file_or_fail(out, "report.html")
    uri, experiment = store_or_fail(spec, experiment)
    if not experiment:
        fail("give --experiment NAME (repeatable) or --spec SWEEP.yaml")
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
        fail(str(exc))
    if not len(data.runs):
        fail(f"no runs in experiment(s) {', '.join(experiment)}")
    html = render_report(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    result = data.analysis.result
    err_console.print(
        f"wrote {out} ({len(html) / 1e6:.1f} MB, {result.n_runs} runs, {left_out(result)}, "
        f"{len(result.front)} on the front; objectives "
        f"{', '.join(map(str, result.objectives))} from {data.objectives_from})",
        highlight=False,
    )
    for note in result.notes:
        err_console.print(f"[bold yellow]note:[/] {escape(note)}", highlight=False)


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
        fail(str(exc))
    # A run without a formal guarantee has epsilon inf in every round, as on the fronts.
    history = apply_guarantees_to_histories(history, runs)
    history = history[history["metric"].isin(metrics)]
    if not len(history):
        fail(f"none of these runs logged {', '.join(metrics)}")
    labels = {r: f"{a} {r[:6]}" for r, a in zip(runs["run_id"], runs["algorithm"], strict=True)}
    plot_rounds(history, metrics, out, labels=labels)
    err_console.print(f"wrote {escape(str(out))}")
