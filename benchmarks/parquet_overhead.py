"""What the per-round Parquet file costs over a long run: the rewrite every 10 rounds (the
policy before session 49) against ``sweeps.results.ParquetCallback``'s default (once 10 rounds
have passed and a pause of at least 30 s and 100 times the last write's time).

Parquet cannot be appended to, so every write rewrites the whole file, and a write every 10
rounds grows with the run's length (benchmarks/walk_overhead.py measured 4.2x from the first
tenth of a 10,000-step walk to its last, session 48). This replays a real run's per-round
metrics (``--metrics``: the ``metrics.jsonl`` of any benchmark run, e.g. a
``reproduce_lodmeta.py`` run's folder), cycled to ``--steps`` rounds, through both policies in
one process. The training is not rerun: a clock advanced by each row's recorded
``round_seconds`` plus the callback's own real time stands in for the run's clock, so each
policy writes when it would in that run; the callback's own wall time is measured. Prints JSON:
per policy, the callback's seconds per step over the first and the last tenth of the steps, the
number of writes, the total, and that total as a share of the run (recorded training plus the
callback). ``--only-default`` skips the old policy (quadratic: slow past 10,000 steps). Needs
pandas and pyarrow (sweeps/).

    .venv/bin/python benchmarks/parquet_overhead.py \\
        --metrics ~/.cache/fedsweep-runs/lodmeta/regular-5shot-lodmeta-s0/metrics.jsonl \\
        --steps 10000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rows(path: Path, steps: int) -> list[dict[str, Any]]:
    recorded = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not recorded:
        raise SystemExit(f"error: {path} holds no rows")
    out = []
    for i in range(steps):
        row = dict(recorded[i % len(recorded)])
        row["round"] = i + 1
        out.append(row)
    return out


def measure(rows: list[dict[str, Any]], tmp: Path, **policy: Any) -> dict[str, Any]:
    from flcore.callbacks import RoundResult
    from sweeps.results import ParquetCallback

    # the run's clock: its recorded training time, plus the callback's own real time
    now, spent, call_start = [0.0], [0.0], [time.perf_counter()]

    def clock() -> float:
        return now[0] + spent[0] + (time.perf_counter() - call_start[0])

    cb = ParquetCallback(
        tmp / "m.parquet", static={"run_id": "x", "seed": 0}, clock=clock, **policy
    )
    writes = 0
    original = cb.write

    def counted() -> Path:
        nonlocal writes
        writes += 1
        return original()

    cb.write = counted  # type: ignore[method-assign]
    per_step = []
    for row in rows:
        now[0] += float(row.get("round_seconds") or 0.0)
        metrics = {k: v for k, v in row.items() if k != "round"}
        result = RoundResult(round=row["round"], client_ids=(0,), metrics=metrics, evaluated=False)
        call_start[0] = t = time.perf_counter()
        cb.on_round_end(result)
        per_step.append(time.perf_counter() - t)
        spent[0] += per_step[-1]
    call_start[0] = t = time.perf_counter()
    cb.on_run_end({})
    end = time.perf_counter() - t
    tenth = max(1, len(per_step) // 10)
    first = sum(per_step[:tenth]) / tenth
    last = sum(per_step[-tenth:]) / tenth
    total = sum(per_step) + end
    return {
        "writes": writes,
        "seconds_total": round(total, 3),
        "seconds_per_step_first_tenth": first,
        "seconds_per_step_last_tenth": last,
        "growth_last_over_first": round(last / first, 2) if first else None,
        "share_of_run": round(total / (now[0] + total), 5) if now[0] + total else None,
        "recorded_training_seconds": round(now[0], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metrics", type=Path, required=True, help="a run's metrics.jsonl")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--only-default", action="store_true", help="skip the every-10-rounds policy")
    args = ap.parse_args()
    if args.steps < 10:
        ap.error("--steps must be at least 10")
    if not args.metrics.is_file():
        ap.error(f"--metrics {args.metrics}: no such file")
    rows = _rows(args.metrics, args.steps)
    out: dict[str, Any] = {"steps": args.steps, "metrics": str(args.metrics)}
    with tempfile.TemporaryDirectory(prefix="parquet-overhead-") as name:
        if not args.only_default:  # no pause: the write every 10 rounds
            out["every_10_rounds"] = measure(
                rows, Path(name), flush_every=10, min_seconds=0.0, max_share=math.inf
            )
        out["default"] = measure(rows, Path(name))
    if "every_10_rounds" in out:
        out["total_ratio"] = round(
            out["every_10_rounds"]["seconds_total"] / out["default"]["seconds_total"], 1
        )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
