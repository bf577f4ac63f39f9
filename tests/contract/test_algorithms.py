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
    cache: dict[bool, object] = {}

    def setup(algorithm: str):  # type: ignore[no-untyped-def]
        """The algorithm's contract config and its data (built once per data layout)."""
        cfg = _cfg(raw, algorithm)
        aware = ALGORITHMS.get(algorithm).capacity_aware
        if aware not in cache:
            cache[aware] = build_data(cfg)
        return cfg, cache[aware]

    return setup


ALL = ALGORITHMS.names()

#: what an algorithm that cannot run without DP gets in these contract runs
PRIVACY = {
    "dpsgd": {"mechanism": "dpsgd", "noise_multiplier": 1.0, "clip": 1.0},
    "client": {"mechanism": "client", "noise_multiplier": 0.5, "clip": 1.0},
}


#: what an algorithm that needs another network gets (HyperFL-LPM: a backbone with adapters)
MODEL = {"hyperfl_lpm": {"model": "resnet18_adapter", "model_params": {"tiny": True}}}


#: what a capacity-aware algorithm gets: three clients of widths 1, 1/2 and 1/4 on Pa3dFL's
#: width-scalable CNN, each with its own validation records
CAPACITY = {
    "model": "pa3dfl_cnn_fmnist",
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625]},
    "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
}


def _cfg(raw: dict, algorithm: str):  # type: ignore[no-untyped-def]
    cls = ALGORITHMS.get(algorithm)
    needs = cls.requires_privacy
    extra = {"privacy": PRIVACY[needs]} if needs else {}
    if needs and cls.side_releases:  # FedHKD's class statistics are protected with the model
        extra["privacy"] = extra["privacy"] | {"protect": "knowledge+model"}
    extra |= CAPACITY if cls.capacity_aware else {}
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

