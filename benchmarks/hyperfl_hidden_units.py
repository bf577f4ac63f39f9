"""How many of the hypernetwork's hidden ReLUs are alive for each client's embedding, round by
round, for each ``head_init_scale`` (HyperFL on FMNIST, the paper's generator: embedding 64,
hidden 128, one layer).

A unit is alive for client i when ``(W1 v_i + b1)_j > 0``; a dead unit passes no gradient to the
hypernetwork's first layer or to the embedding. With every unit dead the generated extractor is
the heads' biases alone, the same for every client.

    .venv/bin/python benchmarks/hyperfl_hidden_units.py --clients 4 --rounds 6 --scales 1 0.1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

from flcore.config import load_config  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def alive(engine) -> list[int]:  # type: ignore[no-untyped-def]
    """Units alive per client, in client-id order."""
    h = engine.algorithm.hnet
    w, b = h.body[0].weight.detach(), h.body[0].bias.detach()
    states = engine.client_states
    return [int((w @ states[c]["embedding"] + b > 0).sum()) for c in sorted(states)]


def run(scale: float, args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    over = [
        "workers=1",
        f"num_clients={args.clients}",
        f"rounds={args.rounds}",
        f"eval_every={args.rounds}",
        f"seed={args.seed}",
        f"algorithm_params.head_init_scale={scale}",
    ]
    cfg = load_config(REPO / "sweeps/configs/hyperfl_fmnist.yaml", over)
    engine = build_engine(cfg, data=build_data(cfg))
    rows = [{"round": 0, "alive": alive(engine)}]
    for result in engine.iter_rounds():
        rows.append(
            {
                "round": result.round,
                "alive": alive(engine),
                "train_loss": round(float(result.metrics["train_loss"]), 4),
                "accuracy": result.metrics.get("accuracy"),
            }
        )
    return {"head_init_scale": scale, "rounds": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scales", nargs="+", type=float, default=[1.0, 0.1])
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = {"machine": machine(), "runs": [run(s, args) for s in args.scales]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
