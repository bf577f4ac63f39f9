"""MLflow writes off Tune's event loop: a bounded queue drained by one background thread.

The sweep driver's callback (sweeps.tune_tracking) runs on Tune's event loop; a synchronous
``log_batch`` per reported result stalls the loop for every trial as the store slows (a busy
PostgreSQL server, a remote tracking server). The callback enqueues instead, and this writer:

- keeps one FIFO queue, bounded: ``put`` blocks when it is full and never drops a write;
- merges consecutive ``log_batch`` writes of one run into one call, within MLflow's limits
  (1000 metrics, 100 params, 100 tags, 1000 entries a call);
- relies on timestamps stamped by the caller at enqueue time, so a batch retried after a
  failure that reached the store carries the same rows (MLflow keeps one row per key, value,
  timestamp and step);
- retries a failed call with exponential backoff (``retries`` times), then keeps the error and
  raises it from the next ``flush``/``close``/``put``: a write is never silently lost;
- runs other calls (``set_terminated``, ``log_artifact``, ``update_run``) in queue order, so a
  run is closed only after its metrics are written;
- ``flush`` waits until everything enqueued so far is written: the callback flushes before it
  reads the store back, and the sweep flushes at its end, also after Ctrl-C.

A driver killed with SIGKILL loses what is still queued; resuming the sweep re-reports trials
from their checkpoints (Tune), and the exactly-once bookkeeping of runs lives in the sweep's
state file and the Optuna study, not in this queue.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackgroundWriter", "WriterError"]

#: MLflow's log_batch limits
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTRIES = 1000, 100, 100, 1000


class WriterError(RuntimeError):
    """A write failed after every retry."""


@dataclass
class _Batch:
    run_id: str
    metrics: list[Any] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)
    tags: list[Any] = field(default_factory=list)

    def fits(self, other: _Batch) -> bool:
        m, p, t = (
            len(self.metrics) + len(other.metrics),
            len(self.params) + len(other.params),
            len(self.tags) + len(other.tags),
        )
        return (
            other.run_id == self.run_id
            and m <= MAX_METRICS
            and p <= MAX_PARAMS
            and t <= MAX_TAGS
            and m + p + t <= MAX_ENTRIES
        )


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


_FLUSH = object()
_STOP = object()


class BackgroundWriter:
    """One thread that performs ``client``'s writes in the order they were enqueued.

    Args:
        client: an MLflow client (``log_batch`` and whatever ``call`` is given).
        maxsize: queued writes at most; ``put`` blocks beyond it.
        retries: attempts after the first before a write's error is kept.
        backoff: seconds before the first retry, doubled each time (at most 30 s).
    """

    def __init__(
        self, client: Any, *, maxsize: int = 10_000, retries: int = 6, backoff: float = 0.5
    ) -> None:
        self.client = client
        self.retries, self.backoff = retries, backoff
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._error: BaseException | None = None
        self.calls = 0  # store calls made (batches and other calls), for benchmarks and tests
        self.written = 0  # log_batch entries written
        self._thread = threading.Thread(target=self._run, name="mlflow-writer", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        # the process is ending; a kept error was the run's to raise earlier
        with contextlib.suppress(WriterError):
            self.close(timeout=120)

    # ------------------------------------------------------------------ producer side
    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[Any] = (),
        params: Sequence[Any] = (),
        tags: Sequence[Any] = (),
    ) -> None:
        """Enqueue a ``log_batch`` (its metrics carry their enqueue-time timestamps)."""
        self._raise_kept()
        for chunk in _split(_Batch(run_id, list(metrics), list(params), list(tags))):
            self._queue.put(chunk)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Enqueue any other store call, run after everything enqueued before it."""
        self._raise_kept()
        self._queue.put(_Call(fn, args, kwargs))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything enqueued so far is written; raise a kept error."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        if not done.wait(timeout):
            raise WriterError(f"MLflow writes not flushed after {timeout} s")
        self._raise_kept()

    def close(self, timeout: float | None = None) -> None:
        """Flush and stop the thread."""
        if not self._thread.is_alive():
            self._raise_kept()
            return
        try:
            self.flush(timeout)
        finally:
            self._queue.put(_STOP)
            self._thread.join(timeout)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def _raise_kept(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise WriterError(
                f"an MLflow write failed after {self.retries} retries: {error}"
            ) from error

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        held: Any = None
        while True:
            item = held if held is not None else self._queue.get()
            held = None
            if item is _STOP:
                return
            if isinstance(item, tuple) and item and item[0] is _FLUSH:
                item[1].set()
                continue
            if isinstance(item, _Batch):
                # merge what is waiting behind it, while it is the same run and fits
                while True:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(nxt, _Batch) and item.fits(nxt):
                        item.metrics += nxt.metrics
                        item.params += nxt.params
                        item.tags += nxt.tags
                        continue
                    held = nxt
                    break
                batch = item
                self._attempt(
                    lambda b=batch: self.client.log_batch(
                        b.run_id, metrics=b.metrics, params=b.params, tags=b.tags
                    )
                )
                self.written += len(batch.metrics) + len(batch.params) + len(batch.tags)
            else:
                self._attempt(lambda c=item: c.fn(*c.args, **c.kwargs))

    def _attempt(self, fn: Callable[[], Any]) -> None:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self.calls += 1
                fn()
                return
            except Exception as exc:  # noqa: BLE001 - any store failure is retried, then kept
                if attempt == self.retries:
                    self._error = exc
                    return
                time.sleep(delay)
                delay = min(30.0, delay * 2)


def _split(batch: _Batch) -> list[_Batch]:
    """A batch cut to MLflow's per-call limits."""
    out: list[_Batch] = []
    m, p, t = batch.metrics, batch.params, batch.tags
    while m or p or t or not out:
        take_p, take_t = p[:MAX_PARAMS], t[:MAX_TAGS]
        room = MAX_ENTRIES - len(take_p) - len(take_t)
        take_m = m[: min(MAX_METRICS, room)]
        out.append(_Batch(batch.run_id, take_m, take_p, take_t))
        m, p, t = m[len(take_m) :], p[len(take_p) :], t[len(take_t) :]
        if not (m or p or t):
            break
    return out
