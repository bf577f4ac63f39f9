"""Per-round metrics to Parquet, one row per round, for analysis without MLflow."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flcore.callbacks import Callback, RoundResult

__all__ = ["ParquetCallback"]


class ParquetCallback(Callback):
    """Collects every round's metrics and writes ``path``, so that an interrupted run keeps
    what it measured: at the run's end (and on a failure, by the caller), and during the run
    once ``flush_every`` rounds have passed since the last write and a pause since it of at
    least ``min_seconds`` and at least the last write's time over ``max_share``.

    Parquet cannot be appended to, so each write rewrites the whole file, and a write's time
    grows with the run: writing every 10 rounds made a 10,000-step walk's bookkeeping grow
    4.2-fold from its first tenth to its last (benchmarks/walk_overhead.py, session 48). The
    pause keeps the rewrites under ``max_share`` of the run's time however long it runs
    (benchmarks/parquet_overhead.py); a run killed outright loses the rounds since the last
    write (its checkpoint, if any, has them)."""

    def __init__(
        self,
        path: str | Path,
        *,
        static: dict[str, Any] | None = None,
        flush_every: int = 10,
        min_seconds: float = 30.0,
        max_share: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.static = dict(static or {})
        self.flush_every = flush_every
        self.min_seconds = min_seconds
        self.max_share = max_share
        self._pause = min_seconds
        self._clock = clock
        self._written_rows = 0
        self._written_at = clock()
        self.rows: list[dict[str, Any]] = []

    def on_round_end(self, result: RoundResult) -> None:
        row = {**self.static, **result.metrics, "round": result.round}
        self.rows.append(row)
        if (
            self.flush_every
            and len(self.rows) - self._written_rows >= self.flush_every
            and self._clock() - self._written_at >= self._pause
        ):
            self.write()

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        self.write()

    def write(self) -> Path:
        start = self._clock()
        self._dump()
        end = self._clock()
        self._written_rows, self._written_at = len(self.rows), end
        self._pause = max(self.min_seconds, (end - start) / self.max_share)
        return self.path

    def _dump(self) -> None:
        import pandas as pd

        self.path.parent.mkdir(parents=True, exist_ok=True)
        df = pd.DataFrame(self.rows)
        if "round" in df:
            df["round"] = df["round"].astype("int64")
        tmp = self.path.with_suffix(".parquet.tmp")
        df.to_parquet(tmp, index=False)
        tmp.replace(self.path)
