"""LoDMeta's clipping bound M from measured meta-gradient norms (issue 26 section 4).

The paper's M_meta is a smoothness constant with no value given, and our clip M bounds the
meta-gradient's L2 norm instead. This runs the first ``--steps`` steps of a config (default
``sweeps/configs/lodmeta/fmnist_lodmeta.yaml``, no privacy: the clean meta-gradients) and prints
the norms' quantiles as JSON; the configs' default M is their median over the first 100 steps.
Needs flcore only.

    .venv/bin/python benchmarks/lodmeta_grad_norms.py --steps 100
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "sweeps/configs/lodmeta/fmnist_lodmeta.yaml"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="key=value overrides")
    args = ap.parse_args(argv)

    import torch

    from flcore.config import load_config
    from flcore.experiment import build_engine

    torch.set_num_threads(1)
    overrides = [f"rounds={args.steps}", f"eval_every={args.steps}", f"seed={args.seed}"]
    overrides += ["privacy=null", "workers=1", *args.set]
    cfg = load_config(args.config, overrides)
    engine = build_engine(cfg)
    start = time.perf_counter()
    norms = [r.metrics["meta_grad_norm"] for r in engine.iter_rounds()]
    seconds = time.perf_counter() - start
    q = np.quantile(norms, [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
    print(
        json.dumps(
            {
                "machine": machine(),
                "config": str(Path(args.config).relative_to(REPO)),
                "algorithm": cfg.algorithm,
                "steps": args.steps,
                "seed": args.seed,
                "overrides": args.set,
                "norm_quantiles": dict(
                    zip(
                        ("min", "p10", "p25", "median", "p75", "p90", "max"),
                        map(float, q),
                        strict=True,
                    )
                ),
                "norms": [round(float(n), 5) for n in norms],
                "seconds_per_step": seconds / args.steps,
                "last_accuracy": engine.history[-1].metrics.get("accuracy"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
