"""The ``fedsweep`` command line (Typer + rich)."""

from __future__ import annotations

import contextlib
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
        bool, typer.Option("--json", help="print one JSON document on stdout")
    ] = False,
) -> None:
    """Run a multi-objective sweep: Ray Tune trials, Optuna search, MLflow parent/child runs."""
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
    try:
        if as_json:
            with _stdout_to_stderr() as real_stdout:
                summary = run_sweep(spec, resume=resume, address=address, verbose=0)
            real_stdout.write(json.dumps(_jsonable_tree(summary)) + "\n")
            real_stdout.flush()
        else:
            summary = run_sweep(spec, resume=resume, address=address)
            _print_front(summary)
    except FedSweepError as exc:
        _fail(str(exc))


@app.command()
def export(
    experiment: Annotated[str, typer.Option(help="MLflow experiment name")],
    out: Annotated[Path, typer.Option(help="Parquet file to write")] = Path("results.parquet"),
    parent_run_id: Annotated[str | None, typer.Option(help="only this sweep's trials")] = None,
) -> None:
    """Write one row per run (config, final metrics, status, durations) to Parquet."""
    from sweeps.export import export_sweep
    from sweeps.tracking import tracking_uri

    try:
        df = export_sweep(tracking_uri(), experiment, out=out, parent_run_id=parent_run_id)
    except ValueError as exc:
        _fail(str(exc))
    if not len(df):
        _fail(f"experiment {experiment!r} has no runs to export")
    err_console.print(f"wrote {len(df)} runs to {out}")


def _jsonable_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable_tree(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):  # numpy / pandas scalars
        with contextlib.suppress(AttributeError, ValueError):
            value = value.item()
    return _jsonable(value)


def _print_plan(p: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"sweep plan: {p['sweep']} (dry run: nothing started)", show_header=False)
    for key, value in p.items():
        table.add_row(key, json.dumps(value) if isinstance(value, list | dict) else str(value))
    Console().print(table)


def _print_front(summary: dict[str, Any]) -> None:
    from rich.table import Table

    trials = summary["trials"]
    failed = sum(t["status"] != "FINISHED" for t in trials)
    by_alg = summary.get("pareto_by_algorithm") or {}
    rows = [r for alg in sorted(by_alg) for r in by_alg[alg]]
    objectives = [
        k for k in (rows[0] if rows else {}) if k not in {"run_id", "algorithm", "on_overall_front"}
    ]
    table = Table(
        title=f"Pareto fronts of {summary['experiment']}, per algorithm "
        f"({len(trials)} trials, {failed} failed; * = on the overall front)"
    )
    for col in ["algorithm", *objectives, "overall", "run_id"]:
        table.add_column(col)
    for row in rows:
        values = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in objectives]
        table.add_row(
            row["algorithm"], *values, "*" if row["on_overall_front"] else "", row["run_id"]
        )
    Console().print(table)
    if summary.get("pareto_png"):
        Console().print(f"Pareto plot: {summary['pareto_png']}")
    Console().print(
        f"results: {summary['results_parquet']}; MLflow parent run "
        f"{summary['parent_run_id']} (browse: mlflow ui --backend-store-uri "
        f"sqlite:///mlflow.db)"
    )


privacy_app = typer.Typer(
    help="Differential-privacy accounting (Opacus / dp-accounting).", no_args_is_help=True
)
app.add_typer(privacy_app, name="privacy")


class AccountantChoice(StrEnum):
    rdp = "rdp"
    prv = "prv"
    pld = "pld"


@privacy_app.command("epsilon")
def privacy_epsilon(
    noise_multiplier: Annotated[float, typer.Option(help="sigma: noise std / clipping norm")],
    sample_rate: Annotated[
        float,
        typer.Option(
            help="DP-SGD record sampling rate B/n (or clients per round / total for client-level)"
        ),
    ],
    steps: Annotated[int, typer.Option(help="number of noisy steps composed")],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Epsilon spent by ``steps`` Poisson-subsampled Gaussian steps."""
    from flcore.privacy.accounting import compute_epsilon

    try:
        eps = compute_epsilon([(noise_multiplier, sample_rate, steps)], delta, accountant.value)
    except FedSweepError as exc:
        _fail(str(exc))
    out = {"epsilon": eps, "delta": delta, "accountant": accountant.value}
    typer.echo(
        json.dumps({k: _jsonable(v) for k, v in out.items()})
        if as_json
        else f"epsilon = {eps:.6g} at delta = {delta:g} ({accountant.value})"
    )


@privacy_app.command("sigma")
def privacy_sigma(
    epsilon: Annotated[float, typer.Option(help="target epsilon")],
    sample_rate: Annotated[float, typer.Option(help="record (or client) sampling rate")],
    steps: Annotated[int, typer.Option(help="number of noisy steps")],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    max_noise_multiplier: Annotated[float, typer.Option(help="give up above this sigma")] = 100.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The smallest noise multiplier whose epsilon is at most the target."""
    from flcore.privacy.accounting import calibrate_noise

    try:
        sigma = calibrate_noise(
            epsilon,
            delta,
            sample_rate,
            steps,
            accountant=accountant.value,
            max_noise_multiplier=max_noise_multiplier,
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
