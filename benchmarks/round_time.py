"""Seconds per round of the 20-client FMNIST FedAvg workload, our engine beside Flower.

Workload (both frameworks): 20 clients x 600 iid Fashion-MNIST samples, full participation,
5 local epochs, batch 50, SGD lr 0.01 momentum 0.5 wd 5e-4, no evaluation inside the timed
rounds, 2 one-thread workers. Flower runs in its own venv (benchmarks/flower_requirements.txt)
through benchmarks/flower_baseline.py. The two alternate (ours, Flower, ours, Flower ...) so both
see the same machine; round 1 (process / Ray start-up) is reported apart.

    .venv/bin/python benchmarks/round_time.py --rounds 5 --repeats 2 \
        --flower-python /work/flowervenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

from flcore.config import validate_config  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

HERE = Path(__file__).parent


def ours(rounds: int, workers: int) -> dict:
    cfg = validate_config(
        {
            "algorithm": "fedavg",
            "num_clients": 20,
            "samples_per_client": 600,
            "rounds": rounds + 1,
            "local_epochs": 5,
            "batch_size": 50,
            "lr": 0.01,
            "eval_every": 10**6,
            "workers": workers,
            "partition": {"name": "iid"},
            "full_last_round": False,
        }
    )
    fed = build_data(cfg)
    engine = build_engine(cfg, data=fed)
    t0 = time.perf_counter()
    seconds = []
    it = engine.iter_rounds()
    for _ in range(rounds):  # the extra last round (which evaluates) is never run
        seconds.append(next(it).metrics["round_seconds"])
    it.close()
    total = time.perf_counter() - t0
    return {
        "round_seconds": seconds,
        "first_round_seconds": seconds[0],
        "mean_round_seconds_excl_first": statistics.mean(seconds[1:]),
        "total_seconds": total,
    }


def flower(python: str, rounds: int) -> dict:
    out = subprocess.run(
        [python, str(HERE / "flower_baseline.py"), "--rounds", str(rounds), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--flower-python",
        default=None,
        help="python of the Flower venv; omit to measure only our engine",
    )
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"fedsweep": [], "flower": []}
    for _ in range(args.repeats):
        runs["fedsweep"].append(ours(args.rounds, args.workers))
        if args.flower_python:
            runs["flower"].append(flower(args.flower_python, args.rounds))
    ours_s = statistics.median(r["mean_round_seconds_excl_first"] for r in runs["fedsweep"])
    result = {
        "benchmark": "round_time",
        "rounds": args.rounds,
        "workers": args.workers,
        "fedsweep_round_seconds": ours_s,
        "runs": runs,
        "machine": machine(),
    }
    if runs["flower"]:
        fl = statistics.median(r["mean_round_seconds_excl_first"] for r in runs["flower"])
        result |= {"flower_round_seconds": fl, "flower_over_fedsweep": fl / ours_s}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
