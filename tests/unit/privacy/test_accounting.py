"""Accounting goes through the libraries; calibration round-trips; bad input is refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from flcore.errors import ConfigError
from flcore.privacy.accounting import Accountant, calibrate_noise, compute_epsilon

FEDSWEEP = str(Path(sys.executable).parent / "fedsweep")


def _cli(args: list[str]):  # type: ignore[no-untyped-def]
    """``fedsweep ARGS`` in this process: the console script itself runs in
    :func:`test_cli_epsilon_equals_the_library_value` (its start-up is about 5 CPU-s a call)."""
    from tests.integration.sweep_helpers import cli_in_process

    return cli_in_process(args, Path.cwd())


def test_rdp_matches_opacus_and_pld_matches_dp_accounting() -> None:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from opacus.accountants import RDPAccountant

    ref = RDPAccountant()
    ref.history = [(1.1, 0.01, 1000)]
    ours = compute_epsilon([(1.1, 0.01, 1000)], 1e-5, "rdp")
    assert ours <= ref.get_epsilon(1e-5) + 1e-9  # extra orders can only tighten
    assert ours == pytest.approx(ref.get_epsilon(1e-5), rel=0.05)
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1)), 1000)
    assert compute_epsilon([(1.1, 0.01, 1000)], 1e-5, "pld") == pytest.approx(pld.get_epsilon(1e-5))


def test_rdp_epsilon_is_opacus_s_bitwise_and_each_step_s_rdp_is_computed_once() -> None:
    """compute_epsilon remembers each (sigma, q)'s one-step RDP: every history, resumed runs'
    several entries included, gets exactly what Opacus's RDPAccountant computes."""
    from opacus.accountants import RDPAccountant

    from flcore.privacy import accounting
    from flcore.privacy.accounting import RDP_ORDERS

    accounting._rdp_per_step.cache_clear()
    histories = [
        [(1.1, 0.01, 1)],
        [(1.1, 0.01, 1000)],
        [(1.1, 0.01, 7), (0.8, 0.05, 3), (1.1, 0.01, 2)],  # a noise change and back
        [(4.0, 1.0, 50)],  # no sampling
    ]
    for history in histories:
        ref = RDPAccountant()
        ref.history = list(history)
        assert compute_epsilon(history, 1e-5) == ref.get_epsilon(1e-5, alphas=RDP_ORDERS)
    info = accounting._rdp_per_step.cache_info()
    assert (info.misses, info.hits) == (3, 3)  # (1.1, 0.01), (0.8, 0.05), (4.0, 1.0) once each
    with pytest.raises(ValueError, match="read-only"):
        accounting._rdp_per_step(1.1, 0.01)[0] = 0.0


def test_fixed_size_epsilon_is_dp_accountings_bitwise_and_each_step_is_computed_once() -> None:
    """Under fixed-size sampling (replace-one) compute_epsilon remembers each entry's one-step
    RDP: every history gets exactly what dp-accounting's RdpAccountant computes composing it."""
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant

    from flcore.privacy import accounting
    from flcore.privacy.accounting import RDP_ORDERS, history_event

    accounting._fixed_rdp_per_step.cache_clear()
    histories = [
        [(1.1, 0.1, 1)],
        [(1.1, 0.1, 300)],
        [(1.1, 0.1, 7), (0.8, 0.5, 3), (1.1, 0.1, 2)],  # a noise and size change and back
        [(4.0, 1.0, 50)],  # every party each round: no sampling
    ]
    for history in histories:
        ref = rdp_privacy_accountant.RdpAccountant(
            orders=RDP_ORDERS, neighboring_relation=NeighboringRelation.REPLACE_ONE
        )
        ref.compose(history_event(history, sampling="fixed", population=20))
        ours = compute_epsilon(history, 1e-5, sampling="fixed", population=20)
        assert ours == ref.get_epsilon(1e-5)
    info = accounting._fixed_rdp_per_step.cache_info()
    assert (info.misses, info.hits) == (3, 3)
    with pytest.raises(ValueError, match="read-only"):
        accounting._fixed_rdp_per_step(1.1, 0.1, 20)[0] = 0.0
    with pytest.raises(ConfigError, match="whole parties"):  # still refused, never remembered
        compute_epsilon([(1.1, 0.123, 5)], 1e-5, sampling="fixed", population=20)


