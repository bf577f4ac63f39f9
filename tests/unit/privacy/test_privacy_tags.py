"""``Algorithm.privacy_tags()``: what each kind of run's epsilon means (issue 23 §1.1, §1.2).

Built from the algorithms' constructors alone (the tags depend only on the algorithm and its
privacy settings), so no data is loaded."""

from __future__ import annotations

from typing import Any

import pytest

from flcore.algorithms import ALGORITHMS, LocalTraining, ModelSpec
from flcore.privacy.settings import PrivacySettings

SPEC = ModelSpec("cnn_fmnist", 10, 1)
TRAINING = LocalTraining(epochs=1, batch_size=25, lr=0.05)


def _tags(algorithm: str, privacy: PrivacySettings | None, **params: Any) -> dict[str, str]:
    alg = ALGORITHMS.get(algorithm)(
        model_spec=SPEC, training=TRAINING, num_clients=4, params=params, privacy=privacy
    )
    return alg.privacy_tags()


def _dp(mechanism: str, **kw: Any) -> PrivacySettings:
    return PrivacySettings(mechanism, 1.0, 1.0, 1e-5, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("algorithm", "privacy", "params", "expected"),
    [
        (
            "dp_fedavg",
            _dp("dpsgd"),
            {},
            {"dp_guarantee": "isrl", "dp_relation": "add-remove"},
        ),
        (
            "dp_fedavg_client",
            _dp("client"),
            {},
            {
                "dp_guarantee": "client-level",
                "dp_relation": "add-remove",
                "client_sampling": "poisson",
            },
        ),
        (
            "dp_fedavg_client",
            _dp("client", client_sampling="fixed"),
            {},
            {
                "dp_guarantee": "client-level",
                "dp_relation": "replace-one",
                "client_sampling": "fixed",
            },
        ),
        (
            "ppsgd",
            _dp("dpsgd"),
            {"personal_dp": False},
            {"dp_guarantee": "shared-only", "dp_relation": "add-remove"},
        ),
        (
            "centaur",
            _dp("dpsgd"),
            {"personal_dp": False},
            {"dp_guarantee": "shared-only", "dp_relation": "add-remove"},
        ),
        ("fedavg", None, {}, {"dp_guarantee": "none"}),
        ("hyperfl", None, {}, {"dp_guarantee": "none"}),
        ("local", None, {}, {"dp_guarantee": "no-release"}),
    ],
)
def test_privacy_tags(
    algorithm: str, privacy: PrivacySettings | None, params: dict, expected: dict
) -> None:
    assert _tags(algorithm, privacy, **params) == expected


def test_every_dp_mechanism_states_its_relation() -> None:
    assert _dp("dpsgd").relation == "add-remove"
    assert _dp("client").relation == "add-remove"
    assert _dp("client", client_sampling="fixed").relation == "replace-one"
    # sensitivity bounded under replacement of a record / a client's data
    assert _dp("gaussian").relation == "replace-one"
    assert _dp("perturbation").relation == "replace-one"


@pytest.mark.parametrize(
    ("algorithm", "mechanism"),
    [
        (name, mech)
        for name in ALGORITHMS.names()
        for mech in sorted(ALGORITHMS.get(name).privacy_mechanisms)
    ],
)
def test_every_dp_run_is_tagged_with_its_guarantee_and_relation(
    algorithm: str, mechanism: str
) -> None:
    tags = _tags(algorithm, _dp(mechanism))
    expected = {"perturbation": "client-ldp", "client": "client-level"}.get(mechanism, "isrl")
    assert tags["dp_guarantee"] in (expected, "shared-only")
    assert tags["dp_relation"] == _dp(mechanism).relation


@pytest.mark.parametrize(
    ("algorithm", "reference", "privacy"),
    [
        ("fedprox", "dp_fedavg", {"mechanism": "dpsgd", "noise_multiplier": 1.0, "clip": 1.0}),
        ("moon", "dp_fedavg_client", {"mechanism": "client", "noise_multiplier": 0.8, "clip": 1.0}),
        (
            "fedalign",
            "dp_fedavg_client",
            {"mechanism": "client", "noise_multiplier": 0.8, "clip": 1.0},
        ),
    ],
)
def test_fedhkd_baselines_spend_exactly_their_mechanisms_epsilon(
    data_root, algorithm: str, reference: str, privacy: dict
) -> None:  # type: ignore[no-untyped-def]
    # The same data, sampling and mechanism as the DP-FedAvg variant whose accountant is tested
    # against the library: the epsilon (and its tags) must be the same
    from flcore.config import validate_config
    from flcore.experiment import build_engine

    def run(name: str) -> tuple[float, dict[str, str]]:
        raw = {
            "algorithm": name,
            "data_root": str(data_root),
            "num_clients": 4,
            "samples_per_client": 40,
            "rounds": 2,
            "local_epochs": 1,
            "batch_size": 20,
            "client_fraction": 0.5,
            "global_test_per_class": 10,
            "workers": 1,
            "privacy": privacy,
        }
        engine = build_engine(validate_config(raw))
        out = engine.run()
        return out["epsilon"], engine.algorithm.privacy_tags()

    eps, tags = run(algorithm)
    ref_eps, ref_tags = run(reference)
    assert 0 < eps < float("inf")
    assert eps == pytest.approx(ref_eps, rel=1e-9)
    assert tags == ref_tags


def test_a_weak_delta_run_has_no_guarantee_and_reports_inf() -> None:
    # delta >= 1 / records a client holds lets a record out: the accountant's figure is kept
    # beside, the run's epsilon is inf
    import math

    privacy = _dp("dpsgd", weak_delta=True)
    alg = ALGORITHMS.get("dp_fedavg")(
        model_spec=SPEC, training=TRAINING, num_clients=4, privacy=privacy
    )
    alg.init_server()
    alg._record_dp.record(0, 100)  # one client's round of DP-SGD
    assert alg.privacy_tags() == {"dp_guarantee": "weak-delta", "dp_relation": "add-remove"}
    metrics = alg.privacy_metrics()
    assert metrics["epsilon"] == math.inf and 0 < metrics["epsilon_accountant"] < math.inf
