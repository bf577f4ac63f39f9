"""How long gradient inversion takes on this machine: IG (Geiping et al. 2020) for 1,000
iterations on 28x28 Fashion-MNIST records, one torch thread (as the evaluation runs it).

Cases: the paper's FMNIST CNN under FedAvg (the whole model uploaded), one record alone and ten
records optimised together (one vmap pass), and HyperFL (a 14.9M-parameter hypernetwork
uploaded; matched in factored form), one and ten records. Each upload is a real one-step,
one-record update of the round-6 model (5 rounds trained, 2 clients x 100 records) through the
algorithm's own local update. Prints JSON.

    .venv/bin/python benchmarks/attack_speed.py --iterations 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402

from flcore.attacks import ATTACKS  # noqa: E402
from flcore.config import validate_config  # noqa: E402
from flcore.experiment import build_data  # noqa: E402
from flcore.testing.attack_contract import observations  # noqa: E402


def case(algorithm: str, records: int, iterations: int, data_root: str | None) -> dict:  # type: ignore[type-arg]
    raw = {
        "algorithm": algorithm,
        "num_clients": 2,
        "samples_per_client": 100,
        "test_samples_per_client": 20,
        "rounds": 6,
        "local_epochs": 1,
        "workers": 1,
        "seed": 0,
    } | ({"data_root": data_root} if data_root else {})
    cfg = validate_config(raw)
    # five rounds first: HyperFL's first rounds start from huge generated weights whose
    # gradients vanish, and an upload without a gradient is a target of rounding noise
    engine, task, _, evaluator = observations(cfg, build_data(cfg), train_rounds=5)
    evaluator.settings = type(evaluator.settings)(
        **{**vars(evaluator.settings), "images": records, "labels": "given"}
    )
    obs, _ = evaluator.observe(engine, task.round, task)
    attack = ATTACKS.create("ig", params={"iterations": iterations})
    start = time.perf_counter()
    attack.reconstruct_many(obs)
    seconds = time.perf_counter() - start
    prepared = obs[0].surface.prepare_targets([o.target() for o in obs])
    ranks = [v.shape[-1] for k, v in prepared.items() if k.endswith(".weight.U")]
    return {
        # HyperFL: columns kept of its largest head's factored target (rank 1 for a real
        # one-record gradient; 128, the full width, when the upload holds no gradient above
        # float32 rounding, e.g. after step 1 fitted the head to the one record)
        "target_rank": max(ranks) if ranks else None,
        "algorithm": algorithm,
        "records": records,
        "iterations": iterations,
        "seconds": round(seconds, 2),
        "ms_per_iteration": round(1000 * seconds / iterations, 2),
        "seconds_per_record": round(seconds / records, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [
        case(alg, n, args.iterations, args.data_root)
        for alg in ("fedavg", "hyperfl")
        for n in (1, 10)
    ]
    print(json.dumps({"machine": machine(), "ig": rows}, indent=1))


if __name__ == "__main__":
    main()
