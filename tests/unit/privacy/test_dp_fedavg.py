"""dp_fedavg / dp_fedavg_client on a small real FMNIST subset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine
from flcore.privacy.accounting import compute_epsilon


def _cfg(data_root: Path, **over):  # type: ignore[no-untyped-def]
    raw = {
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 50,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 25,
        "lr": 0.05,
        "workers": 1,
        "seed": 1,
    } | over
    return validate_config(raw)


def test_dp_fedavg_reports_the_per_client_epsilon(data_root: Path) -> None:
    cfg = _cfg(
        data_root,
        algorithm="dp_fedavg",
        client_fraction=0.5,
        privacy={"noise_multiplier": 1.2, "clip": 1.0},
    )
    engine = build_engine(cfg)
    results = list(engine.iter_rounds())
    # round 1: 2 of 4 clients; round 2 (forced full): all 4. The worst client trained twice:
    # 2 x 1 epoch x ceil(100 / 25) = 8 steps at q = 25 / 100.
    expected = compute_epsilon([(1.2, 0.25, 8)], 1e-5)
    assert results[-1].metrics["epsilon"] == pytest.approx(expected)
    assert results[0].metrics["epsilon"] == pytest.approx(compute_epsilon([(1.2, 0.25, 4)], 1e-5))
    assert results[-1].metrics["delta"] == 1e-5
    assert results[-1].metrics["noise_multiplier"] == 1.2
    assert 0 <= results[-1].metrics["accuracy"] <= 1


def test_target_epsilon_is_calibrated_before_training_and_met(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="dp_fedavg", privacy={"target_epsilon": 3.0, "clip": 1.0})
    engine = build_engine(cfg)
    assert engine.algorithm.privacy.noise_multiplier > 0
    summary = engine.run()
    assert summary["epsilon"] <= 3.0


def test_unreachable_target_fails_before_training(data_root: Path) -> None:
    cfg = _cfg(
        data_root,
        algorithm="dp_fedavg",
        privacy={"target_epsilon": 0.001, "max_noise_multiplier": 5},
    )
    with pytest.raises(ConfigError, match="cannot be reached"):
        build_engine(cfg, data=build_data(cfg))


def test_client_level_dp_composes_one_release_per_round(data_root: Path) -> None:
    cfg = _cfg(
        data_root,
        algorithm="dp_fedavg_client",
        client_fraction=0.5,
        privacy={"mechanism": "client", "noise_multiplier": 0.8, "clip": 2.0},
    )
    summary = build_engine(cfg).run()
    # round 1 samples each client with probability q = 0.5 (Poisson, the default), the
    # forced full last round has q = 1; both are add/remove releases
    assert summary["epsilon"] == pytest.approx(
        compute_epsilon([(0.8, 0.5, 1), (0.8, 1.0, 1)], 1e-5)
    )
    assert math.isfinite(summary["accuracy"])


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"algorithm": "dp_fedavg"}, "privacy"),
        (
            {"algorithm": "dp_fedavg", "privacy": {"noise_multiplier": -1}},
            "privacy.noise_multiplier",
        ),
        ({"algorithm": "dp_fedavg", "privacy": {"target_epsilon": 0}}, "privacy.target_epsilon"),
        ({"algorithm": "dp_fedavg", "privacy": {"target_epsilon": 1, "delta": 0}}, "privacy.delta"),
        ({"algorithm": "dp_fedavg", "privacy": {"noise_multiplier": 1, "clip": 0}}, "privacy.clip"),
        (
            {"algorithm": "dp_fedavg", "privacy": {"mechanism": "client", "noise_multiplier": 1}},
            "privacy.mechanism",
        ),
        ({"algorithm": "local", "privacy": {"noise_multiplier": 1}}, "privacy.mechanism"),
    ],
)
def test_bad_privacy_config(data_root: Path, over: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(data_root, **over)
    assert info.value.key == key
