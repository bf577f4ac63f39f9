"""How strong FedMD's digest term is beside the cross-entropy, at FedHKD's lambda_md 0.05.

FedHKD (App. A.1) weights FedMD's distillation with lambda_md = 0.05 for a distance between
temperature-0.5 soft predictions (probabilities: at most 2 per record); ours is the squared L2
distance between logits (flcore/algorithms/fedmd.py), which has no such bound. This runs
``sweeps/configs/fedhkd/fmnist_fedmd.yaml`` (10 clients, Dirichlet ``--beta``) for ``--rounds``
rounds and, after each, measures what the next round's local training starts from (the
averaged model every client receives, the round's consensus): the cross-entropy over each
client's training records (their mean), and ``lambda_md`` times the mean over the public set of
``||f(x_p) - c(x_p)||^2``, the term each client's objective adds (the same for every client at
that point); and the same term where each client's local training ended (its uploaded logits
against the consensus it digested, the previous round's; from round 2), averaged over the
clients. One JSON object on stdout (per round: the three, the ratios, and the round's
``accuracy`` and ``global_accuracy``). Needs flcore only.

    .venv/bin/python benchmarks/fedmd_term_scale.py --beta 0.2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "sweeps" / "configs" / "fedhkd" / "fmnist_fedmd.yaml"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beta", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="key=value config overrides")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    import torch
    import torch.nn.functional as F

    from flcore.algorithms.fedmd import CONSENSUS, LOGITS, FedMD
    from flcore.config import load_config
    from flcore.data import normalize
    from flcore.experiment import build_data, build_engine

    over = [f"seed={args.seed}", f"workers={args.workers}", f"partition.beta={args.beta}"]
    cfg = load_config(CONFIG, [*over, f"rounds={args.rounds + 1}", *args.set])
    data = build_data(cfg)
    engine = build_engine(cfg, data=data)
    algo = engine.algorithm
    lam = float(algo.params.lam)  # type: ignore[attr-defined]
    public = data.public_set()
    assert public is not None
    public_x = normalize(public.images, data.info)
    rows: list[dict[str, Any]] = []
    uploaded: list[torch.Tensor] = []  # the round's clients' logits on the public set
    assert isinstance(algo, FedMD)
    accumulate = algo.accumulate

    def recorded(result: Any) -> None:
        uploaded.append(result.upload[LOGITS].detach().clone())
        accumulate(result)

    algo.accumulate = recorded  # type: ignore[method-assign]  # this engine's server only
    digested = None  # the consensus this round's clients trained towards
    rounds = engine.iter_rounds()
    for result in rounds:
        end = None
        if digested is not None:
            gaps = [(u - digested).pow(2).sum(1).mean().item() for u in uploaded]
            end = lam * statistics.fmean(gaps)
        uploaded.clear()
        payload = algo.broadcast(result.round + 1, 0)
        consensus = payload.pop(CONSENSUS)
        model = algo.client_model()
        model.load_state_dict(payload)
        model.eval()
        ces = []
        with torch.no_grad():
            term = lam * (model(public_x) - consensus).pow(2).sum(1).mean().item()
            for i in range(data.num_clients):
                train = data.client_train(i)
                logits = model(normalize(train.images, data.info))
                ces.append(F.cross_entropy(logits, train.labels).item())
        ce = statistics.fmean(ces)
        rows.append({"round": result.round, "cross_entropy": ce, "digest_term": term,
                     "ratio": term / ce, "digest_term_end": end,
                     "ratio_end": None if end is None else end / ce,
                     "accuracy": result.metrics.get("accuracy"),
                     "global_accuracy": result.metrics.get("global_accuracy")})  # fmt: skip
        digested = consensus
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if result.round >= args.rounds:
            break
    rounds.close()
    out = {"machine": machine(), "config": str(CONFIG.name), "beta": args.beta, "seed": args.seed,
           "lambda_md": lam, "rounds": rows}  # fmt: skip
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
