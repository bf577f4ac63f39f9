"""What measuring the global model on the global test set every round costs a run's rounds.

Runs the first ``--rounds`` rounds of ``--config`` (default: Pa3dFL Table 1's Hetero FjORD,
whose global model is the full-width network and whose global test set is Fashion-MNIST's
10,000 records) twice in this process, with the same seed and so the same clients each round:
once measuring ``global_accuracy`` on every round (the default) and once with
``global_eval_every`` past the rounds run (measured on none of them). The two runs' rounds are
paired, round by round (the same clients, widths and draws: the clients' figures must agree
exactly; the output lists any that differ, and the script then exits 1); the difference of
their ``round_seconds`` is what the global evaluation costs, beside what the round costs
without it. Then it times the evaluation itself (``Algorithm.evaluate_server`` on the state
the rounds ended with), ``--repeats`` times. One JSON object on stdout. Needs flcore only.

    .venv/bin/python benchmarks/global_eval_cost.py --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "sweeps" / "configs" / "pa3dfl" / "fmnist_hetero_fjord.yaml"
#: the figures two runs of the same clients must share whatever their global evaluation
SAME = ("train_loss", "accuracy", "accuracy_before", "val_accuracy", "val_accuracy_before")


def _rounds(cfg: Any, data: Any, rounds: int) -> tuple[list[dict[str, Any]], Any]:
    from flcore.experiment import build_engine

    engine = build_engine(cfg, data=data)
    rows = []
    run = engine.iter_rounds()
    for result in run:
        rows.append(dict(result.metrics))
        print(
            f"[global_eval_every={cfg.global_eval_every}] round {result.round}: "
            f"{result.metrics['round_seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        if result.round >= rounds:
            break
    run.close()
    return rows, engine


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="key=value config overrides")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be at least 1")
    if not args.config.is_file():
        ap.error(f"--config {args.config}: no such file")

    import torch

    from flcore.config import load_config
    from flcore.experiment import build_data

    over = [f"workers={args.workers}", *args.set]
    every = load_config(args.config, over)
    if args.rounds >= every.rounds:
        ap.error(f"--rounds must be below the config's {every.rounds} (its last round is special)")
    never = load_config(args.config, [*over, f"global_eval_every={every.rounds}"])
    data = build_data(every)
    measured, engine = _rounds(every, data, args.rounds)
    skipped, _ = _rounds(never, data, args.rounds)
    differing = [
        f"round {int(a['round'])}: {key} {a.get(key)} vs {b.get(key)}"
        for a, b in zip(measured, skipped, strict=True)
        for key in SAME
        if a.get(key) != b.get(key)
    ]
    if any(r["global_accuracy"] is None for r in measured) or any(
        r["global_accuracy"] is not None for r in skipped
    ):
        raise SystemExit("global_accuracy was not measured as configured")
    pairs = [
        (a["round_seconds"], b["round_seconds"]) for a, b in zip(measured, skipped, strict=True)
    ]
    timed = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.algorithm.evaluate_server(engine.data, engine.client_states, torch.device("cpu"))
        timed.append(time.perf_counter() - start)
    with_eval = statistics.fmean(a for a, _ in pairs)
    without = statistics.fmean(b for _, b in pairs)
    out = {
        "machine": machine(),
        "config": str(
            args.config.relative_to(REPO) if args.config.is_relative_to(REPO) else args.config
        ),
        "algorithm": every.algorithm,
        "global_test_records": len(data.global_test_set().labels),
        "rounds": args.rounds,
        "workers": args.workers,
        "round_seconds_with": [round(a, 2) for a, _ in pairs],
        "round_seconds_without": [round(b, 2) for _, b in pairs],
        "mean_with": round(with_eval, 2),
        "mean_without": round(without, 2),
        "mean_paired_difference": round(statistics.fmean(a - b for a, b in pairs), 2),
        "share_of_a_round": round((with_eval - without) / with_eval, 3),
        "evaluate_server_seconds": [round(t, 2) for t in timed],
        # the clients' figures that differ between the two runs (none: the pairing holds)
        "client_figures_differing": differing,
    }
    print(json.dumps(out, indent=1))
    if differing:
        raise SystemExit(f"the runs' client figures differ: {'; '.join(differing)}")


if __name__ == "__main__":
    main()
