"""What a random walk's bookkeeping costs beside its compute (issue 26 section 1).

A walk's step is one client's MAML step, far cheaper than an FL round, so evaluation, checkpoints
and per-step logging must not dominate a 10,000-step run. This runs ``--steps`` steps of a walk
config (default ``sweeps/configs/lodmeta/fmnist_lodmeta.yaml``) with every per-step consumer a
sweep trial or ``fedsweep run`` attaches, each timed on its own:

- the client's step (``client_seconds``: the meta-gradient and the update);
- the engine's own share of a step (the round minus the client and the evaluation);
- the evaluation of every training and unseen client on evaluation steps (``--eval-every``);
- MLflow: one ``log_batch`` of the step's metrics into a real sqlite store (the run's
  ``MLflowCallback``);
- Parquet: the run's ``ParquetCallback`` (rewrites its whole file once 10 rounds and a pause
  of 30 s or 100 times its last write have passed; every 10 rounds before session 49);
- a checkpoint every ``--checkpoint-every`` steps (the engine's whole state, every visited
  client's m and v included): seconds and bytes, each one listed.

What grows with the walk's length (the Parquet file, rewritten whole; the MLflow store; the
engine's history in each checkpoint) shows as each per-step part over the first and the last
tenth of the steps.

Prints JSON (seconds per step of each part, and its share of the wall time). Needs flcore, MLflow
and pandas (the platform's parts being measured).

    .venv/bin/python benchmarks/walk_overhead.py --steps 300
    # 10,000 steps of a cheap learner (width 8, first order): the bookkeeping at full length,
    # each part over the first and the last tenth of the steps
    .venv/bin/python benchmarks/walk_overhead.py --steps 10000 --eval-every 1000 \
        --checkpoint-every 1000 --set model_params.hidden=8 --set algorithm_params.first_order=true
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean as mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class _Timed:
    """A callback whose ``on_round_end`` time is summed (and kept per round)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds = inner, 0.0
        self.per_round: list[float] = []

    def on_run_start(self, info: Any) -> None:
        self.inner.on_run_start(info)

    def on_round_end(self, result: Any) -> None:
        t = time.perf_counter()
        self.inner.on_round_end(result)
        spent = time.perf_counter() - t
        self.seconds += spent
        self.per_round.append(spent)

    def on_run_end(self, summary: Any) -> None:
        self.inner.on_run_end(summary)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "sweeps/configs/lodmeta/fmnist_lodmeta.yaml"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], help="key=value overrides")
    args = ap.parse_args(argv)

    import os

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import torch

    from flcore.config import load_config
    from flcore.experiment import build_engine
    from sweeps.results import ParquetCallback
    from sweeps.tracking import MLflowCallback

    torch.set_num_threads(1)
    cfg = load_config(
        args.config,
        [f"rounds={args.steps}", f"eval_every={args.eval_every}", "workers=1", *args.set],
    )
    with tempfile.TemporaryDirectory(prefix="walk-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        mlflow = _Timed(
            MLflowCallback(experiment="walk-overhead", params={}, uri=f"sqlite:///{tmp}/m.db")
        )
        parquet = _Timed(ParquetCallback(tmp / "metrics.parquet"))
        engine = build_engine(cfg, callbacks=[mlflow, parquet])
        client = evals = rounds = ckpt = 0.0
        ckpt_bytes = 0
        ckpts: list[tuple[int, float, int]] = []  # (step, seconds, bytes) of each checkpoint
        start = time.perf_counter()
        for result in engine.iter_rounds():
            m = result.metrics
            client += float(m["client_seconds"])
            rounds += float(m["round_seconds"])
            if result.round % args.checkpoint_every == 0:
                t = time.perf_counter()
                path = engine.save_checkpoint(tmp / "checkpoint.pt")
                ckpt += time.perf_counter() - t
                ckpt_bytes = path.stat().st_size
                ckpts.append((result.round, time.perf_counter() - t, ckpt_bytes))
        wall = time.perf_counter() - start
    # the evaluation runs inside the round: it is what the round holds beyond the client and
    # the engine's usual share, measured on the steps that do not evaluate
    plain = [h for h in engine.history if not h.evaluated]
    evaluated = [h for h in engine.history if h.evaluated]
    per_plain = sum(h.metrics["round_seconds"] - h.metrics["client_seconds"] for h in plain)
    engine_share = per_plain / max(1, len(plain))
    evals = sum(
        h.metrics["round_seconds"] - h.metrics["client_seconds"] - engine_share for h in evaluated
    )
    n = args.steps
    # what grows with the walk's length (the Parquet file rewritten whole, the MLflow store,
    # the engine's history inside each checkpoint): each per-step part over the first and the
    # last tenth of the steps
    tenth = max(1, n // 10)

    def engine_over(rows: list[Any]) -> float:
        rows = [h for h in rows if not h.evaluated]
        return sum(h.metrics["round_seconds"] - h.metrics["client_seconds"] for h in rows) / max(
            1, len(rows)
        )

    growth = {
        "mlflow_log_batch": (mean(mlflow.per_round[:tenth]), mean(mlflow.per_round[-tenth:])),
        "parquet": (mean(parquet.per_round[:tenth]), mean(parquet.per_round[-tenth:])),
        "engine": (engine_over(engine.history[:tenth]), engine_over(engine.history[-tenth:])),
    }
    parts = {
        "client_step": client,
        "engine": engine_share * n,
        "evaluation": evals,
        "mlflow_log_batch": mlflow.seconds,
        "parquet": parquet.seconds,
        "checkpoint": ckpt,
    }
    print(
        json.dumps(
            {
                "machine": machine(),
                "config": str(Path(args.config).relative_to(REPO)),
                "steps": n,
                "eval_every": args.eval_every,
                "checkpoint_every": args.checkpoint_every,
                "clients": cfg.num_clients,
                "wall_seconds": round(wall, 2),
                "seconds_per_step": {k: round(v / n, 5) for k, v in parts.items()},
                "share_of_wall": {k: round(v / wall, 4) for k, v in parts.items()},
                "seconds_per_step_first_and_last_tenth": {
                    k: [round(a, 6), round(b, 6)] for k, (a, b) in growth.items()
                },
                "checkpoints": [
                    {"step": r, "seconds": round(t, 3), "bytes": b} for r, t, b in ckpts
                ],
                "checkpoint_bytes": ckpt_bytes,
                "visited_clients": sum(s is not None for s in engine.client_states.values()),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
