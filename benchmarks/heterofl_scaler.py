"""What HeteroFL's Scaler does to narrow clients at Pa3dFL's Hetero setting (issue 24).

Runs ``sweeps/configs/pa3dfl/fmnist_hetero_heterofl.yaml`` (Table 7: lr 0.1, r_i ~ U[0.01, 1],
100 clients, fraction 0.2) for ``--rounds`` rounds with the Scaler on (the paper's method) or off
(``--scaler off``: ``algorithm_params.scaler=false``), and records each client's width, its
training loss and the largest weight magnitude of its trained submodel, round by round, until
the round's mean training loss is NaN. Early stopping is off (it would end a short run at its
first round without a validation gain). One JSON object on stdout. Needs flcore only.

    .venv/bin/python benchmarks/heterofl_scaler.py --scaler on --rounds 7
    .venv/bin/python benchmarks/heterofl_scaler.py --scaler off --rounds 7
    .venv/bin/python benchmarks/heterofl_scaler.py --scaler on --rounds 7 \
        --set model=pa3dfl_cnn_fmnist_sbn      # HeteroFL's static BN after every Scaler
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

CONFIG = (
    Path(__file__).resolve().parents[1]
    / "sweeps"
    / "configs"
    / "pa3dfl"
    / "fmnist_hetero_heterofl.yaml"
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scaler", choices=("on", "off"), default="on")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="key=value config overrides")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    from flcore.algorithms.widths.heterofl import HeteroFL
    from flcore.config import load_config
    from flcore.experiment import build_data, build_engine

    over = [f"seed={args.seed}", "workers=1", "early_stopping=null"]
    over.append(f"algorithm_params.scaler={'true' if args.scaler == 'on' else 'false'}")
    cfg = load_config(CONFIG, [*over, *args.set])
    engine = build_engine(cfg, data=build_data(cfg))
    clients: list[dict[str, Any]] = []
    train = HeteroFL.train_submodel

    def recorded(self: HeteroFL, model: Any, data: Any, task: Any, generator: Any) -> float:
        loss = train(self, model, data, task, generator)
        biggest = max(float(p.detach().abs().max()) for p in model.parameters())
        clients.append(
            {
                "client": task.client_id,
                "width": self.client_width(task.client_id),
                "loss": loss if math.isfinite(loss) else str(loss),
                "max_abs_weight": biggest if math.isfinite(biggest) else str(biggest),
            }
        )
        return loss

    HeteroFL.train_submodel = recorded  # type: ignore[method-assign]
    rounds = []
    iterator = engine.iter_rounds()
    for result in iterator:
        loss = result.metrics.get("train_loss")
        rounds.append(
            {
                "round": result.round,
                "train_loss": loss if loss is not None and math.isfinite(loss) else str(loss),
                "accuracy_before": result.metrics.get("accuracy_before"),
                "global_accuracy": result.metrics.get("global_accuracy"),
                "clients": sorted(clients, key=lambda c: c["client"]),
            }
        )
        clients.clear()
        if result.round >= args.rounds or loss is None or not math.isfinite(loss):
            break
    iterator.close()
    doc = {
        "machine": machine(),
        "model": cfg.model,
        "scaler": args.scaler,
        "seed": args.seed,
        "overrides": args.set,
        "rounds": rounds,
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
