"""The pool workers' allocator setting (flcore.executor.tune_malloc): without it, a process that
never freed a large buffer of its own (a worker handed its dataset in shared memory) maps and
unmaps every ~2 MB activation of a training step and faults its pages in again each time.

How many pages a default process faults per step depends on where its buffers happen to lie
(measured in fresh processes on the same machine: a mean of 0 to 1,450 per step, 600-1,200 in
most), so the default side is checked in up to three fresh processes; a tuned process faults
0 pages in a typical step (the median), with a rare one-off heap growth of ~150 pages."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

glibc = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt thresholds are glibc's",
)


def faults_per_step(x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """Minor page faults in each of SGD steps 6-25 of the FMNIST CNN on (x, y)."""
    import resource

    from flcore.models import build_model

    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    faults = []
    for step in range(25):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step >= 5:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
    return faults


# the same steps in a fresh process (its allocator untouched by this one's history)
FAULTS = """
import json, sys, torch
torch.set_num_threads(1)
from flcore.executor import tune_malloc
from tests.unit.test_executor_malloc import faults_per_step
if sys.argv[1] == "tuned":
    assert tune_malloc()
print(json.dumps(faults_per_step(*torch.load(sys.argv[2]))))
"""


def _faults_per_step(mode: str, batch: Path) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode, str(batch)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parents[2],  # the repository root: ``tests`` imports from there
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
@glibc
def test_tuned_allocator_reuses_activation_buffers(fmnist, tmp_path: Path) -> None:
    from flcore.data import normalize

    batch = tmp_path / "batch.pt"
    torch.save((normalize(fmnist.train.images[:50], fmnist.info), fmnist.train.labels[:50]), batch)
    tuned = _faults_per_step("tuned", batch)
    assert statistics.median(tuned) <= 10, tuned
    defaults = []
    for _ in range(3):
        defaults.append(statistics.mean(_faults_per_step("default", batch)))
        if defaults[-1] > 100:
            break
    else:
        pytest.fail(f"glibc's defaults no longer fault per step ({defaults}): recheck the tuning")


def _worker_faults_per_step() -> float:
    """Runs in a pool worker: page faults per training step on client 0's real records."""
    from flcore import executor
    from flcore.data import normalize

    fed = executor._W_FED  # noqa: SLF001 (the worker's dataset, received in shared memory)
    assert fed is not None
    data = fed.client_train(0)
    return statistics.median(
        faults_per_step(normalize(data.images[:50], fed.info), data.labels[:50])
    )


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
@glibc
def test_pool_workers_reuse_activation_buffers(tiny_config) -> None:
    """In the engine's own workers (dataset in shared memory), steps do not fault."""
    from flcore import executor
    from flcore.config import validate_config
    from flcore.experiment import build_data, build_engine

    cfg = validate_config(tiny_config | {"workers": 2})
    fed = build_data(cfg)
    engine = build_engine(cfg, data=fed)
    pool = executor.PoolExecutor(engine.factory, fed, 2)
    try:
        faults = [pool._pool.apply(_worker_faults_per_step) for _ in range(2)]  # noqa: SLF001
    finally:
        pool.close()
    assert all(f <= 10 for f in faults), faults  # without the tuning: 600 here
