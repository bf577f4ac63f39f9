"""Reading a command's options into what the work needs, or exiting 2 naming the problem before
any work: objectives, a hypervolume reference, the tracking store a sweep spec names, a runs
table, a sweep's own objectives, an output file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from flcore.errors import FedSweepError
from sweeps.cli.output import fail

__all__ = [
    "JsonFlag",
    "OBJECTIVES_HELP",
    "SPEC_HELP",
    "SetOption",
    "config_or_fail",
    "count",
    "default_objectives_or_fail",
    "objectives_or_fail",
    "out_file_or_fail",
    "reference_or_fail",
    "runs_or_fail",
    "store_or_fail",
]

OBJECTIVES_HELP = (
    "objectives as name:max|min, comma-separated (default: the sweep's own objectives when "
    "the runs come from sweeps, else accuracy:max,epsilon:min)"
)

SPEC_HELP = (
    "a sweep spec: read the store (tracking.uri) and experiment it writes to, resolved as "
    "`fedsweep sweep` resolves them"
)


def out_file_or_fail(out: Path, example: str) -> Path:
    """``out`` when it can be written as a file: an existing folder there is refused (exit 2,
    before any run is read), with ``example`` (a file name) as the way out."""
    if out.is_dir():
        fail(f"--out {out} is a folder; give a file name such as {out / example}")
    return out


def objectives_or_fail(spec: str) -> list[Any]:
    from analysis.pareto import parse_objectives

    try:
        return parse_objectives(spec)
    except ValueError as exc:
        fail(f"--objectives: {exc}")


def reference_or_fail(text: str | None, n: int) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        fail(f"--reference {text!r}: give {n} comma-separated numbers, one per objective")
    if len(values) != n or not all(math.isfinite(v) for v in values):
        fail(f"--reference {text!r}: give {n} finite numbers, one per objective")
    return values


def count(text: str | None) -> int:
    return len(text.split(",")) if text is not None else 0


def store_or_fail(spec: Path | None, experiments: list[str] | None) -> tuple[str, list[str]]:
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
        fail(f"invalid sweep spec {spec}: {exc}")
    return sweep_tracking_uri(loaded), list(experiments or [experiment_name(loaded)])


def runs_or_fail(
    experiments: list[str] | None,
    parquet: Path | None = None,
    filter_string: str = "",
    sweep_name: str | None = None,
    uri: str | None = None,
) -> Any:
    """The runs table from MLflow (the store ``uri``) or Parquet; bad input exits with code 2."""
    from analysis.load import LoadError, load_parquet, load_runs

    if bool(experiments) == (parquet is not None):
        fail("give --experiment NAME (MLflow; repeat it for several) or --parquet FILE")
    try:
        if parquet is not None:
            df = load_parquet(parquet)
        else:
            df = load_runs(
                experiments or [], filter_string=filter_string, sweep=sweep_name, uri=uri
            )
    except LoadError as exc:
        fail(str(exc))
    if not len(df):
        where = str(parquet) if parquet else f"experiment(s) {', '.join(experiments or [])}"
        fail(
            f"no runs to analyse in {where}"
            + (f" matching {filter_string!r}" if filter_string else "")
        )
    return df


def default_objectives_or_fail(df: Any, parquet: Path | None) -> tuple[list[Any], str]:
    """The sweep's own objectives (see :mod:`analysis.sweep_objectives`); exit 2 when the
    runs' sweeps disagree."""
    from analysis.fronts import ObjectiveError
    from analysis.load import LoadError, open_store
    from analysis.sweep_objectives import default_objectives

    try:
        client = open_store()
    except LoadError as exc:
        if parquet is None:
            fail(str(exc))
        client = None  # a Parquet file read without its store: the default
    try:
        return default_objectives(df, client)
    except ObjectiveError as exc:
        fail(str(exc))


#: the options `run` and `attack` share
SetOption = Annotated[list[str] | None, typer.Option("--set", help="override: key=value (dotted)")]
JsonFlag = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def config_or_fail(path: Path, sets: list[str] | None) -> Any:
    """The experiment config at ``path`` with ``--set`` overrides; a bad one exits 2."""
    from flcore.config import load_config

    try:
        return load_config(path, sets or [])
    except FedSweepError as exc:
        fail(f"invalid config {path}: {exc}")
