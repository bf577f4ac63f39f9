"""The sweep platform's overhead: 8 trials at concurrency 2 vs the same 8 experiments in a row.

Each experiment is the 20-client FMNIST FedAvg config (HyperFL's setup) cut to 3 rounds. The
sweep runs them as Ray Tune trials, 2 at a time, 1 CPU and 1 torch thread each. Then the very
same 8 configurations (read back from the sweep's results) run one after another with
``fedsweep run`` using the whole machine (``workers=2``: two one-thread client processes, the
fastest single-run layout here). Both write MLflow and Parquet as users would. Target: sweep
wall time <= 0.8 x sequential wall time. Also recorded: Ray's start-up time and each trial's
start-up time (process start to engines ready).

    .venv/bin/python benchmarks/sweep_overhead.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FEDSWEEP = str(Path(sys.executable).parent / "fedsweep")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fs-bench-"))
    base = yaml.safe_load((REPO / "sweeps/configs/fedavg_fmnist.yaml").read_text())
    base |= {"experiment": "bench-sweep", "rounds": args.rounds, "eval_every": args.rounds}
    (work / "base.yaml").write_text(yaml.safe_dump(base))
    spec = {
        "name": "bench",
        "base": "base.yaml",
        "algorithms": ["fedavg"],
        "objectives": {"accuracy": "max", "bytes_up": "min"},
        "num_samples": args.trials,
        "max_concurrent_trials": 2,
        "resources": {"cpu": 1},
        "sampler": {"name": "random", "seed": 0},
        "storage": {"path": str(work / "sweeps_out")},
        "ray": {"num_cpus": 2},
    }
    (work / "sweep.yaml").write_text(yaml.safe_dump(spec))

    t0 = time.perf_counter()
    out = subprocess.run(
        [FEDSWEEP, "sweep", str(work / "sweep.yaml"), "--json"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    sweep_s = time.perf_counter() - t0
    doc = json.loads(out.stdout)
    import pandas as pd

    df = pd.read_parquet(doc["results_parquet"])
    configs = [t["config"] for t in doc["trials"]]

    seq = []
    t0 = time.perf_counter()
    for cfg in configs:
        sets = [f"{k.split(':', 1)[1]}={v}" for k, v in cfg.items() if k.startswith("fedavg:")]
        cmd = [
            FEDSWEEP,
            "run",
            str(work / "base.yaml"),
            "--set",
            "workers=2",
            "--set",
            "experiment=bench-sequential",
            "--json",
        ]
        for s in sets:
            cmd += ["--set", s]
        t1 = time.perf_counter()
        subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=True)
        seq.append(time.perf_counter() - t1)
    seq_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "benchmark": "sweep_overhead",
                "trials": args.trials,
                "rounds": args.rounds,
                "sweep_wall_s": sweep_s,
                "sequential_wall_s": seq_s,
                "ratio": sweep_s / seq_s,
                "ray_init_s": doc.get("ray_init_seconds"),
                "trial_startup_s": {
                    "median": statistics.median(df["startup_seconds"]),
                    "max": float(df["startup_seconds"].max()),
                },
                "trial_seconds": {"median": statistics.median(df["duration_s"])},
                "sequential_run_s": seq,
                "statuses": sorted(set(df["status"])),
                "workdir": str(work),
                "machine": machine(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
