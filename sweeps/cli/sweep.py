"""``fedsweep sweep`` and ``export``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flcore.errors import FedSweepError
from sweeps.cli._app import app
from sweeps.cli.inputs import SPEC_HELP, out_file_or_fail, store_or_fail
from sweeps.cli.output import deliver, err_console, fail
from sweeps.cli.render import print_front, print_plan

__all__ = ["export", "sweep"]


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
        fail(f"invalid sweep spec {spec_path}: {exc}")
    if dry_run:
        p = plan(spec, address=address)
        if as_json:
            typer.echo(json.dumps(p))
        else:
            print_plan(p)
        return
    if as_json and verbose:
        fail("--json prints only the final JSON document: drop --verbose")
    deliver(
        as_json,
        lambda: run_sweep(
            spec,
            resume=resume,
            address=address,
            verbose=2 if verbose else 0,
            live=not (as_json or verbose),
        ),
        print_front,
    )


@app.command()
def export(
    experiment: Annotated[
        str | None, typer.Option(help="MLflow experiment name (default with --spec: its own)")
    ] = None,
    out: Annotated[Path, typer.Option(help="Parquet file to write")] = Path("results.parquet"),
    parent_run_id: Annotated[str | None, typer.Option(help="only this sweep's trials")] = None,
    spec: Annotated[Path | None, typer.Option(help=SPEC_HELP)] = None,
) -> None:
    """Write one row per run (config, final metrics, status, durations) to Parquet."""
    from sweeps.export import export_sweep

    out_file_or_fail(out, "results.parquet")
    uri, names = store_or_fail(spec, [experiment] if experiment else None)
    if not names:
        fail("give --experiment NAME or --spec SWEEP.yaml")
    experiment = names[0]
    try:
        df = export_sweep(uri, experiment, out=out, parent_run_id=parent_run_id)
    except ValueError as exc:
        fail(str(exc))
    if not len(df):
        fail(f"experiment {experiment!r} has no runs to export")
    err_console.print(f"wrote {len(df)} runs to {escape(str(out))}")
