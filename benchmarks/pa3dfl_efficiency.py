"""Pa3dFL's Table 2: FLOPs, peak memory and model size of one client's training, by capacity.

For capacity ratios r = 1/256, 1/64, 1/4, 1 (widths p = 1/16, 1/8, 1/2, 1 by flcore.capacity's
rule, p_min 1/16) it measures, with flcore/models/cost.py's ``training_cost`` (FLOPs of the
forward and backward pass of one batch; peak memory of one SGD step; parameters):

- ``p-width``: the plain width-p model (what FjORD, HeteroFL, FedRolex, TailorFL train);
- ``pa3dfl``: Pa3dFL's client network, ``ALGORITHMS.get("pa3dfl").cost_model`` (its decomposed
  width-p network), when flcore/algorithms/widths/pa3dfl.py is there; else the output says
  ``pa3dfl not available``.

on the CIFAR-100 CNN (``pa3dfl_cnn_cifar100``) at batch 128, the paper's setting, and on the
Fashion-MNIST CNN (``pa3dfl_cnn_fmnist``) at batch 128. The Fashion-MNIST batch is 128 real
training records; CIFAR-100 cannot be downloaded here, so its batch is zeros of the right shape
(3 x 32 x 32, labels 0): FLOPs and memory do not depend on pixel values. Model size is
parameters x 4 bytes (float32). On the CPU peak memory is the profiler's (the paper's MB were
presumably measured on a GPU: compare ratios between widths, not absolute MB). The paper's
figures (``analysis.paper.PA3DFL_EFFICIENCY``, CIFAR-100) are printed beside ours. One JSON
object on stdout, with the machine.

    .venv/bin/python benchmarks/pa3dfl_efficiency.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

from analysis.paper import PA3DFL_EFFICIENCY  # noqa: E402

RATIOS = (1 / 256, 1 / 64, 1 / 4, 1.0)
BATCH = 128
MODELS = {"cifar100": "pa3dfl_cnn_cifar100", "fmnist": "pa3dfl_cnn_fmnist"}


def _pa3dfl_class() -> Any:
    """Pa3dFL's algorithm class, or None where its module is not there (yet)."""
    from flcore.algorithms import ALGORITHMS

    if "pa3dfl" not in ALGORITHMS:
        try:
            import flcore.algorithms.widths.pa3dfl  # noqa: F401
        except ImportError:
            return None
    return ALGORITHMS.get("pa3dfl") if "pa3dfl" in ALGORITHMS else None


def _batch(dataset: str, data_root: str | None) -> tuple[Any, Any, str]:
    import torch

    from flcore.data import DATASET_INFO, load_dataset, normalize

    info = DATASET_INFO[dataset]
    if dataset == "fmnist":
        splits = load_dataset("fmnist", data_root)
        x = normalize(splits.train.images[:BATCH], info)
        return x, splits.train.labels[:BATCH].long(), "128 real Fashion-MNIST training records"
    shape = (BATCH, info.in_channels, info.image_size, info.image_size)
    return (
        torch.zeros(shape),
        torch.zeros(BATCH, dtype=torch.long),
        "zeros (CIFAR-100 cannot be downloaded here; FLOPs and memory do not depend on pixels)",
    )


def measure(dataset: str, data_root: str | None, device: str) -> dict[str, Any]:
    """Every method's cost at every ratio on ``dataset``'s Pa3dFL CNN."""
    import torch

    from flcore.algorithms import LocalTraining, ModelSpec
    from flcore.capacity import make_capacity
    from flcore.data import DATASET_INFO
    from flcore.models.cost import training_cost

    info = DATASET_INFO[dataset]
    x, y, batch_note = _batch(dataset, data_root)
    x, y = x.to(device), y.to(device)
    spec = ModelSpec(MODELS[dataset], info.num_classes, info.in_channels)
    capacity = make_capacity("fixed", num_clients=len(RATIOS), seed=0, ratios=list(RATIOS))
    builders: dict[str, Any] = {"p-width": lambda cid: spec(width=capacity.width(cid))}
    pa3dfl = _pa3dfl_class()
    if pa3dfl is not None:
        alg = pa3dfl(
            model_spec=spec,
            training=LocalTraining(epochs=1, batch_size=BATCH, lr=0.05),
            num_clients=len(RATIOS),
            seed=0,
            device=device,
            capacity=capacity,
        )
        builders["pa3dfl"] = alg.cost_model
    rows: dict[str, list[dict[str, Any]]] = {}
    for method, build in builders.items():
        rows[method] = []
        for cid, ratio in enumerate(RATIOS):
            torch.manual_seed(0)
            cost = training_cost(build(cid).to(device), x, y)
            rows[method].append(
                {
                    "ratio": ratio,
                    "width": capacity.width(cid),
                    "flops_1e7": round(cost["flops"] / 1e7, 2),
                    "peak_memory_mb": round(cost["peak_memory_bytes"] / 2**20, 2),
                    "model_size_0.1mb": round(cost["params"] * 4 / 2**20 * 10, 3),
                    **cost,
                }
            )
    out: dict[str, Any] = {
        "model": MODELS[dataset],
        "batch": BATCH,
        "batch_data": batch_note,
        "device": device,
        "results": rows,
    }
    if pa3dfl is None:
        out["pa3dfl"] = "pa3dfl not available"
    if dataset == "cifar100":  # the paper's Table 2 is on CIFAR-100
        keys = ("flops_1e7", "peak_memory_mb", "model_size_0.1mb")
        out["paper"] = {
            m: [{"ratio": r, **dict(zip(keys, v, strict=True))} for r, v in by_ratio.items()]
            for m, by_ratio in PA3DFL_EFFICIENCY.items()
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--data-root", default=None, help="Fashion-MNIST's root (default: flcore's)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    result = {
        "machine": machine(),
        "ratios": list(RATIOS),
        "model_size": "parameters x 4 bytes (float32)",
        **{d: measure(d, args.data_root, args.device) for d in args.datasets},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
