"""How much of a sweep's wall time the driver spends on Tune's event loop (MLflow callback and
Optuna searcher), and how that grows with the number of finished trials (issue 27 section 2).

A sweep of ``--trials`` trials of a tiny real config (FedAvg, 4 clients x 50 Fashion-MNIST
records, 1 round of 1 epoch), ``--concurrency`` at once, multi-objective TPE (which re-reads
every trial at each ask), against the tracking store ``--tracking-uri`` (default: a fresh sqlite
file; give ``http://HOST:PORT`` for a ``fedsweep server`` on PostgreSQL, with ``--optuna
postgresql://...`` for the study). Prints JSON: the sweep's ``driver_seconds`` (mlflow, optuna,
their share of the wall time), trials per minute, and the tally at every 10th finished trial.
``--reuse both`` runs the sweep twice in one invocation, a fresh worker process per trial and
then with ``reuse_actors`` (the spec's default), and adds the ratio of their trials per minute.

    .venv/bin/python benchmarks/driver_throughput.py --trials 100 --concurrency 2
    .venv/bin/python benchmarks/driver_throughput.py --trials 40 --concurrency 2 --reuse both
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

OUT = Path(os.environ.get("FEDSWEEP_RUNS", Path.home() / ".cache" / "fedsweep-runs")) / "driver"


def spec(args: argparse.Namespace, folder: Path, reuse: bool = True) -> Any:
    from sweeps.spec import validate_spec

    uri = args.tracking_uri or f"sqlite:///{folder / 'mlflow.db'}"
    raw = {
        "name": f"driver-{args.trials}",
        "base": {
            "experiment": "driver-throughput",
            "dataset": "fmnist",
            "num_clients": 4,
            "samples_per_client": 50,
            "test_samples_per_client": 50,
            "global_test_per_class": 10,
            "rounds": 1,
            "local_epochs": 1,
            "eval_every": 1,
        },
        "algorithms": ["fedavg"],
        "objectives": {"accuracy": "max", "bytes_up": "min"},
        "num_samples": args.trials,
        "max_concurrent_trials": args.concurrency,
        "reuse_actors": reuse,
        "sampler": {"name": "tpe", "seed": 1},
        "storage": {
            "path": str(folder / "sweeps_out"),
            **({"optuna": args.optuna} if args.optuna else {}),
        },
        "tracking": {"uri": uri},
        "ray": {"num_cpus": args.concurrency},
    }
    return validate_spec(raw)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=os.cpu_count() or 2)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--optuna", default=None, help="the study's storage (default: the sweep's)")
    p.add_argument("--out", type=Path, default=None, help=f"JSON file (default under {OUT})")
    p.add_argument(
        "--reuse",
        choices=("on", "off", "both"),
        default="on",
        help="reuse_actors: on (the default), off (a fresh process per trial), or both in turn",
    )
    args = p.parse_args()
    if args.reuse == "both":
        runs = {"off": measure(args, reuse=False), "on": measure(args, reuse=True)}
        doc = {
            "machine": machine(),
            "reuse_off": runs["off"],
            "reuse_on": runs["on"],
            "trials_per_minute_ratio_on_over_off": runs["on"]["trials_per_minute"]
            / runs["off"]["trials_per_minute"],
        }
    else:
        doc = {"machine": machine()} | measure(args, reuse=args.reuse == "on")
    out = args.out or OUT / f"driver-{args.trials}-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


def measure(args: argparse.Namespace, *, reuse: bool) -> dict[str, Any]:
    """One sweep of ``args.trials`` trials; its wall time, driver time and timeline."""
    from sweeps.driver_time import timeline
    from sweeps.sweep import run_sweep

    folder = Path(tempfile.mkdtemp(prefix="driver-throughput-"))
    s = spec(args, folder, reuse)
    began = time.perf_counter()
    summary = run_sweep(s, verbose=0)
    wall = time.perf_counter() - began
    marks = timeline()
    start = marks[0]["t"] if marks else began
    every = [
        {k: round(v, 3) for k, v in m.items() if k != "t"} | {"at_s": round(m["t"] - start, 1)}
        for m in marks
        if int(m["finished"]) % 10 == 0
    ]
    return {
        "trials": args.trials,
        "concurrency": args.concurrency,
        "reuse_actors": reuse,
        "tracking": s.tracking.uri,
        "finished": sum(t["status"] == "FINISHED" for t in summary["trials"]),
        "wall_seconds": wall,
        "trials_per_minute": 60 * len(summary["trials"]) / wall,
        "driver_seconds": summary.get("driver_seconds"),
        "driver_seconds_per_trial": {
            k: v / max(1, len(summary["trials"]))
            for k, v in (summary.get("driver_seconds") or {}).items()
            if k in ("mlflow", "optuna")
        },
        "timeline_every_10": every,
    }


if __name__ == "__main__":
    main()
