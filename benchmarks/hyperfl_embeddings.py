"""HyperFL's generator and client embeddings in a ``reproduce_table1.py`` checkpoint: hidden units
alive per client, and whether the embeddings group as the partition does (paper Figure 8).

A unit of the hypernetwork's first hidden layer is alive for client i when ``(W1 v_i + b1)_j >
0``. Clients of the dominant-class partition belong to group ``i % len(groups)``; the script
prints the mean Euclidean distance between embeddings of clients in the same group and in
different groups (equal means: no grouping).

    .venv/bin/python benchmarks/hyperfl_embeddings.py \
        benchmarks/out/table1/hyperfl-head-init-0.1-20-s0 --set algorithm_params.head_init_scale=0.1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402
from table1_summary import _RUN  # noqa: E402

from flcore.config import load_config  # noqa: E402
from flcore.data.datasets import dataset_info  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a reproduce_table1.py run folder (hyperfl-...-s<seed>)")
    ap.add_argument("--set", action="append", default=[], help="the run's overrides, key=value")
    args = ap.parse_args()
    ckpt = args.run / "checkpoint.pt"
    if not ckpt.is_file():
        sys.exit(f"error: no checkpoint.pt in {args.run}")
    name = _RUN.match(args.run.name)
    if name is None:
        sys.exit(f"error: {args.run.name} is not a run folder (<method>[-label]-<clients>-s<seed>)")
    clients, seed = int(name["clients"]), int(name["seed"])
    over = [f"num_clients={clients}", f"seed={seed}", "workers=1", *args.set]
    if clients == 100:
        over += ["client_fraction=0.3", "full_last_round=true"]
    cfg = load_config(REPO / "sweeps/configs/hyperfl_fmnist.yaml", over)
    engine = build_engine(cfg, data=build_data(cfg))
    engine.load_checkpoint(ckpt)
    hnet = engine.algorithm.hnet
    w, b = hnet.body[0].weight.detach(), hnet.body[0].bias.detach()
    ids = sorted(engine.client_states)
    emb = torch.stack([engine.client_states[i]["embedding"] for i in ids]).double()
    alive = [int((w.double() @ v + b.double() > 0).sum()) for v in emb]
    groups = len(dataset_info(cfg.dataset).class_groups)
    dist = torch.cdist(emb, emb)
    same = torch.tensor([[a % groups == c % groups for c in ids] for a in ids])
    off_diag = ~torch.eye(len(ids), dtype=torch.bool)
    print(
        json.dumps(
            {
                "machine": machine(),
                "run": str(args.run),
                "round": engine.round,
                "hidden_units": w.shape[0],
                "alive_per_client": alive,
                "groups": groups,
                "mean_distance_same_group": float(dist[same & off_diag].mean()),
                "mean_distance_other_groups": float(dist[~same].mean()),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
