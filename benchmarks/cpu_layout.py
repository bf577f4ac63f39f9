"""What the channels-last image layout (``flcore.data.conv_layout``) buys on the CPU.

One client's local update (``local_update``: its training epochs, no evaluation) from Pa3dFL's
FMNIST configs, timed with the training loop's images channels-last (the default on the CPU) and
in torch's default layout, interleaved (default, channels-last, default) ``--reps`` times so a
shared machine's drift hits both; and one second-order MAML meta-gradient of the CONV4 learner
(5-way 5-shot, 5 inner steps), which ``conv_layout`` is not applied to, both ways. Prints one
JSON object: seconds per case and layout, and the speedup (default / channels-last, from the
medians). Needs flcore only.

    .venv/bin/python benchmarks/cpu_layout.py --threads 1 --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "sweeps" / "configs" / "pa3dfl"
CASES = ("fmnist_ideal_fedavg", "fmnist_hetero_heterofl", "fmnist_hetero_pa3dfl")


def _local_update(name: str, overrides: list[str]) -> Any:
    """A closure timing client 0's local update of config ``name`` (round 1)."""
    from flcore.algorithms import ClientData, ClientTask
    from flcore.config import load_config
    from flcore.executor import client_generator
    from flcore.experiment import build_data, build_engine

    cfg = load_config(CONFIGS / f"{name}.yaml", ["workers=1", *overrides])
    fed = build_data(cfg)
    engine = build_engine(cfg, data=fed)
    alg = engine.algorithm
    data = ClientData(0, fed.client_train(0), fed.client_test(0), fed.info, fed.client_val(0))

    def once() -> float:
        alg.begin_round(1, [0])
        task = ClientTask(0, 1, alg.broadcast(1, 0), engine.client_states.get(0), False, 0)
        start = time.perf_counter()
        alg.local_update(data, task, client_generator(0, 1, 0))
        return time.perf_counter() - start

    return once


def _meta_gradient() -> Any:
    import torch

    from flcore.algorithms.meta.maml import meta_gradient
    from flcore.models import MODELS

    torch.manual_seed(0)
    model = MODELS.create("conv4", num_classes=5, in_channels=1)
    w = {k: v.detach().clone() for k, v in model.named_parameters()}
    # shapes only matter for the timing: a 5-way 5-shot task with 15 queries a class
    support = (torch.randn(25, 1, 28, 28), torch.randint(0, 5, (25,)))
    query = (torch.randn(75, 1, 28, 28), torch.randint(0, 5, (75,)))
    state = {"channels_last": False}

    def once() -> float:
        fmt = torch.channels_last if state["channels_last"] else torch.contiguous_format
        s = (support[0].to(memory_format=fmt), support[1])
        q = (query[0].to(memory_format=fmt), query[1])
        start = time.perf_counter()
        meta_gradient(model, w, s, q, steps=5, lr=0.01, first_order=False)
        return time.perf_counter() - start

    return once, state


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=[*CASES, "maml"], choices=[*CASES, "maml"])
    ap.add_argument("--set", action="append", default=[], help="key=value config overrides")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.reps < 1:
        ap.error("--threads and --reps must be at least 1")

    import torch

    import flcore.algorithms.training as training

    torch.set_num_threads(args.threads)
    layout = training.conv_layout

    def plain(x: Any, device: Any) -> Any:
        return x

    out: dict[str, Any] = {"machine": machine(), "threads": args.threads, "cases": {}}
    for case in args.cases:
        if case == "maml":
            once, state = _meta_gradient()

            def switch(on: bool, state: dict[str, bool] = state) -> None:
                state["channels_last"] = on
        else:
            once = _local_update(case, args.set)

            def switch(on: bool) -> None:
                training.conv_layout = layout if on else plain  # type: ignore[assignment]

        switch(True)
        once()  # warm-up: allocations, kernel selection
        times: dict[str, list[float]] = {"default": [], "channels_last": []}
        for _ in range(args.reps):
            for on in (False, True, False):
                switch(on)
                times["channels_last" if on else "default"].append(once())
        switch(True)
        med = {k: statistics.median(v) for k, v in times.items()}
        out["cases"][case] = {
            "seconds": {k: [round(t, 4) for t in v] for k, v in times.items()},
            "speedup": round(med["default"] / med["channels_last"], 3),
        }
        print(f"{case}: {out['cases'][case]['speedup']}x", file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
