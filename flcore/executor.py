"""Where clients' local updates run: in the engine's process, or in a pool of spawned workers.

On a CPU, batches of 50 keep two torch threads busy only 1.4x better than one, while two
one-thread processes reach about 1.9x (ENVIRONMENT.md), so the pool runs one thread per worker.
The dataset's uint8 tensors are moved to shared memory once and handed to the workers when they
start; payloads and uploads travel through torch's multiprocessing reductions (shared memory
file descriptors), not pickled bytes. ``imap`` returns results in submission (client-id) order,
so aggregation order, and with it every bit of the result, does not depend on the worker count.
In-process updates also run with one torch thread for the same reason.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as tmp

from flcore.algorithms.base import ALGORITHMS, Algorithm, ClientData, ClientResult, ClientTask
from flcore.data import FederatedData

__all__ = [
    "AlgorithmFactory",
    "InProcessExecutor",
    "PoolExecutor",
    "make_executor",
    "client_generator",
]


@dataclass(frozen=True)
class AlgorithmFactory:
    """Picklable constructor arguments of an algorithm, so workers can build their own copy."""

    name: str
    kwargs: dict[str, Any]

    def __call__(self) -> Algorithm:
        return ALGORITHMS.get(self.name)(**self.kwargs)


def client_generator(seed: int, round: int, client_id: int) -> torch.Generator:
    """The client's own RNG stream for one round: independent of worker layout and order."""
    words = np.random.SeedSequence([seed, 0xC1, round, client_id]).generate_state(2, np.uint32)
    g = torch.Generator()
    g.manual_seed(int(words[0]) << 32 | int(words[1]))
    return g


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_task(algorithm: Algorithm, fed: FederatedData, task: ClientTask) -> ClientResult:
    cid = task.client_id
    start = time.perf_counter()
    data = ClientData(cid, fed.client_train(cid), fed.client_test(cid), fed.info)
    result = algorithm.local_update(data, task, client_generator(task.seed, task.round, cid))
    result.metrics["client_seconds"] = time.perf_counter() - start
    return result


class InProcessExecutor:
    """Runs client updates one after another in this process (``workers=1``, or a GPU)."""

    def __init__(self, factory: AlgorithmFactory, fed: FederatedData) -> None:
        self._algorithm = factory()
        self._fed = fed

    def map(self, tasks: Iterable[ClientTask]) -> Iterator[ClientResult]:
        for task in tasks:
            with _one_thread():
                result = _run_task(self._algorithm, self._fed, task)
            yield result

    def close(self) -> None:
        pass


# Worker-process globals, set once by the pool initializer.
_W_ALGORITHM: Algorithm | None = None
_W_FED: FederatedData | None = None


def _init_worker(factory: AlgorithmFactory, fed: FederatedData) -> None:
    global _W_ALGORITHM, _W_FED
    torch.set_num_threads(1)
    _W_ALGORITHM, _W_FED = factory(), fed


def _work(task: ClientTask) -> ClientResult:
    assert _W_ALGORITHM is not None and _W_FED is not None, "worker was not initialised"
    return _run_task(_W_ALGORITHM, _W_FED, task)


def _share_memory(fed: FederatedData) -> None:
    # Workers map these pages instead of receiving pickled copies of the dataset.
    for split in (fed.splits.train, fed.splits.test):
        split.images.share_memory_()
        split.labels.share_memory_()


class PoolExecutor:
    """A pool of ``workers`` spawned processes, one torch thread each."""

    def __init__(self, factory: AlgorithmFactory, fed: FederatedData, workers: int) -> None:
        _share_memory(fed)
        ctx = tmp.get_context("spawn")
        self._pool = ctx.Pool(workers, initializer=_init_worker, initargs=(factory, fed))

    def map(self, tasks: Iterable[ClientTask]) -> Iterator[ClientResult]:
        yield from self._pool.imap(_work, tasks, chunksize=1)

    def close(self) -> None:
        self._pool.close()
        self._pool.join()

    def terminate(self) -> None:
        self._pool.terminate()
        self._pool.join()


def make_executor(
    factory: AlgorithmFactory, fed: FederatedData, workers: int, device: str
) -> InProcessExecutor | PoolExecutor:
    """One worker (or any accelerator) runs in-process; otherwise a spawned pool."""
    if workers <= 1 or device != "cpu":
        return InProcessExecutor(factory, fed)
    return PoolExecutor(factory, fed, workers)
