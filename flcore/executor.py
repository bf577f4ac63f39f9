"""Where clients' local updates run: in the engine's process, or in a pool of spawned workers.

On a CPU, batches of 50 keep two torch threads busy only 1.4x better than one, while two
one-thread processes reach about 1.9x (ENVIRONMENT.md), so the pool runs one thread per worker.
The dataset's uint8 tensors are moved to shared memory once and handed to the workers when they
start; payloads and uploads travel through torch's multiprocessing reductions (shared memory
file descriptors), not pickled bytes. ``imap`` returns results in submission (client-id) order,
so aggregation order, and with it every bit of the result, does not depend on the worker count.
In-process updates also run with one torch thread for the same reason.

Each worker fixes glibc's allocation thresholds when it starts (:func:`tune_malloc`). A spawned
worker that gets its dataset through shared memory never frees a large buffer of its own, so
glibc keeps its default 128 KiB mmap threshold and returns the heap's top to the kernel at every
free: each activation of a batch of 50 (about 2 MB) was mapped, faulted in page by page and
unmapped at every step, 55,000 page faults per FMNIST client, which made the engine's clients
13% slower than the same code in a process that had loaded its own data, and the engine 8-12%
slower than Flower's simulation per round (BENCHMARKS.md).

Stopping. Each worker leaves the run's process group when it starts (POSIX), so a signal meant
for the whole group (Ctrl-C in a terminal, ``kill -- -<pgid>`` from a queue) reaches only the
engine's process, which decides: a run under ``benchmarks/_runs.py`` ends the round under way
on SIGTERM and checkpoints it (before, the workers died of the signal and the run waited
forever for their results); elsewhere Ctrl-C raises KeyboardInterrupt and the engine terminates
its pool. Workers still go with the engine: they exit when it terminates the pool, and within
seconds when it dies outright (their task pipe reaches end of file; measured: 2.9 s). A worker
that dies in a round all the same (the kernel's OOM killer, a signal sent to its own pid)
fails the round with :class:`WorkerLostError` within a second: ``multiprocessing.Pool`` would
replace it and wait forever for the task it held. The workers keep their sockets in the engine's
temp folder, which the engine removes when it exits (a SIGTERM-stopped run exits normally),
so a stopped run leaves nothing in /tmp.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing.util as mp_util
import os
import platform
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as tmp

from flcore.algorithms.base import ALGORITHMS, Algorithm, ClientData, ClientResult, ClientTask
from flcore.data import FederatedData
from flcore.errors import ConfigError

__all__ = [
    "AlgorithmFactory",
    "InProcessExecutor",
    "PoolExecutor",
    "make_executor",
    "resolve_executor",
    "EXECUTORS",
    "client_generator",
    "WorkerStartError",
    "WorkerLostError",
    "one_torch_thread",
    "tune_malloc",
]

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: allocations below this come from the heap and are reused (glibc's largest allowed value on
#: 64-bit); above it (HyperFL's 60 MB hypernetwork heads) each is its own mapping, as before
MMAP_THRESHOLD = 32 * 2**20
#: free memory the heap keeps at its top instead of handing it back to the kernel
TRIM_THRESHOLD = 256 * 2**20


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
def one_torch_thread() -> Iterator[None]:
    """Run the block with one torch thread (bitwise repeatable, whatever the machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tune_malloc() -> bool:
    """Keep this process's freed buffers of up to 32 MiB for reuse instead of unmapping them
    (glibc's ``mallopt``: fixed mmap and trim thresholds in place of the dynamic ones, which
    only rise after the process frees a large mapped buffer). Returns False, changing nothing,
    where the C library is not glibc. The arithmetic is untouched: only where memory comes
    from changes."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def client_data(fed: FederatedData, cid: int) -> ClientData:
    """Client ``cid``'s data as ``local_update`` receives it."""
    return ClientData(
        cid,
        fed.client_train(cid),
        fed.client_test(cid),
        fed.info,
        fed.client_val(cid),
        public=fed.public_set(),
    )


def _run_task(algorithm: Algorithm, fed: FederatedData, task: ClientTask) -> ClientResult:
    cid = task.client_id
    start = time.perf_counter()
    data = client_data(fed, cid)
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
            with one_torch_thread():
                result = _run_task(self._algorithm, self._fed, task)
            yield result

    def close(self) -> None:
        pass


# Worker-process globals, set once by the pool initializer.
_W_ALGORITHM: Algorithm | None = None
_W_FED: FederatedData | None = None


def _init_worker(factory: AlgorithmFactory, inbox: Any, ready: Any) -> None:
    global _W_ALGORITHM, _W_FED
    if hasattr(os, "setpgid"):  # out of the run's group: group-wide signals are the engine's
        os.setpgid(0, 0)
    torch.set_num_threads(1)
    tune_malloc()
    _W_FED = inbox.get()
    _W_ALGORITHM = factory()
    ready.put(os.getpid())


def _work(task: ClientTask) -> ClientResult:
    assert _W_ALGORITHM is not None and _W_FED is not None, "worker was not initialised"
    return _run_task(_W_ALGORITHM, _W_FED, task)


def _share_memory(fed: FederatedData) -> None:
    # Workers map these pages instead of receiving pickled copies of the dataset.
    for split in (fed.splits.train, fed.splits.test):
        split.images.share_memory_()
        split.labels.share_memory_()


class WorkerStartError(RuntimeError):
    """The pool's worker processes died before they were ready."""


class WorkerLostError(RuntimeError):
    """A worker process of the pool died after it was ready (its round's results are lost)."""


#: seconds between checks that every worker is alive while a round waits for results
_LIVENESS_POLL = 1.0


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class PoolExecutor:
    """A pool of ``workers`` spawned processes, one torch thread each.

    The constructor returns once every worker has built its algorithm. A worker that dies while
    starting (most often: the script that started the run has no ``if __name__ ==
    "__main__":`` guard, so each spawned child re-runs it) raises :class:`WorkerStartError`
    instead of leaving the run waiting forever while the pool respawns dying workers.
    """

    def __init__(
        self,
        factory: AlgorithmFactory,
        fed: FederatedData,
        workers: int,
        *,
        start_timeout: float = 600.0,
    ) -> None:
        _share_memory(fed)
        ctx = tmp.get_context("spawn")
        ready = ctx.SimpleQueue()
        # The dataset goes through a queue, not the pool's initargs: a spawned child is sent its
        # initargs through a pipe that it reads only after re-importing the main module, and
        # CPython's parent keeps that pipe's read end open while writing, so initargs larger
        # than the pipe's buffer would block this process forever if the child died first.
        inbox = ctx.Queue()
        # The workers share this process's multiprocessing temp folder (each Process copies
        # its name when created): torch passes tensors between processes through sockets made
        # there, and a worker ended by terminate() (SIGTERM) never removes a folder of its own,
        # which left one /tmp/pymp-* behind each stopped run. This process removes the shared
        # one at its exit.
        mp_util.get_temp_dir()
        self._pool = ctx.Pool(workers, initializer=_init_worker, initargs=(factory, inbox, ready))
        for _ in range(workers):
            inbox.put(fed)
        try:
            self._wait_ready(ready, workers, start_timeout)
        except BaseException:
            inbox.cancel_join_thread()  # nobody will read what is left: do not wait at exit
            self.terminate()
            raise
        # Open while the pool lives: the pool pickles it into any worker it starts in place of a
        # dead one, and a closed queue fails that, which ends the pool's worker-handler thread
        # and leaves terminate() waiting forever for it.
        self._inbox = inbox
        self._workers = list(self._pool._pool)  # noqa: SLF001  (every one ready)

    def _wait_ready(self, ready: Any, workers: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        started: set[int] = set()
        seen: dict[
            int, Any
        ] = {}  # every worker process ever in the pool (the pool drops dead ones)
        while len(started) < workers:
            while not ready.empty():
                started.add(ready.get())
            if len(started) >= workers:
                return
            # Pool replaces a dead worker with a new one; any nonzero exit before all are
            # ready means the workers cannot start.
            seen.update((id(p), p) for p in self._pool._pool)  # noqa: SLF001
            dead = [p for p in seen.values() if p.exitcode not in (None, 0)]
            if dead:
                raise WorkerStartError(
                    f"{len(dead)} client worker process(es) exited with code "
                    f"{dead[0].exitcode} while starting. If a script starts this run, put its "
                    'top-level code under `if __name__ == "__main__":` (workers are spawned '
                    "and re-import the main module); or set workers: 1 to train in-process."
                )
            if time.monotonic() > deadline:
                raise WorkerStartError(f"client workers not ready after {timeout:.0f} s")
            time.sleep(0.05)

    def map(self, tasks: Iterable[ClientTask]) -> Iterator[ClientResult]:
        self._check_workers()
        results = self._pool.imap(_work, tasks, chunksize=1)
        while True:
            try:
                result = results.next(timeout=_LIVENESS_POLL)
            except StopIteration:
                return
            except tmp.TimeoutError:
                self._check_workers()
                continue
            yield result

    def _check_workers(self) -> None:
        """Raise :class:`WorkerLostError` if a worker died: the pool would start a replacement
        (which waits for a dataset nobody sends) and never return the task the dead one held."""
        dead = [p for p in self._workers if p.exitcode is not None]
        if dead:
            raise WorkerLostError(
                f"{len(dead)} of {len(self._workers)} client worker process(es) died during "
                f"the run (pid {dead[0].pid}, {_exit_reason(dead[0].exitcode)}); the round's "
                "results are lost. SIGKILL is most often the kernel's out-of-memory killer: "
                "lower workers, or set workers: 1 to train in-process."
            )

    def close(self) -> None:
        self._pool.close()
        self._pool.join()
        self._inbox.close()

    def terminate(self) -> None:
        self._pool.terminate()
        self._pool.join()
        if hasattr(self, "_inbox"):  # not yet there when the workers fail to start
            self._inbox.cancel_join_thread()
            self._inbox.close()


#: the ``executor`` config values
EXECUTORS = ("auto", "loop", "vectorized")


def resolve_executor(kind: str, algorithm: Algorithm, device: str) -> str:
    """``loop`` or ``vectorized``: ``auto`` picks the vectorized executor on CUDA where the
    algorithm allows it and the per-client loop otherwise (so CPU runs stay bitwise
    repeatable); ``vectorized`` for an algorithm that cannot be vectorized is a ConfigError
    naming why, raised before any round."""
    if kind not in EXECUTORS:
        raise ConfigError("executor", f"must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    if kind == "loop" or (kind == "auto" and torch.device(device).type != "cuda"):
        return "loop"
    reason = algorithm.vector_unsupported()
    if kind == "vectorized":
        if reason is not None:
            raise ConfigError(
                "executor",
                f"'vectorized' cannot run {algorithm.name}: {reason} (use executor: loop or auto)",
            )
        return "vectorized"
    return "vectorized" if reason is None and torch.device(device).type == "cuda" else "loop"


def make_executor(
    factory: AlgorithmFactory,
    fed: FederatedData,
    workers: int,
    device: str,
    kind: str = "loop",
    chunk: int | None = None,
) -> Any:
    """``kind`` (resolved: ``loop`` or ``vectorized``) -> the executor. The loop runs
    in-process with one worker or on any accelerator, else in a spawned pool."""
    if kind == "vectorized":
        from flcore.vectorized import VectorizedExecutor

        return VectorizedExecutor(factory, fed, chunk=chunk)
    if workers <= 1 or device != "cpu":
        return InProcessExecutor(factory, fed)
    return PoolExecutor(factory, fed, workers)
