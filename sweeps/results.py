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
    once ``flush_every`` rounds and at least ``min_seconds`` have passed since the last write.

    Parquet cannot be appended to, so each write rewrites the whole file: writing every 10
    rounds made a 10,000-step walk's bookkeeping grow 4.2-fold from its first tenth to its last
    (benchmarks/walk_overhead.py). With ``min_seconds`` the rewrites cost at most one file's
    writing time per ``min_seconds`` of training, however long the run; a run killed outright
    loses at most the rounds of the last ``min_seconds`` (its checkpoint, if any, has them)."""

    def __init__(
        self,
        path: str | Path,
        *,
        static: dict[str, Any] | None = None,
        flush_every: int = 10,
        min_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.static = dict(static or {})
        self.flush_every = flush_every
        self.min_seconds = min_seconds
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
            and self._clock() - self._written_at >= self.min_seconds
        ):
            self.write()

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        self.write()

    def write(self) -> Path:
        import pandas as pd

        self.path.parent.mkdir(parents=True, exist_ok=True)
        df = pd.DataFrame(self.rows)
        if "round" in df:
            df["round"] = df["round"].astype("int64")
        tmp = self.path.with_suffix(".parquet.tmp")
        df.to_parquet(tmp, index=False)
        tmp.replace(self.path)
        self._written_rows, self._written_at = len(self.rows), self._clock()
        return self.path
