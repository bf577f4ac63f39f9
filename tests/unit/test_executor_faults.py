"""flcore/executor.py's pool of client workers when one dies: the round fails at once with an
error naming why (``multiprocessing.Pool`` alone replaces the worker and waits forever for the
task it held), and no worker process is left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading

import pytest

from flcore.callbacks import Callback
from flcore.config import validate_config
from flcore.executor import WorkerLostError
from flcore.experiment import build_engine


def _pool_workers() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if "PoolWorker" in p.name]


class _KillAWorkerInRound2(Callback):
    """At round 1's end, SIGKILLs one client worker half a second into round 2 (as the
    kernel's out-of-memory killer would)."""

    def __init__(self) -> None:
        self.victim: int | None = None

    def on_round_end(self, result) -> None:  # noqa: ANN001
        if result.round == 1:
            self.victim = _pool_workers()[0].pid
            threading.Timer(0.5, os.kill, (self.victim, signal.SIGKILL)).start()


@pytest.mark.timeout(300)  # the bug this guards against is a hang
def test_a_worker_killed_during_a_round_fails_the_round_with_a_clear_error(
    tiny_config: dict,
) -> None:
    # 4 clients on 2 workers, 40 local epochs each: round 2 runs for seconds, so the kill lands
    # in it (while a worker holds a task, or between two: either way the round must fail)
    cfg = validate_config(tiny_config | {"workers": 2, "rounds": 3, "local_epochs": 40})
    killer = _KillAWorkerInRound2()
    engine = build_engine(cfg, callbacks=[killer])
    with pytest.raises(WorkerLostError, match=r"killed by SIGKILL") as err:
        engine.run()
    assert f"pid {killer.victim}," in str(err.value) and "workers: 1" in str(err.value)
    assert engine.round == 1  # round 2 never completed
    assert not _pool_workers()  # the pool was terminated, its replacement worker included
