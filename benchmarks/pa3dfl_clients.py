"""What one more round gives chosen clients of a Table 1 run: its checkpoint, re-entered.

Loads the engine of a run that ``reproduce_pa3dfl_table1.py`` left in ``--run-dir`` (its
``checkpoint.pt``, the config ``sweeps/configs/pa3dfl/fmnist_<setting>_<method>.yaml`` with the
run's ``--set`` overrides and seed), and runs one evaluated local update, as the next round
would, for every client of the chosen widths (``--widths``; default: the two narrowest and the
widest of the run's capacities). Nothing is written: the checkpoint and the run stay as they
are. Prints one JSON object: the machine, the run, and per client its width (its capacity's;
``model_width``: the width it trains, min_i p_i for a capacity-unaware method), ``train_loss``
(the mean over its local steps) and the accuracies the round measures (``accuracy_before``:
the model it receives; ``accuracy``: the model it deploys after training; ``val_*`` likewise);
for Pa3dFL also its trained network's mean feature norm and each head's cross-entropy and
accuracy on the client's own training records (``train_*_global_head``: the frozen global
head; ``train_*_local_head``: the generated local head), and ``global_head_class_share``: per
class, the share of uniformly drawn non-negative features (ReLU outputs, up to the largest
measured) on which the frozen head gives that class the largest logit.

Why: Table 1 is a mean over clients, and the per-width clusters (``--summary``) show whom a
method serves. This says why a cluster scores what it does: a training loss far above the
other clusters' (Pa3dFL's width-1/8 clients at seed 0, BENCHMARKS.md) is a model that cannot
fit its own records, not one that overfits them. Needs flcore only.

    .venv/bin/python benchmarks/pa3dfl_clients.py --method pa3dfl --setting hetero --seed 0 \\
        --run-dir ~/.cache/fedsweep-runs/pa3dfl/hetero-pa3dfl-r500-s0
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

CONFIGS = Path(__file__).resolve().parents[1] / "sweeps" / "configs" / "pa3dfl"
#: random non-negative feature vectors behind ``global_head_class_share``
SHARE_DRAWS = 200_000


def probe(
    run_dir: Path, config: Path, overrides: list[str], widths: list[float] | None
) -> dict[str, Any]:
    """One evaluated local update of every client of ``widths`` from the run's checkpoint."""
    import torch

    from flcore.algorithms.base import ClientTask
    from flcore.config import load_config
    from flcore.executor import client_data, client_generator
    from flcore.experiment import build_capacity, build_data, build_engine

    ckpt = run_dir / "checkpoint.pt"
    if not ckpt.is_file():
        raise SystemExit(f"no checkpoint.pt in {run_dir}")
    cfg = load_config(config, [*overrides, "workers=1"])
    capacity = build_capacity(cfg)
    if capacity is None:
        raise SystemExit(f"{config} has no capacity setting: there are no width clusters")
    levels = list(capacity.levels)
    chosen = widths if widths else sorted({*levels[:2], levels[-1]})
    unknown = [w for w in chosen if w not in levels]
    if unknown:
        raise SystemExit(f"no client of width {unknown}; the run's widths are {levels}")
    data = build_data(cfg)
    engine = build_engine(cfg, data=data)
    engine.load_state_dict(torch.load(ckpt, weights_only=False))
    alg, r = engine.algorithm, engine.round + 1
    clients = [c for w in chosen for c in capacity.clients_of(w)]
    alg.begin_round(r, clients)
    rows = []
    for cid in clients:
        task = ClientTask(cid, r, alg.broadcast(r, cid), engine.client_states[cid], True, cfg.seed)
        cd = client_data(data, cid)
        result = alg.local_update(cd, task, client_generator(cfg.seed, r, cid))
        rows.append(
            {"client": cid, "width": capacity.width(cid), "model_width": alg.client_width(cid)}
            | {k: v for k, v in sorted(result.metrics.items()) if "acc" in k or "loss" in k}
            | _heads(getattr(alg, "_client_model", None), cd)
        )
        print(f"client {cid} (width {capacity.width(cid):g}) done", file=sys.stderr, flush=True)
    return {"round": r, "widths": chosen, "clients": rows}


def _heads(net: Any, cd: Any) -> dict[str, Any]:
    """Pa3dFL's two heads on the client's own training records, after the round's training
    (its trained network, :class:`~flcore.algorithms.widths.decomposed.DecomposedNet`): the
    mean feature norm, and the cross-entropy and accuracy of the frozen global head
    (``head``) and of the generated local head. Empty for other algorithms."""
    import torch
    import torch.nn.functional as F

    from flcore.data import normalize

    if net is None or not hasattr(net, "local_head") or not hasattr(net, "head"):
        return {}
    x, y = normalize(cd.train.images, cd.info), cd.train.labels
    net.eval()
    with torch.no_grad():
        param = next(net.parameters())
        f = net.features(x.to(param.device))
        y = y.to(param.device)
        out = {"train_feature_norm": float(f.norm(dim=1).mean())}
        for name, head in (("global_head", net.head), ("local_head", net.local_head)):
            logits = head(f)
            out[f"train_ce_{name}"] = float(F.cross_entropy(logits, y))
            out[f"train_accuracy_{name}"] = float((logits.argmax(1) == y).float().mean())
        # the share of non-negative features (uniform on [0, max feature]^d, as ReLU outputs)
        # where each class has the frozen head's largest logit: how much room it leaves a class
        g = torch.Generator().manual_seed(0)
        z = torch.rand(SHARE_DRAWS, f.shape[1], generator=g).to(f.device) * f.max()
        wins = torch.bincount(net.head(z).argmax(1), minlength=net.head.out_features)
        out["global_head_class_share"] = [float(w) / SHARE_DRAWS for w in wins]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--setting", choices=["ideal", "hetero"], default="hetero")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, help="the run's rounds, if not the config's 500")
    ap.add_argument("--set", action="append", default=[], help="the run's key=value overrides")
    ap.add_argument("--widths", type=float, nargs="+", help="default: two narrowest, widest")
    args = ap.parse_args(argv)
    config = CONFIGS / f"fmnist_{args.setting}_{args.method}.yaml"
    if not config.is_file():
        ap.error(f"no config {config}")
    over = [f"seed={args.seed}", *args.set]
    if args.rounds is not None:
        over.append(f"rounds={args.rounds}")
    out = probe(args.run_dir, config, over, args.widths)
    print(json.dumps({"machine": machine(), "run": str(args.run_dir), **out}, indent=1))


if __name__ == "__main__":
    main()
