"""What Pa3dFL's frozen global head leaves a narrow network able to learn, federation aside.

Pa3dFL fixes its global head at a seeded random value (FedBABU, the paper's [22]); at width p a
client's network ends in ``p T`` ReLU features (8 of 128 at width 1/16 on the FMNIST CNN) and the
head reads the first ``p T`` of its inputs (``flcore.algorithms.widths.pa3dfl
.fixed_global_head``). Pa3dFL's narrowest clients score well below FedAvg's shared model of the
same width on the same clients (BENCHMARKS.md, sessions 31-33 and 67). This script asks whether
the head alone explains it, with no federation, hypernetwork or decomposition: for each run seed
(the head is seeded from it) and each width it trains Table 4's plain width-p CNN
(``pa3dfl_cnn_fmnist``) centrally on ``--train-records`` records drawn from FMNIST's training set,
plain SGD, batch 50, ``--epochs`` epochs at ``--lr``, from one seeded initialisation, twice:

- ``frozen``: cross-entropy through Pa3dFL's frozen global head at that width (the loss
  Algorithm 3 trains the feature extractor with); then ``frozen_probe``: the best linear head
  for those trained features, fitted by L-BFGS on the training records' features (standardised;
  what a perfectly trained local head on detached features could reach);
- ``trained``: the same start, the head trained too (FedAvg's width-p model, centrally).

For each it reports the test accuracy on FMNIST's 10,000 test records, the accuracy and mean
cross-entropy on the training records, the lowest per-class test recall, and for the frozen head
``reachable_classes``: how many classes the head can make the arg-max at all from non-negative
features (one linear program per class: some ``x >= 0``, each coordinate at most
``REACH_BOUND``, on which the class's logit exceeds every other by a positive margin).
``--nested`` asks the next question, still without federation: does Pa3dFL's nesting cost its
narrow clients more through the frozen head? It trains one full-width network per seed whose
mini-batches each train the submodel of a width drawn from that seed's 100 Hetero clients (the
widths Pa3dFL's clients train at, each as often as its clients are many), through the frozen
head and with the head trained, and evaluates each of ``--widths`` as its own submodel
(``nested_run``; FjORD's federated width-p submodels, which also nest but train their head, are
the federated counterpart). Its file is ``frozen-head-nested-n<records>-e<epochs>-lr<lr>.json``.
``--width-draw upto`` draws each step's width uniformly up to the drawn client's instead (FjORD's
draw, no distillation), so every client also trains the narrow widths; its file name ends in
``-upto``.

One JSON object on stdout; progress on stderr. Each (seed, width), or each seed under
``--nested``, is also written, as it ends, to ``--out-dir`` (default
``~/.cache/fedsweep-runs/pa3dfl``), in a file named by the training settings,
``frozen-head-n<records>-e<epochs>-lr<lr>.json``: one already there is not run again (delete
the file to start over), so an interrupted run goes on where it stopped. Needs
flcore (and scipy) only.

    .venv/bin/python benchmarks/pa3dfl_frozen_head.py --seeds 0 1 2 --widths 0.0625 0.125 0.25 1
    .venv/bin/python benchmarks/pa3dfl_frozen_head.py --nested --seeds 0 1 2 \
        --train-records 48000 --epochs 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402

#: the box the reachability program searches for features in (a trained network's mean feature
#: norm at width 1/8 was about 200, BENCHMARKS.md session 31)
REACH_BOUND = 1e4
BATCH = 50
_INIT_SEED = 0xF20  # the network's initialisation, per run seed
_DATA_SEED = 0xF21  # which training records, and their order
_DRAW_OFFSET = 0xF22  # --nested: the stream of each step's client width
P_MIN = 1 / 16  # Table 1's width step
OUT_DIR = Path.home() / ".cache" / "fedsweep-runs" / "pa3dfl"


def reachable_classes(
    weight: np.ndarray, bias: np.ndarray, bound: float = REACH_BOUND
) -> list[bool]:
    """Per class c of the linear head ``weight x + bias``: whether some ``x`` in ``[0, bound]^n``
    gives c a logit above every other class's by a positive margin (a linear program: maximise
    the margin ``t`` subject to ``(w_k - w_c) x + t <= b_c - b_k`` for every k != c)."""
    from scipy.optimize import linprog

    classes, n = weight.shape
    out = []
    for c in range(classes):
        others = [k for k in range(classes) if k != c]
        a_ub = np.hstack([weight[others] - weight[c], np.ones((len(others), 1))])
        b_ub = bias[c] - bias[others]
        res = linprog(
            np.r_[np.zeros(n), -1.0],
            A_ub=a_ub,
            b_ub=b_ub,
            bounds=[(0.0, bound)] * n + [(None, None)],
            method="highs",
        )
        if res.status != 0:
            raise RuntimeError(f"the reachability program for class {c} failed: {res.message}")
        out.append(bool(-res.fun > 1e-9))
    return out


def _features(model: Any, x: Any) -> Any:
    """``model``'s features (the head's inputs) of every record of ``x``, without gradients."""
    import torch

    with torch.no_grad():
        return torch.cat([model.features(x[i : i + 1000]) for i in range(0, len(x), 1000)])


def _evaluate(model: Any, head: Any, x: Any, y: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        logits = head(_features(model, x))
    pred = logits.argmax(1)
    recall = [float((pred[y == c] == c).float().mean()) for c in range(logits.shape[1])]
    return {
        "accuracy": 100.0 * float((pred == y).float().mean()),
        "cross_entropy": float(F.cross_entropy(logits, y)),
        "min_class_recall": 100.0 * min(recall),
    }


def _train(model: Any, head: Any, x: Any, y: Any, epochs: int, lr: float, gen: Any) -> None:
    import torch
    import torch.nn.functional as F

    params = [p for p in (*model.features.parameters(), *head.parameters()) if p.requires_grad]
    opt = torch.optim.SGD(params, lr=lr)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), BATCH):
            idx = order[i : i + BATCH]
            opt.zero_grad()
            F.cross_entropy(head(model.features(x[idx])), y[idx]).backward()
            opt.step()


def _probe(model: Any, x: Any, y: Any, classes: int) -> Any:
    """The best linear head on ``model``'s (standardised) features of ``x``: multinomial logistic
    regression by L-BFGS, with a small L2 term so that separable features keep a finite optimum.
    Returns the fitted head, a function of the raw features."""
    import torch
    import torch.nn.functional as F

    f = _features(model, x)
    mean, std = f.mean(0), f.std(0).clamp_min(1e-6)
    z = ((f - mean) / std).double()
    w = torch.zeros(z.shape[1], classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(z @ w + b, y) + 1e-4 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    w_, b_ = w.detach().float(), b.detach().float()

    def head(feats: Any) -> Any:
        return ((feats - mean) / std) @ w_ + b_

    return head


def one_width(
    seed: int,
    width: float,
    data: tuple[Any, Any, Any, Any],
    epochs: int,
    lr: float,
) -> dict[str, Any]:
    """The frozen-head, probe and trained-head runs of one seed and width."""
    import copy

    import torch

    from flcore.algorithms.base import seeded
    from flcore.algorithms.widths.pa3dfl import fixed_global_head
    from flcore.models.scalable import ScalableCNNFashionMNIST

    def plain(w: float) -> Any:
        return ScalableCNNFashionMNIST(width=w)

    x, y, x_test, y_test = data
    start = seeded((seed, _INIT_SEED), lambda: plain(width))
    frozen_head = fixed_global_head(plain, seed, width)
    reach = reachable_classes(
        frozen_head.weight.detach().double().numpy(), frozen_head.bias.detach().double().numpy()
    )
    row: dict[str, Any] = {
        "seed": seed,
        "width": width,
        "features": frozen_head.in_features,
        "reachable_classes": int(sum(reach)),
        "unreachable": [c for c, ok in enumerate(reach) if not ok],
    }
    for name in ("frozen", "trained"):
        t0 = time.perf_counter()
        model = copy.deepcopy(start)
        head = copy.deepcopy(frozen_head)
        if name == "trained":
            head.requires_grad_(True)
        gen = torch.Generator().manual_seed(seed)
        _train(model, head, x, y, epochs, lr, gen)
        model.eval()
        row[name] = {
            "train": _evaluate(model, head, x, y),
            "test": _evaluate(model, head, x_test, y_test),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if name == "frozen":
            norms = _features(model, x).norm(dim=1)
            row["frozen"]["mean_feature_norm"] = float(norms.mean())
            probe = _probe(model, x, y, frozen_head.out_features)
            row["frozen_probe"] = {
                "train": _evaluate(model, probe, x, y),
                "test": _evaluate(model, probe, x_test, y_test),
            }
    return row


def client_widths(seed: int) -> list[float]:
    """The 100 Hetero clients' widths of run seed ``seed`` (Table 1's capacity draw)."""
    from flcore.capacity import make_capacity

    return list(make_capacity("uniform", num_clients=100, seed=seed).widths)


def step_width(pool: list[float], draw: str, stream: Any) -> float:
    """One step's width: a client's drawn uniformly from ``pool`` and, under ``draw="upto"``, a
    multiple of ``P_MIN`` drawn uniformly up to it (both from the generator ``stream``)."""
    import torch

    w = pool[int(torch.randint(len(pool), (1,), generator=stream))]
    if draw == "upto":
        w = P_MIN * (1 + int(torch.randint(round(w / P_MIN), (1,), generator=stream)))
    return w


def nested_run(
    seed: int,
    widths: list[float],
    data: tuple[Any, Any, Any, Any],
    epochs: int,
    lr: float,
    draw: str = "own",
) -> dict[str, Any]:
    """One full-width network per head, trained as Pa3dFL's nested clients share it, federation,
    hypernetwork and decomposition aside: each mini-batch trains the width-p submodel (the first
    ``p C`` channels of every layer, :mod:`flcore.algorithms.widths.slicing`) at the width of a
    client drawn uniformly from seed ``seed``'s 100 Hetero clients (every client holds as many
    records), through Pa3dFL's frozen global head (``frozen``; its first ``p T`` inputs at width
    p) or with the head trained too (``trained``; the same full head, sliced the same way). Each
    of ``widths`` is then evaluated as its own submodel, and for the frozen run the best linear
    head on that submodel's features (``frozen_probe``). ``draw="upto"`` trains instead, at
    each step, a width drawn uniformly from the multiples of 1/16 up to the drawn client's
    width (FjORD's ordered-dropout draw, without its distillation): what Pa3dFL's nesting would
    give its narrow widths if every client also trained them."""
    import copy

    import torch
    import torch.nn.functional as F
    from torch.func import functional_call

    from flcore.algorithms.base import seeded
    from flcore.algorithms.widths.pa3dfl import fixed_global_head
    from flcore.algorithms.widths.slicing import extract, nested_channels
    from flcore.models.scalable import ScalableCNNFashionMNIST

    def plain(w: float) -> Any:
        return ScalableCNNFashionMNIST(width=w)

    x, y, x_test, y_test = data
    pool = client_widths(seed)
    axes, full_channels = (
        ScalableCNNFashionMNIST.CHANNEL_AXES,
        ScalableCNNFashionMNIST.FULL_CHANNELS,
    )
    grid = [k * P_MIN for k in range(1, round(1 / P_MIN) + 1)]
    kept = {w: nested_channels(full_channels, w) for w in {*pool, *widths, *grid}}
    templates = {w: plain(w) for w in kept}
    start = seeded((seed, _INIT_SEED), lambda: plain(1.0))
    frozen_head = fixed_global_head(plain, seed, 1.0)
    counts = {f"{w:g}": pool.count(w) for w in sorted(set(pool))}
    row: dict[str, Any] = {"seed": seed, "mode": "nested", "draw": draw, "client_widths": counts}
    for name in ("frozen", "trained"):
        t0 = time.perf_counter()
        full = copy.deepcopy(start)
        if name == "frozen":
            full.head.load_state_dict(frozen_head.state_dict())
            full.head.requires_grad_(False)
        head0 = full.head.weight.detach().clone()
        params = dict(full.named_parameters())
        opt = torch.optim.SGD([p for p in params.values() if p.requires_grad], lr=lr)
        gen = torch.Generator().manual_seed(seed)  # the record order, as in one_width
        stream = torch.Generator().manual_seed(seed + _DRAW_OFFSET)  # each step's width
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=gen)
            for i in range(0, len(x), BATCH):
                idx = order[i : i + BATCH]
                w = step_width(pool, draw, stream)
                sub = extract(params, axes, kept[w])
                logits = functional_call(templates[w], sub, (x[idx],))
                opt.zero_grad()
                F.cross_entropy(logits, y[idx]).backward()
                opt.step()
        result: dict[str, Any] = {
            "seconds": round(time.perf_counter() - t0, 1),
            # how far the head moved in training: 0 for the frozen head
            "head_change": float((full.head.weight.detach() - head0).abs().max()),
        }
        probes: dict[str, Any] = {}
        for w in widths:
            model = plain(w)
            model.load_state_dict(extract(full.state_dict(), axes, kept[w]))
            model.eval()
            result[f"{w:g}"] = {
                "train": _evaluate(model, model.head, x, y),
                "test": _evaluate(model, model.head, x_test, y_test),
            }
            if name == "frozen":
                probe = _probe(model, x, y, model.head.out_features)
                probes[f"{w:g}"] = {
                    "train": _evaluate(model, probe, x, y),
                    "test": _evaluate(model, probe, x_test, y_test),
                }
        row[name] = result
        if name == "frozen":
            row["frozen_probe"] = probes
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--widths", type=float, nargs="+", default=[0.0625, 0.125, 0.25, 1.0])
    ap.add_argument("--train-records", type=int, default=12_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.05, help="FedAvg's Table 7 step size")
    ap.add_argument(
        "--nested",
        action="store_true",
        help="train one full network per seed on the seed's Hetero widths (nested_run) and "
        "evaluate each of --widths as its submodel",
    )
    ap.add_argument(
        "--width-draw",
        choices=("own", "upto"),
        default="own",
        help="--nested: each step trains the drawn client's own width (Pa3dFL, the default) or "
        "a width drawn uniformly up to it (FjORD's draw)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR, help=f"default: {OUT_DIR}")
    args = ap.parse_args(argv)
    if not 1 <= args.train_records <= 60_000:
        ap.error("--train-records must be between 1 and 60000 (FMNIST's training set)")
    if args.epochs < 1:
        ap.error("--epochs must be at least 1")
    if args.lr <= 0:
        ap.error("--lr must be positive")
    if args.width_draw != "own" and not args.nested:
        ap.error("--width-draw applies to --nested runs only")
    for w in args.widths:
        if not 0 < w <= 1 or abs(w * 16 - round(w * 16)) > 1e-9:
            ap.error(f"--widths: {w} is not a multiple of 1/16 in (0, 1] (the width rule's step)")

    settings = {
        "train_records": args.train_records,
        "epochs": args.epochs,
        "lr": args.lr,
        "batch": BATCH,
        "reach_bound": REACH_BOUND,
    }
    kind = "frozen-head"
    if args.nested:
        kind = "frozen-head-nested"
        settings.update(mode="nested", widths=sorted(args.widths))
        if args.width_draw == "upto":
            kind += "-upto"
            settings.update(draw="upto")
    out = args.out_dir / f"{kind}-n{args.train_records}-e{args.epochs}-lr{args.lr:g}.json"
    done = _load(out, settings)

    import torch

    from flcore.data import load_dataset
    from flcore.data.datasets import normalize

    if args.threads:
        torch.set_num_threads(args.threads)
    fm = load_dataset("fmnist")
    pick = np.random.default_rng([_DATA_SEED]).permutation(len(fm.train))[: args.train_records]
    idx = torch.from_numpy(np.sort(pick))
    data = (
        normalize(fm.train.images[idx], fm.info),
        fm.train.labels[idx],
        normalize(fm.test.images, fm.info),
        fm.test.labels,
    )
    rows = []
    label = "nested" if args.width_draw == "own" else f"nested ({args.width_draw})"
    for seed in args.seeds:
        if args.nested:
            row = done.get((seed, None))
            if row is None:
                row = nested_run(
                    seed, sorted(args.widths), data, args.epochs, args.lr, args.width_draw
                )
                row["machine"] = {k: machine()[k] for k in ("cpu_model", "cpus")}
                done[(seed, None)] = row
                _save(out, settings, done)
                accs = ", ".join(
                    f"{w:g} {row['frozen'][f'{w:g}']['test']['accuracy']:.2f}"
                    f" / {row['trained'][f'{w:g}']['test']['accuracy']:.2f}"
                    for w in sorted(args.widths)
                )
                print(f"seed {seed} {label}, frozen / trained: {accs}", file=sys.stderr, flush=True)
            else:
                print(f"seed {seed} {label}: in {out}, not run again", file=sys.stderr)
            rows.append(row)
            continue
        for width in args.widths:
            row = done.get((seed, width))
            if row is not None:
                print(f"seed {seed} width {width:g}: in {out}, not run again", file=sys.stderr)
                rows.append(row)
                continue
            row = one_width(seed, width, data, args.epochs, args.lr)
            row["machine"] = {k: machine()[k] for k in ("cpu_model", "cpus")}
            rows.append(row)
            done[(seed, width)] = row
            _save(out, settings, done)
            print(
                f"seed {seed} width {width:g}: reachable {row['reachable_classes']}/10, test "
                f"frozen {row['frozen']['test']['accuracy']:.2f}, probe "
                f"{row['frozen_probe']['test']['accuracy']:.2f}, trained "
                f"{row['trained']['test']['accuracy']:.2f}",
                file=sys.stderr,
                flush=True,
            )
    print(json.dumps({"machine": machine(), **settings, "file": str(out), "rows": rows}, indent=1))


def _load(path: Path, settings: dict[str, Any]) -> dict[tuple[int, Any], dict[str, Any]]:
    """The rows ``path`` holds, by (seed, width; None for a nested row); none when it is
    missing. A file written under other settings (its name says they are the same) is refused
    rather than mixed in."""
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    if doc.get("settings") != settings:
        raise SystemExit(
            f"{path} was written under other settings ({doc.get('settings')}); move it"
        )
    return {(r["seed"], r.get("width")): r for r in doc["rows"]}


def _save(path: Path, settings: dict[str, Any], rows: dict[tuple[int, Any], Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"settings": settings, "rows": list(rows.values())}, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()
