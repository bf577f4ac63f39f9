"""Every registered algorithm passes flcore.testing.algorithm_contract on real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from flcore.algorithms import ALGORITHMS
from flcore.config import validate_config
from flcore.experiment import build_data
from flcore.testing import algorithm_contract as contract


@pytest.fixture(scope="module")
def small(data_root: Path):  # type: ignore[no-untyped-def]
    raw = {
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 3,
        "samples_per_client": 60,
        "test_samples_per_client": 60,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.05,
        "eval_every": 1,
        "seed": 5,
        "workers": 1,
        "client_fraction": 0.67,
        # the contract checks behaviour, not accuracy: 500 global test records instead of 10k
        # keep every engine run here quick (evaluating 10k images dominated them)
        "global_test_per_class": 50,
        # FedMD distils on a public set; it is drawn after the clients' records, so the other
        # algorithms' clients are unchanged
        "public_samples": 60,
    }
    cache: dict[object, object] = {}

    def setup(algorithm: str):  # type: ignore[no-untyped-def]
        """The algorithm's contract config and its data (built once per data layout)."""
        cfg = _cfg(raw, algorithm)
        cls = ALGORITHMS.get(algorithm)
        layout = "fewshot" if cls.needs_fewshot else cls.capacity_aware
        if layout not in cache:
            cache[layout] = build_data(cfg)
        return cfg, cache[layout]

    return setup


ALL = ALGORITHMS.names()

#: what an algorithm that cannot run without DP gets in these contract runs
PRIVACY = {
    "dpsgd": {"mechanism": "dpsgd", "noise_multiplier": 1.0, "clip": 1.0},
    "client": {"mechanism": "client", "noise_multiplier": 0.5, "clip": 1.0},
}


#: what an algorithm that needs another network gets (HyperFL-LPM: a backbone with adapters)
MODEL = {"hyperfl_lpm": {"model": "resnet18_adapter", "model_params": {"tiny": True}}}

#: what an algorithm with a server hypernetwork gets: small embeddings and hidden layers, the
#: same code at a fraction of the cost (HyperFL's default generator made its contract runs
#: 7x slower; the contract checks behaviour, not accuracy); Pa3dFL two power-iteration steps
#: per balanced step size (its default 20 were 80% of its contract runs)
SMALL_HN = {"embed_dim": 8, "hidden_dim": 16}
PARAMS = {"hyperfl": SMALL_HN, "pa3dfl": SMALL_HN | {"power_iterations": 2}}


#: what a meta-learning algorithm gets: three few-shot clients (5-way 1-shot, 3 query and 3
#: test records a class) and two unseen ones, on CONV4 at 16 channels; a walk or gossip
#: algorithm also a ring (2-regular: every client two neighbours)
FEWSHOT = {
    "model": "conv4",
    "model_params": {"hidden": 16},
    "fewshot": {"n_way": 5, "k_shot": 1, "query": 3, "test_query": 3, "unseen_clients": 2},
    "algorithm_params": {"inner_steps": 2},
}
GRAPH = {"graph": {"name": "regular", "degree": 2}}
SERVER_KEYS = ("client_fraction", "samples_per_client", "test_samples_per_client")

#: what a capacity-aware algorithm gets: three clients of widths 1, 1/2 and 1/4 on Pa3dFL's
#: width-scalable CNN, each with its own validation records
CAPACITY = {
    "model": "pa3dfl_cnn_fmnist",
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625]},
    "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
}


def required_privacy(cls: type) -> dict:  # type: ignore[type-arg]
    """The privacy mapping an algorithm that cannot run without DP gets ({} for the others)."""
    needs = cls.requires_privacy  # type: ignore[attr-defined]
    if not needs:
        return {}
    privacy = PRIVACY[needs]
    if cls.side_releases:  # type: ignore[attr-defined]  # FedHKD's class statistics too
        privacy = privacy | {"protect": "knowledge+model"}
    return {"privacy": privacy}


def _cfg(raw: dict, algorithm: str):  # type: ignore[no-untyped-def]
    cls = ALGORITHMS.get(algorithm)
    extra = required_privacy(cls)
    extra |= CAPACITY if cls.capacity_aware else {}
    if cls.needs_fewshot:
        raw = {k: v for k, v in raw.items() if k not in SERVER_KEYS}
        extra |= FEWSHOT | (GRAPH if cls.topology != "server" else {})
    if algorithm in PARAMS:
        extra |= {"algorithm_params": PARAMS[algorithm]}
    return validate_config(raw | {"algorithm": algorithm} | extra | MODEL.get(algorithm, {}))


@pytest.mark.parametrize("algorithm", ALL)
def test_determinism(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_determinism(cfg, data)


@pytest.mark.parametrize("algorithm", ALL)
def test_checkpoint_round_trip(algorithm: str, small, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_checkpoint_round_trip(cfg, data, tmp_path / "c.pt")


@pytest.mark.parametrize("algorithm", ALL)
def test_what_leaves_the_client(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_uploads(cfg, data)


@pytest.mark.parametrize("algorithm", ALL)
def test_local_update_runs_in_a_fresh_worker(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_worker_safety(cfg, data)


@pytest.mark.parametrize("algorithm", ALL)
def test_declared_reports_are_measured(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_reports(cfg, data)


@pytest.mark.parametrize("algorithm", ALL)
def test_evaluation_leaves_training_unchanged(algorithm: str, small) -> None:  # type: ignore[no-untyped-def]
    cfg, data = small(algorithm)
    contract.check_evaluation_is_passive(cfg, data)
