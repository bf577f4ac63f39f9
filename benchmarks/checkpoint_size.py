"""How large a trial's checkpoint is, per algorithm, and how long writing it takes (issue 27 §3:
what a sweep writes to shared storage at every checkpoint).

For each config (default: every FMNIST config under sweeps/configs/ at its own setup, the papers'
client counts), the engine is built, runs ``--rounds`` rounds, and its whole state is written as
a sweep trial writes it (``torch.save`` of the engine's ``state_dict``: one seed; a trial with S
seeds writes S of them). Prints JSON: bytes, seconds to write, and what the state holds (model
parameters, per-client state such as personal models, optimizer and accountant state, RNGs).

    .venv/bin/python benchmarks/checkpoint_size.py
    .venv/bin/python benchmarks/checkpoint_size.py --configs sweeps/configs/hyperfl_fmnist.yaml
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("FEDSWEEP_RUNS", Path.home() / ".cache" / "fedsweep-runs")) / "ckpt"
DEFAULT = sorted(
    str(p.relative_to(ROOT))
    for p in [*ROOT.glob("sweeps/configs/*_fmnist.yaml"), *ROOT.glob("sweeps/configs/*/fmnist_*")]
)


def _size(obj: Any) -> int:
    buf = io.BytesIO()
    import torch

    torch.save(obj, buf)
    return buf.tell()


def measure(config: str, rounds: int) -> dict[str, Any]:
    import torch

    from flcore.config import load_config
    from flcore.experiment import build_engine

    cfg = load_config(ROOT / config, [f"rounds={rounds}", "eval_every=1000", "workers=1"])
    engine = build_engine(cfg)
    for _ in engine.iter_rounds():
        pass
    state = engine.state_dict()
    began = time.perf_counter()
    buf = io.BytesIO()
    torch.save(state, buf)
    seconds = time.perf_counter() - began
    parts = {k: _size(v) for k, v in state.items()} if isinstance(state, dict) else {}
    return {
        "config": config,
        "algorithm": cfg.algorithm,
        "num_clients": cfg.num_clients,
        "bytes": buf.tell(),
        "write_seconds": round(seconds, 4),
        "largest_parts": dict(sorted(parts.items(), key=lambda kv: -kv[1])[:4]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=DEFAULT)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT / "checkpoint_size.json")
    args = p.parse_args()
    rows = []
    for config in args.configs:
        try:
            rows.append(measure(config, args.rounds))
        except Exception as err:  # a config this machine cannot build (no CIFAR offline)
            rows.append({"config": config, "error": f"{type(err).__name__}: {err}"[:300]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"machine": machine(), "rounds": args.rounds, "checkpoints": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
