"""``fedsweep privacy epsilon`` and ``sigma``: DP accounting from the command line."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer

from flcore.errors import FedSweepError
from sweeps.cli._app import app
from sweeps.cli.output import fail, jsonable

__all__ = ["privacy_app"]


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


def sampling_scheme(sample_rate: float, population: int | None) -> tuple[float, str]:
    """The accounted rate and scheme: Poisson at ``sample_rate``, or fixed-size ``m / N``
    with ``m`` drawn as client-level DP draws it."""
    if population is None:
        return sample_rate, "poisson"
    if not 0 < sample_rate <= 1:
        fail(f"--sample-rate: must be in (0, 1], got {sample_rate}")
    return max(1, int(sample_rate * population)) / population, "fixed"


@privacy_app.command("epsilon")
def privacy_epsilon(
    noise_multiplier: Annotated[float, typer.Option(help="sigma: noise std / clipping norm")],
    sample_rate: Annotated[
        float,
        typer.Option(help="DP-SGD record sampling rate B/n, or client-level DP's client_fraction"),
    ],
    steps: Annotated[int, typer.Option(help="number of noisy steps composed", min=0)],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    population: Annotated[int | None, typer.Option(help=_POPULATION_HELP, min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Epsilon spent by --steps subsampled Gaussian steps.

    Poisson sampling under add/remove, or with --population N fixed-size sampling under
    replace-one."""
    from flcore.privacy.accounting import compute_epsilon

    rate, sampling = sampling_scheme(sample_rate, population)
    try:
        eps = compute_epsilon(
            [(noise_multiplier, rate, steps)],
            delta,
            accountant.value,
            sampling=sampling,
            population=population,
        )
    except FedSweepError as exc:
        fail(str(exc))
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
    steps: Annotated[int, typer.Option(help="number of noisy steps", min=1)],
    delta: Annotated[float, typer.Option(help="delta")] = 1e-5,
    accountant: Annotated[AccountantChoice, typer.Option(help="accountant")] = AccountantChoice.rdp,
    max_noise_multiplier: Annotated[float, typer.Option(help="give up above this sigma")] = 1000.0,
    population: Annotated[int | None, typer.Option(help=_POPULATION_HELP, min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The smallest noise multiplier whose epsilon is at most the target.

    Sampling as for `privacy epsilon`."""
    from flcore.privacy.accounting import calibrate_noise

    rate, sampling = sampling_scheme(sample_rate, population)
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
        fail(str(exc))
    typer.echo(
        json.dumps({"noise_multiplier": sigma}) if as_json else f"noise_multiplier = {sigma:.6g}"
    )
