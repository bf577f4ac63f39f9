"""Per-round time of hyperfl against fedavg on the 20-client FMNIST setup, with a breakdown.

HyperFL's Table 4 reports 37 s against 23 s per round (1.6x, on a GPU), on EMNIST (20 clients
of 1,000 records); ours is FMNIST's 600, so compare the ratio, not the seconds. Two
measurements, in one run so both algorithms see the same machine:

1. ``breakdown``: one client's round of HyperFL (600 records, classifier 1 epoch, then 5 epochs
   over the hypernetwork and embedding, batch 50), in this process with one torch thread, timed
   by part: generating the extractor, forward+backward, gradient clipping, the optimizer step
   over the ~15M hypernetwork parameters (fused kernel, and the per-tensor loop for
   comparison), the classifier step, and copying the upload out. The same for a FedAvg client.
2. ``rounds``: whole engine rounds (``workers=2``, no evaluation) of both configs, alternating;
   round 1 (worker start-up) is left out.

    .venv/bin/python benchmarks/hyperfl_round_time.py --rounds 3 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

from flcore.algorithms.training import batches, make_optimizer  # noqa: E402
from flcore.config import load_config  # noqa: E402
from flcore.data import normalize  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402
from flcore.models import build_model  # noqa: E402
from flcore.models.hypernet import HyperNetwork  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _sgd(params, lr: float, fused: bool):  # type: ignore[no-untyped-def]
    if fused:
        return make_optimizer(params, name="sgd", lr=lr, momentum=0.5, weight_decay=5e-4)
    return torch.optim.SGD(params, lr=lr, momentum=0.5, weight_decay=5e-4, foreach=False)


def breakdown(data, fused: bool) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds per part of one HyperFL client round and of one FedAvg client round."""
    torch.manual_seed(0)
    train = data.client_train(0)
    x_all, y_all = normalize(train.images, data.info), train.labels
    gen = torch.Generator().manual_seed(0)
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    hnet = HyperNetwork.for_module(model.features)
    emb = torch.nn.Parameter(torch.randn(64))
    t: dict[str, float] = dict.fromkeys(
        ["generate", "forward_backward", "clip", "optimizer_step", "classifier_epoch", "upload"],
        0.0,
    )
    # step 1: classifier, extractor generated once and fixed
    t0 = time.perf_counter()
    with torch.no_grad():
        for k, w in hnet(emb).items():
            model.features.get_parameter(k).copy_(w)
    t["generate"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    opt = _sgd(model.head.parameters(), 0.1, fused)
    for idx in batches(len(y_all), 50, gen):
        opt.zero_grad()
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
    t["classifier_epoch"] += time.perf_counter() - t0
    # step 2: hypernetwork + embedding, 5 epochs
    params = [*hnet.parameters(), emb]
    opt = _sgd(params, 0.01, fused)
    for _ in range(5):
        for idx in batches(len(y_all), 50, gen):
            t0 = time.perf_counter()
            opt.zero_grad()
            weights = hnet(emb)
            t1 = time.perf_counter()
            logits = model.head(functional_call(model.features, weights, (x_all[idx],)))
            F.cross_entropy(logits, y_all[idx]).backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 50.0)
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            t["generate"] += t1 - t0
            t["forward_backward"] += t2 - t1
            t["clip"] += t3 - t2
            t["optimizer_step"] += t4 - t3
    t0 = time.perf_counter()
    _ = {k: v.detach().to("cpu", copy=True) for k, v in hnet.state_dict().items()}
    t["upload"] = time.perf_counter() - t0
    t["hyperfl_total"] = sum(t.values())
    # FedAvg: the CNN itself, 5 epochs
    fed = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    opt = _sgd(fed.parameters(), 0.01, fused)
    t0 = time.perf_counter()
    for _ in range(5):
        for idx in batches(len(y_all), 50, gen):
            opt.zero_grad()
            F.cross_entropy(fed(x_all[idx]), y_all[idx]).backward()
            opt.step()
    t["fedavg_total"] = time.perf_counter() - t0
    return {k: round(v, 4) for k, v in t.items()}


def per_round(config: str, rounds: int, data=None):  # type: ignore[no-untyped-def]
    cfg = load_config(REPO / "sweeps/configs" / config, ["workers=2", "eval_every=1000"])
    data = data or build_data(cfg)
    it = build_engine(cfg, data=data).iter_rounds()
    seconds = [next(it).metrics["round_seconds"] for _ in range(rounds)]
    it.close()
    return seconds, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-rounds", action="store_true", help="only the breakdown")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(REPO / "sweeps/configs/hyperfl_fmnist.yaml", [])
    data = build_data(cfg)
    out: dict[str, object] = {"machine": machine()}
    out["breakdown_fused"] = breakdown(data, fused=True)
    out["breakdown_loop"] = breakdown(data, fused=False)
    b = out["breakdown_fused"]
    assert isinstance(b, dict)
    out["client_ratio_hyperfl_over_fedavg"] = round(b["hyperfl_total"] / b["fedavg_total"], 2)
    if not args.skip_rounds:
        runs: dict[str, list[float]] = {"fedavg": [], "hyperfl": []}
        for _ in range(args.repeats):
            s, data = per_round("fedavg_fmnist.yaml", args.rounds, data)
            runs["fedavg"] += s[1:]
            s, data = per_round("hyperfl_fmnist.yaml", args.rounds, data)
            runs["hyperfl"] += s[1:]
        med = {k: statistics.median(v) for k, v in runs.items()}
        out["round_seconds"] = runs
        out["round_median"] = med
        out["round_ratio_hyperfl_over_fedavg"] = round(med["hyperfl"] / med["fedavg"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
