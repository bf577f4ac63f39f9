"""The background MLflow writer against a real sqlite MLflow store: order, batching, a bounded
queue that blocks and never drops, retries that duplicate nothing, errors that surface."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sweeps.mlflow_writer import BackgroundWriter, WriterError


class Wrapped:
    """A real MLflow client whose log_batch can be slowed or made to fail ``fail`` times,
    optionally after the write reached the store (a connection lost on the way back)."""

    def __init__(
        self, client: Any, *, delay: float = 0.0, fail: int = 0, after_write: bool = False
    ) -> None:
        self.client, self.delay, self.fail, self.after_write = client, delay, fail, after_write
        self.batches = 0

    def log_batch(self, run_id: str, metrics=(), params=(), tags=()) -> None:  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        if self.fail > 0:
            self.fail -= 1
            if self.after_write:
                self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
            raise ConnectionError("the tracking server went away")
        self.batches += 1
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("w")).info.run_id
    return client, run_id


def _metrics(start: int, n: int, key: str = "m") -> list[Any]:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key, float(i), now, i) for i in range(start, start + n)]


def test_writes_arrive_in_order_merged_into_few_calls(store) -> None:  # type: ignore[no-untyped-def]
    from mlflow.entities import RunTag

    client, run_id = store
    slow = Wrapped(client, delay=0.3)  # the first call is slow: the rest queue up behind it
    writer = BackgroundWriter(slow)
    for i in range(50):
        writer.log_batch(run_id, metrics=_metrics(20 * i, 20))
    writer.log_batch(run_id, tags=[RunTag("status", "done")])
    writer.call(client.set_terminated, run_id, status="FINISHED")
    writer.close()
    assert [m.step for m in client.get_metric_history(run_id, "m")] == list(range(1000))
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "done"
    assert slow.batches <= 4, slow.batches  # 51 enqueued writes, merged up to 1000 entries
    assert writer.written == 1001


def test_a_full_queue_blocks_the_producer_and_drops_nothing(store) -> None:  # type: ignore[no-untyped-def]
    client, run_id = store
    writer = BackgroundWriter(Wrapped(client, delay=0.2), maxsize=2)
    began = time.perf_counter()
    for i in range(6):
        writer.log_batch(run_id, metrics=_metrics(i, 1))
    blocked = time.perf_counter() - began
    writer.close()
    assert blocked >= 0.2  # the producer waited for room at least once
    assert len(client.get_metric_history(run_id, "m")) == 6


def test_a_retried_batch_that_had_reached_the_store_is_not_duplicated(store) -> None:  # type: ignore[no-untyped-def]
    client, run_id = store
    flaky = Wrapped(client, fail=2, after_write=True)
    writer = BackgroundWriter(flaky, backoff=0.01)
    writer.log_batch(run_id, metrics=_metrics(0, 30))
    writer.flush()
    assert [m.step for m in client.get_metric_history(run_id, "m")] == list(range(30))
    writer.close()


def test_a_write_that_keeps_failing_is_raised_not_lost(store) -> None:  # type: ignore[no-untyped-def]
    client, run_id = store
    writer = BackgroundWriter(Wrapped(client, fail=100), retries=2, backoff=0.01)
    writer.log_batch(run_id, metrics=_metrics(0, 3))
    with pytest.raises(WriterError, match="failed after 2 retries: the tracking server went away"):
        writer.flush()
    writer.close()


def test_flush_waits_for_writes_enqueued_from_other_threads(store) -> None:  # type: ignore[no-untyped-def]
    client, run_id = store
    writer = BackgroundWriter(Wrapped(client, delay=0.01))
    threads = [
        threading.Thread(
            target=lambda k=k: writer.log_batch(run_id, metrics=_metrics(0, 10, key=f"t{k}"))
        )
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.flush()
    assert all(len(client.get_metric_history(run_id, f"t{k}")) == 10 for k in range(4))
    writer.close()


_SIGINT_SCRIPT = """
import signal, sys, time
from pathlib import Path
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from sweeps.fast_sqlite import fast_commits
from sweeps.mlflow_writer import BackgroundWriter

# Ctrl-C raises KeyboardInterrupt even where the parent ignores SIGINT (a job started in the
# background with &, whose children inherit the ignored disposition)
signal.signal(signal.SIGINT, signal.default_int_handler)
uri, runs = sys.argv[1], sys.argv[2:]
fast_commits(Path(uri[len("sqlite:///"):]))  # as the driver's store (run_sweep)


class Slow:  # a real client, 5 ms slower per batch: the queue is still full at the SIGINT
    def __init__(self, client):
        self.client = client

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        time.sleep(0.005)
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

    def __getattr__(self, name):
        return getattr(self.client, name)


writer = BackgroundWriter(Slow(MlflowClient(tracking_uri=uri)))
now = int(time.time() * 1000)
for i in range(120):  # alternating runs: no two writes merge, 120 batches
    writer.log_batch(runs[i % 2], metrics=[Metric("m", float(i), now, i)])
print("queued", writer.pending, flush=True)
time.sleep(120)
"""


def test_sigint_flushes_every_queued_write(tmp_path: Path) -> None:
    """Ctrl-C on a driver with writes queued: every one reaches the store before it exits."""
    import os
    import signal
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("sigint")
    runs = [client.create_run(exp).info.run_id for _ in range(2)]
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_SCRIPT, uri, *runs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": root, "MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    # 120 commits after the SIGINT: seconds alone, far more under a loaded CI's disk
    _, err = proc.communicate(timeout=300)
    assert line.startswith("queued"), err[-2000:]
    assert int(line.split()[1]) > 60  # most writes were still queued at the SIGINT
    assert "KeyboardInterrupt" in err  # it was interrupted, not finished
    logged = sorted(int(m.value) for r in runs for m in client.get_metric_history(r, "m"))
    assert logged == list(range(120))