def test_cli_epsilon_equals_the_library_value() -> None:
    from opacus.accountants import RDPAccountant

    from flcore.privacy.accounting import RDP_ORDERS

    out = subprocess.run(
        [
            FEDSWEEP,
            "privacy",
            "epsilon",
            "--noise-multiplier",
            "10.625",
            "--sample-rate",
            "0.0833333",
            "--steps",
            "12000",
            "--delta",
            "1e-5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ref = RDPAccountant()
    ref.history = [(10.625, 0.0833333, 12000)]
    assert doc == {
        "epsilon": pytest.approx(ref.get_epsilon(1e-5, alphas=RDP_ORDERS)),
        "delta": 1e-5,
        "accountant": "rdp",
        "dp_relation": "add-remove",
    }
    # the paper's setting: epsilon 4 needs sigma ~ 10.6 over 12,000 steps at q = 1/12
    assert 3.9 < doc["epsilon"] <= 4.0


def test_a_negative_step_count_is_refused_not_read_as_nothing_released() -> None:
    assert compute_epsilon([(1.0, 0.1, 0)], 1e-5) == 0.0  # no step: nothing released
    with pytest.raises(ConfigError, match="steps"):
        compute_epsilon([(1.0, 0.1, -5)], 1e-5)
    for command, steps in (("epsilon", "-5"), ("sigma", "0")):
        args = ["--sample-rate", "0.1", "--steps", steps]
        first = ["--noise-multiplier", "1"] if command == "epsilon" else ["--epsilon", "4"]
        out = _cli(["privacy", command, *first, *args])
        assert out.returncode == 2 and "--steps" in out.stderr, (command, out.stderr)


def test_cli_population_accounts_fixed_size_sampling_under_replace_one() -> None:
    """``--population 20 --sample-rate 0.3``: 6 of 20 without replacement, as client-level DP
    with ``client_sampling: fixed`` draws them: dp-accounting's event at sigma / 2."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from flcore.privacy.accounting import RDP_ORDERS

    args = ["--noise-multiplier", "2", "--sample-rate", "0.3", "--steps", "50", "--json"]
    fixed = _cli(["privacy", "epsilon", *args, "--population", "20"])
    assert fixed.returncode == 0, fixed.stderr
    doc = json.loads(fixed.stdout)
    ref = rdp.RdpAccountant(RDP_ORDERS, neighboring_relation=NeighboringRelation.REPLACE_ONE)
    ref.compose(dp_event.SampledWithoutReplacementDpEvent(20, 6, dp_event.GaussianDpEvent(1.0)), 50)
    assert doc["dp_relation"] == "replace-one"
    assert doc["epsilon"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-6)
    refused = _cli(["privacy", "epsilon", *args, "--population", "20", "--accountant", "pld"])
    assert refused.returncode == 2 and "accountant" in refused.stderr


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibration_round_trips(accountant: str) -> None:
    sigma = calibrate_noise(4.0, 1e-5, 1 / 12, 2400, accountant=accountant)
    assert compute_epsilon([(sigma, 1 / 12, 2400)], 1e-5, accountant) <= 4.0
    assert compute_epsilon([(0.95 * sigma, 1 / 12, 2400)], 1e-5, accountant) > 4.0


def test_cli_sigma_round_trips() -> None:
    out = _cli(["privacy", "sigma", "--epsilon", "2", "--sample-rate", "0.05", "--steps", "500"]
               + ["--json"])  # fmt: skip
    sigma = json.loads(out.stdout)["noise_multiplier"]
    assert (
        compute_epsilon([(sigma, 0.05, 500)], 1e-5)
        <= 2.0
        < compute_epsilon([(0.95 * sigma, 0.05, 500)], 1e-5)
    )


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: calibrate_noise(0, 1e-5, 0.1, 10), "target_epsilon"),
        (lambda: calibrate_noise(-1, 1e-5, 0.1, 10), "target_epsilon"),
        (lambda: calibrate_noise(1, 0, 0.1, 10), "delta"),
        (lambda: calibrate_noise(1, 1, 0.1, 10), "delta"),
        (lambda: compute_epsilon([(-0.5, 0.1, 10)], 1e-5), "noise_multiplier"),
        (lambda: compute_epsilon([(1.0, 1.5, 10)], 1e-5), "sample_rate"),
        (lambda: compute_epsilon([(1.0, 0.1, 10)], 1e-5, "gdp"), "accountant"),
        (
            lambda: calibrate_noise(0.01, 1e-5, 1.0, 10000, max_noise_multiplier=100),
            "target_epsilon",
        ),
    ],
)
def test_bad_privacy_input_is_refused(call, key: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key == key


def test_no_noise_is_infinite_epsilon_and_nothing_is_zero() -> None:
    assert compute_epsilon([(0.0, 0.1, 10)], 1e-5) == math.inf
    assert compute_epsilon([], 1e-5) == 0.0


def test_accountant_state_round_trips_and_merges_steps() -> None:
    acc = Accountant("rdp")
    acc.step(1.0, 0.1, 5)
    acc.step(1.0, 0.1, 7)
    acc.step(1.0, 1.0, 1)
    assert acc.history == [(1.0, 0.1, 12), (1.0, 1.0, 1)] and acc.steps == 13
    other = Accountant("rdp")
    other.load_state_dict(acc.state_dict())
    assert other.epsilon(1e-5) == acc.epsilon(1e-5)
