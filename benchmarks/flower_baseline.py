"""Flower baseline: wall seconds per FedAvg round in Flower's Ray simulation.

What it measures
    Seconds per federated round of a fixed workload run by Flower's Ray-based
    simulation (``flwr.simulation.start_simulation``), for comparison with
    FedSweep's own engine. Workload: FedAvg, 20 clients, full participation,
    600 IID Fashion-MNIST training samples each (seeded permutation of the 60k
    train set, first clients*samples indices split in order), a small CNN
    (conv 1->16 k5, conv 16->32 k5 p1, fc 800->128->10, LeakyReLU, max-pool),
    5 local epochs, batch 50, SGD lr 0.01 momentum 0.5 weight decay 5e-4 with a
    fresh optimizer each round, no evaluation. Each virtual client gets 1 CPU in
    Ray and uses one torch thread, so on 2 cores two clients train at once.

    A round's time is the gap between two consecutive ``aggregate_fit`` calls;
    round 1 counts from before ``ray.init`` so it includes Ray's start-up. The
    result is ONE JSON object on stdout; all logs go to stderr.

How to run (from the repository root)
    /work/flowervenv/bin/python benchmarks/flower_baseline.py --rounds 5 --json

How to create the venv (outside the repository)
    python3 -m venv /work/flowervenv
    /work/flowervenv/bin/pip install -r benchmarks/flower_requirements.txt

Data: the idx files of Debian's fashion-mnist package, read with gzip+numpy
(``FEDSWEEP_FMNIST_DIR`` overrides /usr/share/datasets/fashion-mnist).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

import flwr  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from _flower_net import Net  # noqa: E402
from flwr.client import Client, NumPyClient  # noqa: E402
from flwr.common import Context, FitRes, Parameters, Scalar, ndarrays_to_parameters  # noqa: E402
from flwr.server import ServerConfig  # noqa: E402
from flwr.server.client_proxy import ClientProxy  # noqa: E402
from flwr.server.strategy import FedAvg  # noqa: E402
from torch import nn  # noqa: E402

DATA_DIR = Path(os.environ.get("FEDSWEEP_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
MEAN, STD = 0.1307, 0.3081


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped idx file: magic (dtype, ndim), big-endian dims, then uint8 data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def make_partitions(clients: int, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """IID split: seeded permutation, first clients*samples indices split in order."""
    images = read_idx(DATA_DIR / "train-images-idx3-ubyte.gz")
    labels = read_idx(DATA_DIR / "train-labels-idx1-ubyte.gz")
    idx = np.random.default_rng(seed).permutation(len(labels))[: clients * samples]
    shape = (clients, samples)
    return images[idx].reshape(*shape, 28, 28).copy(), labels[idx].reshape(shape).copy()


def get_weights(net: nn.Module) -> list[np.ndarray]:
    return [v.detach().cpu().numpy().copy() for v in net.state_dict().values()]


def set_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(net.state_dict().keys())
    state = {k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights, strict=True)}
    net.load_state_dict(state)


class TrainClient(NumPyClient):
    def __init__(self, x: np.ndarray, y: np.ndarray, seed: int) -> None:
        self.x = (torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1) - MEAN) / STD
        self.y = torch.from_numpy(y.astype(np.int64))
        self.seed = seed

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, Scalar]
    ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        torch.set_num_threads(1)
        gen = torch.Generator().manual_seed(self.seed + int(config.get("round", 0)))
        net = Net()
        set_weights(net, parameters)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.5, weight_decay=5e-4)
        loss_fn = nn.CrossEntropyLoss()
        net.train()
        n = len(self.y)
        for _ in range(int(config.get("epochs", 5))):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, 50):
                b = order[start : start + 50]
                opt.zero_grad()
                loss_fn(net(self.x[b]), self.y[b]).backward()
                opt.step()
        return get_weights(net), n, {}


class TimedFedAvg(FedAvg):
    """FedAvg that timestamps each round's aggregation and refuses failed rounds."""

    def __init__(self, t_start: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stamps: list[float] = [t_start]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        if failures:
            raise RuntimeError(f"round {server_round}: {len(failures)} client failures")
        out = super().aggregate_fit(server_round, results, failures)
        self.stamps.append(time.perf_counter())
        gap = self.stamps[-1] - self.stamps[-2]
        print(f"[flower_baseline] round {server_round}: {gap:.2f} s", file=sys.stderr)
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the JSON result on stdout")
    args = ap.parse_args(argv)
    # Keep stdout for the JSON only: point fd 1 (and Ray's forwarded worker
    # output) at stderr during the run, and write the result to a saved dup.
    sys.stdout.flush()
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    xs, ys = make_partitions(args.clients, args.samples, args.seed)
    torch.manual_seed(args.seed)
    initial = ndarrays_to_parameters(get_weights(Net()))

    t_start = time.perf_counter()
    ray_args: dict[str, Any] = {
        "ignore_reinit_error": True,
        "include_dashboard": False,
        "num_cpus": os.cpu_count(),
    }
    ray.init(**ray_args)
    # Partitions go to Ray's object store once; actors read them zero-copy.
    x_ref, y_ref = ray.put(xs), ray.put(ys)

    def client_fn(context: Context) -> Client:
        pid = int(context.node_config["partition-id"])
        x_all, y_all = ray.get(x_ref), ray.get(y_ref)
        return TrainClient(x_all[pid], y_all[pid], args.seed * 1000 + pid).to_client()

    strategy = TimedFedAvg(
        t_start,
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=args.clients,
        min_evaluate_clients=0,
        min_available_clients=args.clients,
        initial_parameters=initial,
        on_fit_config_fn=lambda rnd: {"round": rnd, "epochs": 5},
    )
    try:
        flwr.simulation.start_simulation(
            client_fn=client_fn,
            num_clients=args.clients,
            client_resources={"num_cpus": 1, "num_gpus": 0.0},
            config=ServerConfig(num_rounds=args.rounds),
            strategy=strategy,
            ray_init_args=ray_args,
            keep_initialised=True,
        )
    finally:
        t_end = time.perf_counter()
        ray.shutdown()

    rounds = [b - a for a, b in pairwise(strategy.stamps)]
    if len(rounds) != args.rounds:
        print(f"[flower_baseline] {len(rounds)}/{args.rounds} rounds done", file=sys.stderr)
        return 1
    rest = rounds[1:]
    result = {
        "framework": "flower",
        "flower_version": flwr.__version__,
        "torch_version": torch.__version__,
        "rounds": args.rounds,
        "round_seconds": [round(r, 3) for r in rounds],
        "mean_round_seconds_excl_first": round(sum(rest) / len(rest), 3) if rest else None,
        "first_round_seconds": round(rounds[0], 3),
        "total_seconds": round(t_end - t_start, 3),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2), file=real_stdout)
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
