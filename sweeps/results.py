"""Per-round metrics to Parquet, one row per round, for analysis without MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flcore.callbacks import Callback, RoundResult

__all__ = ["ParquetCallback"]


class ParquetCallback(Callback):
    """Collects every round's metrics and writes ``path`` (rewritten each ``flush_every`` rounds,
    so an interrupted run keeps what it measured)."""

    def __init__(
        self, path: str | Path, *, static: dict[str, Any] | None = None, flush_every: int = 10
    ) -> None:
        self.path = Path(path)
        self.static = dict(static or {})
        self.flush_every = flush_every
        self.rows: list[dict[str, Any]] = []

    def on_round_end(self, result: RoundResult) -> None:
        row = {**self.static, **result.metrics, "round": result.round}
        self.rows.append(row)
        if self.flush_every and len(self.rows) % self.flush_every == 0:
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
        return self.path
