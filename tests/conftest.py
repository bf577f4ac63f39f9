"""Shared fixtures: one real Fashion-MNIST data root per test session, tiny experiment configs."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: the records folder this process made (pytest_configure), removed at the end
_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, one torch thread per worker: three workers on 2 cores with torch's
    default (a thread per core) would oversubscribe them. Subprocesses keep their defaults.

    The benchmark scripts' records of ended runs (benchmarks/_runs.py) go to a temporary folder,
    never into the repository's benchmarks/records/, unless a test names its own; the process
    that made the folder removes it when the run ends (:func:`pytest_unconfigure`)."""
    if "FEDSWEEP_RECORDS" not in os.environ:
        _made.append(tempfile.mkdtemp(prefix="fedsweep-records-"))
        os.environ["FEDSWEEP_RECORDS"] = _made[-1]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root shared by the session; Fashion-MNIST is unpacked into it on first use."""
    root = Path(os.environ.get("FEDSWEEP_TEST_DATA_ROOT") or tmp_path_factory.mktemp("data"))
    os.environ["FEDSWEEP_DATA_ROOT"] = str(root)
    return root


@pytest.fixture(scope="session")
def fmnist(data_root: Path):
    """The real Fashion-MNIST splits (60k/10k), loaded once."""
    from flcore.data import load_dataset

    return load_dataset("fmnist", data_root)


@pytest.fixture
def tiny_config(data_root: Path, tmp_path: Path) -> dict[str, Any]:
    """A 2-round FedAvg run on a small real FMNIST subset: 4 clients x 100 samples."""
    return {
        "experiment": "tests",
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 100,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 50,
        "lr": 0.05,
        "eval_every": 1,
        "seed": 3,
        "workers": 1,
        "output_dir": str(tmp_path / "runs"),
        "partition": {"name": "dominant", "s": 20},
    }


#: the integration tests that take longest, run first so that they do not end a parallel run
#: (``make test``: ``pytest -n 3 --dist load --maxschedchunk 1``, which hands tests out one at a
#: time in this order) alone
_LONG_FIRST = (
    "test_multihost.py",
    "test_sweep_faults.py",
    "test_sweep.py",
    "test_tracking_outage.py",
    "test_console.py",
    "test_tracking_server.py",
    "test_attack_cli.py",
)


@pytest.fixture
def trial_steps(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Steps a sweep trainable in this process to its end: ``run(config, max_steps=N,
    **setup_kwargs)`` returns the trainable and its reports. No Ray runtime is needed: a
    report's node id is the only thing a step reads from one."""
    from types import SimpleNamespace

    from sweeps import trainable

    node = SimpleNamespace(get_node_id=lambda: "node")
    monkeypatch.setattr(trainable.ray, "get_runtime_context", lambda: node)

    def run(config: dict[str, Any], *, max_steps: int, **setup: Any) -> tuple[Any, list]:
        t = trainable.FLTrainable.__new__(trainable.FLTrainable)
        t.setup(config, **setup)
        reports: list[dict[str, Any]] = []
        while not (reports and reports[-1]["done"]):
            reports.append(t.step())
            assert len(reports) <= max_steps, "the trial did not end"
        return t, reports

    return run


@pytest.fixture
def fedsweep_run() -> Any:
    """``fedsweep run CONFIG --json`` in this process (the console script's start-up is the CLI
    tests'): ``run(raw_config, cwd)`` writes the config under ``cwd``, runs it there (MLflow in
    ``cwd``'s sqlite file, whatever the environment says) and returns the parsed summary; a
    failed run fails the test."""
    import json

    import yaml

    from tests.integration.sweep_helpers import cli_in_process

    def run(raw: dict[str, Any], cwd: Path) -> dict[str, Any]:
        cfg = cwd / "exp.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        out = cli_in_process(["run", str(cfg), "--json"], cwd, MLFLOW_DISABLE_TELEMETRY="true")
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests first (the longest files first), then the unit and contract tests, which
    fill the other workers meanwhile; the order is the same in every xdist worker."""

    def rank(item: pytest.Item) -> tuple[int, int]:
        if "integration" not in item.path.parts:
            return (2, 0)
        name = item.path.name
        return (0, _LONG_FIRST.index(name)) if name in _LONG_FIRST else (1, 0)

    items.sort(key=rank)  # stable: each file keeps its own order
