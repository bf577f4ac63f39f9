"""The ``fedsweep`` command line (Typer + rich)."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

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


class Listable(StrEnum):
    algorithms = "algorithms"
    datasets = "datasets"
    partitioners = "partitioners"
    models = "models"


def _fail(message: str, code: int = 2) -> None:
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


def _jsonable(value: Any) -> Any:
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

    try:
        if as_json:
            with _stdout_to_stderr() as real_stdout:
                result = run_experiment(cfg, progress=True, resume_from=resume)
            real_stdout.write(json.dumps({k: _jsonable(v) for k, v in result.items()}) + "\n")
            real_stdout.flush()
        else:
            result = run_experiment(cfg, progress=True, resume_from=resume)
            _print_summary(result)
    except FedSweepError as exc:
        _fail(str(exc))


def _print_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="result", show_header=False)
    for key in (
        "algorithm",
        "dataset",
        "accuracy",
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
