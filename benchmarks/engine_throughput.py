"""Samples/s of FedAvg local training inside the engine (workers=1) vs a plain PyTorch loop.

Both train the same FMNIST CNN on the same client samples (20 clients x 600, iid, 5 epochs,
batch 50, SGD lr 0.01 momentum 0.5 wd 5e-4) in this one process with one torch thread, the
thread count the engine uses per client. The plain loop is the textbook one: a DataLoader over a
TensorDataset of pre-normalised tensors. Runs alternate (plain, engine, plain, engine, ...) so
load changes on a shared machine hit both; the ratio of medians is the figure.

    .venv/bin/python benchmarks/engine_throughput.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _machine import machine  # noqa: E402

from flcore.config import validate_config  # noqa: E402
from flcore.data import normalize  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402
from flcore.models import build_model  # noqa: E402


def plain_loop(fed, clients: int, epochs: int, batch: int) -> float:
    """Seconds for a plain PyTorch loop over every client's samples (one model per client)."""
    start = time.perf_counter()
    for cid in range(clients):
        data = fed.client_train(cid)
        x = normalize(data.images, fed.info)
        loader = DataLoader(TensorDataset(x, data.labels), batch_size=batch, shuffle=True)
        model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5, weight_decay=5e-4)
        model.train()
        for _ in range(epochs):
            for xb, yb in loader:
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = validate_config(
        {
            "algorithm": "fedavg",
            "num_clients": args.clients,
            "samples_per_client": 600,
            "rounds": 2,
            "local_epochs": args.epochs,
            "eval_every": 10**6,
            "workers": 1,
            "partition": {"name": "iid"},
            "full_last_round": False,
        }
    )
    fed = build_data(cfg)
    samples = args.clients * 600 * args.epochs
    plain, engine = [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(fed, args.clients, args.epochs, 50))
        eng = build_engine(cfg, data=fed)
        t0 = time.perf_counter()
        rounds = eng.iter_rounds()
        next(rounds)  # round 1 of 2: every client trains, the server aggregates, no evaluation
        engine.append(time.perf_counter() - t0)
        rounds.close()
    p, e = statistics.median(plain), statistics.median(engine)
    print(
        json.dumps(
            {
                "benchmark": "engine_throughput",
                "samples_per_run": samples,
                "plain_seconds": plain,
                "engine_seconds": engine,
                "plain_samples_per_s": samples / p,
                "engine_samples_per_s": samples / e,
                "engine_over_plain_throughput": p / e,
                "torch_threads": 1,
                "machine": machine(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
