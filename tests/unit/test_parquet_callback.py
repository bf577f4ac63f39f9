"""The per-round Parquet file: every round in it at the end, and during the run rewritten only
once ``flush_every`` rounds and ``min_seconds`` have passed (the file cannot be appended to)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from flcore.callbacks import RoundResult
from sweeps.results import ParquetCallback


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _round(r: int) -> RoundResult:
    return RoundResult(
        round=r,
        client_ids=(0,),
        metrics={"accuracy": r / 100, "global_accuracy": None},
        evaluated=True,
    )


def test_rewrites_wait_for_both_rounds_and_seconds_and_the_end_has_every_round(
    tmp_path: Path,
) -> None:
    clock = _Clock()
    path = tmp_path / "m.parquet"
    cb = ParquetCallback(path, static={"seed": 3}, flush_every=10, min_seconds=30, clock=clock)
    for r in range(1, 11):  # 10 rounds in 10 s: not yet
        clock.now += 1
        cb.on_round_end(_round(r))
    assert not path.exists()
    for r in range(11, 31):  # 30 s passed at round 30, and 10+ rounds since the last write
        clock.now += 1
        cb.on_round_end(_round(r))
        assert path.exists() == (r >= 30), r
    assert pd.read_parquet(path)["round"].tolist() == list(range(1, 31))
    clock.now += 100  # a slow stretch: the next write still waits for 10 more rounds
    for r in range(31, 40):
        cb.on_round_end(_round(r))
    assert len(pd.read_parquet(path)) == 30
    cb.on_round_end(_round(40))
    assert len(pd.read_parquet(path)) == 40
    cb.on_round_end(_round(41))
    cb.on_run_end({})
    df = pd.read_parquet(path)
    assert df["round"].tolist() == list(range(1, 42)) and df["round"].dtype == "int64"
    assert (df["seed"] == 3).all() and df["global_accuracy"].isna().all()
    assert df["accuracy"].iloc[-1] == 0.41


def test_a_slow_write_lengthens_the_pause_to_keep_the_rewrites_under_max_share(
    tmp_path: Path,
) -> None:
    clock = _Clock()

    class Slow(ParquetCallback):
        def _dump(self) -> None:  # a write of 2 s (a long run's file)
            super()._dump()
            clock.now += 2.0

    cb = Slow(tmp_path / "m.parquet", flush_every=1, min_seconds=30, max_share=0.01, clock=clock)
    cb.on_round_end(_round(1))
    assert cb._written_rows == 0
    clock.now += 30
    cb.on_round_end(_round(2))
    assert cb._written_rows == 2  # written; its 2 s make the next pause 200 s
    for r in range(3, 200):  # one second a round: 197 s
        clock.now += 1
        cb.on_round_end(_round(r))
    assert cb._written_rows == 2
    clock.now += 3
    cb.on_round_end(_round(200))
    assert cb._written_rows == 200
