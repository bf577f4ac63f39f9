"""Per-client compute of one identical FedAvg client loop in three process environments.

Why: on the 20-client FMNIST round, Flower's Ray simulation is ~8% faster per round than
fedsweep's spawned pool, and rounds are compute-bound (BENCHMARKS.md). This separates "where the
loop runs" from "what the loop is": the same function (Flower's client loop as written in
benchmarks/flower_baseline.py: fresh Net, SGD lr 0.01 momentum 0.5 wd 5e-4, 5 epochs of batch 50
over 600 real FMNIST records) runs, two clients at a time on the 2 cores, in

- ``spawn``: a ``torch.multiprocessing`` spawn pool with one torch thread per worker (fedsweep's
  PoolExecutor layout);
- ``ray``: Ray tasks with ``num_cpus=1`` (what Flower's simulation uses);
- ``engine``: fedsweep's own FedAvg ``local_update`` in the engine's pool (``client_seconds``);
- ``update``: the same ``local_update`` in the plain spawn pool, its data and payload pickled as
  ordinary tensors: engine vs update isolates the engine's executor (shared-memory dataset and
  payloads), update vs spawn the algorithm's code.

Environments alternate ``--repeats`` times; the figure is the median seconds per client.

    .venv/bin/python benchmarks/worker_env.py --clients 10 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _flower_net import Net  # noqa: E402
from _machine import machine  # noqa: E402

MEAN, STD = 0.1307, 0.3081


def client_loop(images: torch.Tensor, labels: torch.Tensor, seed: int) -> float:
    """Flower's client loop (flower_baseline.TrainClient.fit); returns its compute seconds."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    x = images.float().div(255.0)
    x = ((x.unsqueeze(1) if x.dim() == 3 else x) - MEAN) / STD
    y = labels.long()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.5, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss()
    net.train()
    n = len(y)
    for _ in range(5):
        order = torch.randperm(n, generator=gen)
        for s in range(0, n, 50):
            b = order[s : s + 50]
            opt.zero_grad()
            loss_fn(net(x[b]), y[b]).backward()
            opt.step()
    return time.perf_counter() - start


def _init() -> None:
    torch.set_num_threads(1)


def _spawn_task(args: tuple) -> float:  # type: ignore[type-arg]
    return client_loop(*args)


_ALG = None


def _update_task(args: tuple) -> float:  # type: ignore[type-arg]
    """fedsweep's FedAvg ``local_update`` in a plain spawn pool: the data and the payload come
    as ordinary pickled tensors (no shared memory), the algorithm is built once per worker."""
    global _ALG
    factory, payload, images, labels, cid = args
    from flcore.algorithms.base import ClientData, ClientTask
    from flcore.data import ArrayDataset, dataset_info
    from flcore.executor import client_generator

    torch.set_num_threads(1)
    if _ALG is None:
        _ALG = factory()
    data = ArrayDataset(images, labels)
    info = dataset_info("fmnist")
    start = time.perf_counter()
    _ALG.local_update(
        ClientData(cid, data, data, info),
        ClientTask(cid, 2, payload, None, False, 0),
        client_generator(0, 2, cid),
    )
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import ray
    import torch.multiprocessing as tmp

    from flcore.config import load_config
    from flcore.experiment import build_data, build_engine

    repo = Path(__file__).resolve().parents[1]
    over = ["partition.name=iid", "workers=2", "eval_every=1000", f"num_clients={args.clients}"]
    cfg = load_config(repo / "sweeps/configs/fedavg_fmnist.yaml", over)
    data = build_data(cfg)
    parts = [
        (data.client_train(c).images.clone(), data.client_train(c).labels.clone(), c)
        for c in range(args.clients)
    ]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(client_loop)
    pool = tmp.get_context("spawn").Pool(2, initializer=_init)
    pool.map(_spawn_task, parts[:2])  # warm up both environments
    ray.get([remote.remote(*p) for p in parts[:2]])

    probe = build_engine(cfg, data=data)
    payload = {k: v.clone() for k, v in probe.algorithm.broadcast(1, 0).items()}
    updates = [(probe.factory, payload, im, lab, c) for im, lab, c in parts]
    pool.map(_update_task, updates[:2])
    out: dict[str, list[float]] = {"spawn": [], "ray": [], "engine": [], "update": []}
    for _ in range(args.repeats):
        out["spawn"] += pool.map(_spawn_task, parts, chunksize=1)
        out["update"] += pool.map(_update_task, updates, chunksize=1)
        out["ray"] += ray.get([remote.remote(*p) for p in parts])
        engine = build_engine(cfg, data=data)
        it = engine.iter_rounds()
        next(it)  # round 1 starts the pool; time round 2
        r = next(it)
        it.close()
        # the engine logs the sum over the round's clients: one mean per round
        out["engine"].append(r.metrics["client_seconds"] / len(r.client_ids))
    pool.close()
    ray.shutdown()
    med = {k: round(statistics.median(v), 4) for k, v in out.items()}
    print(
        json.dumps(
            {
                "machine": machine(),
                "median_client_seconds": med,
                "ray_over_spawn": round(med["ray"] / med["spawn"], 3),
                "engine_over_spawn": round(med["engine"] / med["spawn"], 3),
                "update_over_spawn": round(med["update"] / med["spawn"], 3),
                "samples": {k: [round(x, 3) for x in v] for k, v in out.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
