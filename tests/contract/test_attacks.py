"""Every algorithm hands attacks only the server's view; every attack honours the contract
(flcore.testing.attack_contract), on real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from flcore.algorithms import ALGORITHMS
from flcore.attacks import ATTACKS
from flcore.config import validate_config
from flcore.experiment import build_data
from flcore.testing import attack_contract as contract
from tests.contract.test_algorithms import MODEL, required_privacy


@pytest.fixture(scope="module")
def small(data_root: Path):  # type: ignore[no-untyped-def]
    raw = {
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 2,
        "samples_per_client": 40,
        "test_samples_per_client": 20,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.05,
        "seed": 4,
        "workers": 1,
        "global_test_per_class": 50,
        # FedMD distils on a public set; it is drawn after the clients' records, so the other
        # algorithms' clients are unchanged
        "public_samples": 40,
    }
    return raw, build_data(validate_config(raw))


#: a capacity-aware algorithm is attacked on clients of widths 1 and 1/2
CAPACITY = {
    "model": "pa3dfl_cnn_fmnist",
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25]},
}


def _cfg(raw: dict, algorithm: str):  # type: ignore[no-untyped-def]
    from tests.contract.test_algorithms import FEWSHOT, GRAPH, SERVER_KEYS

    cls = ALGORITHMS.get(algorithm)
    extra = required_privacy(cls)
    extra |= CAPACITY if cls.capacity_aware else {}
    if cls.needs_fewshot:  # a few-shot task on a walk: no server's sampling keys
        raw = {k: v for k, v in raw.items() if k not in (*SERVER_KEYS, "public_samples")}
        extra |= FEWSHOT | (GRAPH if cls.topology != "server" else {}) | {"num_clients": 4}
    return validate_config(raw | {"algorithm": algorithm} | extra | MODEL.get(algorithm, {}))


ATTACKABLE = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a).attackable]


@pytest.mark.parametrize("algorithm", ATTACKABLE)
def test_the_observation_holds_only_what_the_server_sees(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    raw, data = small
    cfg = _cfg(raw, algorithm)
    if ALGORITHMS.get(algorithm).needs_fewshot:  # its own data: few-shot tasks
        data = build_data(cfg)
    contract.check_observation_is_the_servers_view(cfg, data)


@pytest.mark.parametrize(
    "algorithm", [a for a in ALGORITHMS.names() if not ALGORITHMS.get(a).attackable]
)
def test_an_algorithm_no_surface_simulates_refuses_an_attack(algorithm: str, data_root) -> None:  # type: ignore[no-untyped-def]
    from flcore.errors import ConfigError
    from tests.contract.test_algorithms import FEWSHOT, GRAPH

    cls = ALGORITHMS.get(algorithm)
    raw = {"algorithm": algorithm, "data_root": str(data_root), "num_clients": 4, "rounds": 2}
    raw |= FEWSHOT if cls.needs_fewshot else {}
    raw |= GRAPH if cls.topology != "server" else {}
    validate_config(raw)  # the config is fine without the attack
    with pytest.raises(ConfigError, match="cannot be attacked"):
        validate_config(raw | {"attack": {"rounds": [1]}})


@pytest.mark.parametrize("attack", ATTACKS.names())
def test_attack_contract(attack: str, small) -> None:  # type: ignore[no-untyped-def]
    raw, data = small
    supported = ATTACKS.get(attack).algorithms
    algorithm = "fedavg" if supported is None else sorted(supported)[0]
    _, _, obs, _ = contract.observations(_cfg(raw, algorithm), data)
    contract.check_attack_contract(attack, obs[0])


def test_the_check_catches_a_leaking_upload(small, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The contract is not vacuous: an algorithm that also uploads its private embedding fails."""
    from flcore.algorithms.hyperfl import HyperFL

    original = HyperFL.local_update

    def leaky(self, data, task, generator):  # type: ignore[no-untyped-def]
        result = original(self, data, task, generator)
        if task.round == 2:  # the attacked round (round 1 must still aggregate)
            result.upload["embedding"] = task.state["embedding"].clone()
        return result

    monkeypatch.setattr(HyperFL, "local_update", leaky)
    raw, data = small
    with pytest.raises(AssertionError, match="private tensor"):
        contract.check_observation_is_the_servers_view(_cfg(raw, "hyperfl"), data)


@pytest.mark.parametrize(
    "algorithm",
    [a for a in ATTACKABLE if not ALGORITHMS.get(a).needs_fewshot and ALGORITHMS.get(a).uploads],
)
def test_the_record_free_replay_removes_the_records_gradient(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    """Every algorithm's record gradient flows through some module's output, so the record-free
    replay (flcore.attacks.signal.record_free) differs from the real one at round 1: an
    algorithm whose data bypassed every module would read as carrying nothing (HeteroFL's
    one-record replay did, and it is refused an attack until that is fixed)."""
    from flcore.algorithms import ClientTask
    from flcore.experiment import build_engine

    raw, data = small
    attack = {"name": "ig", "rounds": [1], "clients": [0], "images": 2, "iterations": 1}
    cfg = _cfg(raw | {"attack": attack}, algorithm)
    engine = build_engine(cfg, data=data)
    alg, evaluator = engine.algorithm, engine.probes[0]
    alg.begin_round(1, [0])
    task = ClientTask(0, 1, alg.broadcast(1, 0), engine.client_states[0], False, 0)
    assert evaluator.informative_flags(engine, 1, task) == [True, True]
