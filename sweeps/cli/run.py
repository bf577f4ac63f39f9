"""``fedsweep run``, ``attack`` and ``list``: one experiment in-process, a standalone privacy
evaluation, the registered names."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from flcore.errors import FedSweepError
from sweeps.cli._app import app
from sweeps.cli.inputs import JsonFlag, SetOption, config_or_fail
from sweeps.cli.output import deliver, fail, sigterm_as_interrupt
from sweeps.cli.render import print_attack, print_summary

__all__ = ["attack", "list_", "run"]


class Listable(StrEnum):
    algorithms = "algorithms"
    datasets = "datasets"
    partitioners = "partitioners"
    models = "models"


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="experiment YAML")],
    set_: SetOption = None,
    as_json: JsonFlag = False,
    resume: Annotated[Path | None, typer.Option(help="continue from this checkpoint")] = None,
) -> None:
    """Run one FL experiment in-process, logging to MLflow and Parquet."""
    cfg = config_or_fail(config, set_)
    if resume is not None and not resume.is_file():
        fail(f"--resume: no checkpoint at {resume}")

    from sweeps.experiment import run_experiment

    with sigterm_as_interrupt():
        deliver(
            as_json, lambda: run_experiment(cfg, progress=True, resume_from=resume), print_summary
        )


@app.command()
def attack(
    config: Annotated[Path, typer.Argument(help="experiment YAML (its `attack` mapping)")],
    set_: SetOption = None,
    as_json: JsonFlag = False,
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
    from sweeps.experiment import attack_config

    cfg = config_or_fail(config, set_)
    if checkpoint is not None and not checkpoint.is_file():
        fail(f"--checkpoint: no checkpoint at {checkpoint}")
    try:
        cfg = attack_config(cfg, checkpoint)
    except FedSweepError as exc:
        fail(f"invalid config {config}: {exc}")
    from sweeps.experiment import attack_summary, run_experiment

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

    with sigterm_as_interrupt():
        deliver(as_json, lambda: attack_summary(go(), cfg), print_attack)


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
