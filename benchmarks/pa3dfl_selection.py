"""What Pa3dFL's model selection (Algorithm 1) buys on test. Each client deploys ``M0 + alpha
(M1 - M0)``: M0 the model it received with the fixed global head, M1 its locally trained one with
the local head, alpha the best of a grid in [0, 1] on the client's validation records
(flcore.algorithms.widths.pa3dfl). Appendix C says the search "won't bring risks of overfitting
on the validation dataset" since it trains nothing; under Table 1's protocol (600 records a
client, split 0.8 / 0.1 / 0.1) it picks among 11 models on 60 records, where one record is 1.67
points.

This measures it on a run's state, flcore alone: every client (or the first ``--clients``) as
the all-client evaluation runs them (flcore ``Engine.evaluate_clients``: the broadcast of the
round after the state, the client's own local training), each scored at every alpha of the grid
on its validation and test records. Per run, means over clients of test accuracy (%):

- ``received``: alpha 0 (M0; the run's ``accuracy_before``);
- ``trained``: alpha 1 (M1);
- ``selected``: the run's own pick, under its ``alpha_ties`` (the run's ``accuracy``);
- ``selected_ties_largest``: ties to the largest alpha (toward M1; Pa3dFL's default);
- ``selected_ties_smallest``: ties to the smallest alpha (toward M0);
- ``selected_by_val_loss``: the alpha of the lowest validation loss;
- ``every_alpha``: the grid's mean (a choice that knows nothing);
- ``oracle``: each client's best test alpha (chosen on test: an upper bound, not a method);

and, for each rule against ``received``, the mean difference on validation (what the search
sees) and on test (what it gets), with the paired sign test over clients (scipy). The selected
model's and M0's accuracies are checked against the run's own metrics of the same clients.

M0 and M1 differ in two things, the body (as received, or after local training) and the head
(the fixed global one, or the local one the hypernetwork generates and the client trains on
detached features); the four combinations (:data:`BODY_HEAD`) are scored too, to say which of
the two moves the accuracy, and the trained body with its local head fitted to convergence on
the client's training features (:func:`fitted_head`), to say whether the local head is weak for
want of training.

    .venv/bin/python benchmarks/pa3dfl_selection.py --settings ideal --seeds 0

The run folder is the one ``benchmarks/reproduce_pa3dfl_table1.py`` writes for the same
``--settings``, ``--seeds``, ``--ablation`` / ``--set`` and ``--label`` (500 rounds unless
``--rounds``); its ``best.pt`` is copied before it is read (a run under way rewrites it), or
``checkpoint.pt`` with ``--state last``. Output: ``~/.cache/fedsweep-runs/pa3dfl/selection.json``
(one entry per run and state, replaced when measured again), and each entry is also written
into ``--records`` (default ``benchmarks/records/pa3dfl_selection/selection.json``, committed,
with the machine and the code it started with; ``--records ''``: nowhere). A state already
measured in either, the same file (its SHA-256) for the same clients, is passed over unless
``--again``, so the queue (``benchmarks/pa3dfl_queue.sh``) can run this step again at no cost;
so is a run whose state is not on this machine but whose entry the record holds (it was
measured elsewhere).
``--summary`` prints the table of both (OUT's entry where both hold one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import code_version, machine  # noqa: E402
from _runs import BEST, RECORDS, add_to_record, runs_dir, save_figure, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: the selection rules, in the table's order (module docstring)
RULES = (
    "received",
    "trained",
    "selected",
    "selected_ties_largest",
    "selected_ties_smallest",
    "selected_by_val_loss",
    "every_alpha",
    "oracle",
)
#: ``--ablation NAME``: the override reproduce_pa3dfl_table1.py gives it
ABLATIONS = {
    "no-hn": "algorithm_params.hn_aggregation=false",
    "flanc-dec": "algorithm_params.decomposition=flanc",
}


def curve_keys(n: int) -> tuple[str, ...]:
    """The per-client metrics of the alpha grid: ``alpha_<split>_<acc|loss>_<k>``."""
    return tuple(
        f"alpha_{split}_{what}_{k}"
        for split in ("val", "test")
        for what in ("acc", "loss")
        for k in range(n)
    )


#: the four models of a body (received, or after local training) and a head (the fixed global
#: one, or the client's local one): M0 is ``received_global``, M1 ``trained_local``; and the
#: trained body with a local head fitted to convergence on the client's training features
#: (``trained_fitted``, :func:`fitted_head`: what a fully trained local head would give)
BODY_HEAD = (
    "received_global",
    "received_local",
    "trained_global",
    "trained_local",
    "trained_fitted",
)
#: L-BFGS iterations of :func:`fitted_head`
FIT_ITERATIONS = 100


def fitted_head(net: Any, data: Any, device: Any) -> Any:
    """A copy of ``net``'s local head fitted by L-BFGS (:data:`FIT_ITERATIONS`, strong-Wolfe
    line search, no penalty) to cross-entropy on the body's features of the client's training
    records, as Algorithm 3 trains it (on detached features), only to convergence instead of
    the round's steps."""
    import copy

    import torch
    import torch.nn.functional as F

    from flcore.data import conv_layout, normalize

    with torch.no_grad():
        x = conv_layout(normalize(data.train.images, data.info).to(device), device)
        features = net.features(x)
    labels = data.train.labels.to(device)
    head = copy.deepcopy(net.local_head)
    opt = torch.optim.LBFGS(
        head.parameters(), max_iter=FIT_ITERATIONS, line_search_fn="strong_wolfe"
    )

    def closure() -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(head(features), labels)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return head


def cross_keys() -> tuple[str, ...]:
    """The per-client metrics of :data:`BODY_HEAD`: ``cross_<split>_acc_<model>``."""
    return tuple(f"cross_{split}_acc_{m}" for split in ("val", "test") for m in BODY_HEAD)


def curve_algorithm(n: int) -> type:
    """Pa3dFL that also scores every alpha of its ``n``-point grid, and the body / head models
    of :data:`BODY_HEAD`, on each evaluated client's validation and test records (after
    its own selection, which it leaves as it is)."""
    import torch

    from flcore.algorithms.training import evaluate
    from flcore.algorithms.widths.pa3dfl import Pa3dFL, interpolate

    def recovered(net, head):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return {k: v.detach().clone() for k, v in net.recovered_state(head).items()}

    class AlphaCurve(Pa3dFL):
        client_metrics = (*Pa3dFL.client_metrics, *curve_keys(n), *cross_keys())

        def _received_eval(self, task, net, data, width):  # type: ignore[no-untyped-def]
            self._received_local = recovered(net, "local")  # before local training
            return super()._received_eval(task, net, data, width)

        def _select_and_evaluate(self, task, net, data, width, m0):  # type: ignore[no-untyped-def]
            out = super()._select_and_evaluate(task, net, data, width, m0)
            m1 = recovered(net, "local")
            splits = (("val", data.val), ("test", data.test))
            for k in range(n):
                model = self._evaluate_state(width, interpolate(m0, m1, k / (n - 1)))
                for split, records in splits:
                    acc, loss = evaluate(model, records, data.info, device=self.device)
                    out[f"alpha_{split}_acc_{k}"], out[f"alpha_{split}_loss_{k}"] = acc, loss
            head = fitted_head(net, data, self.device)
            trained = recovered(net, "global")
            models = {
                "received_global": m0,
                "received_local": self._received_local,
                "trained_global": trained,
                "trained_local": m1,
                "trained_fitted": trained
                | {"head.weight": head.weight.detach(), "head.bias": head.bias.detach()},
            }
            for name, state in models.items():
                model = self._evaluate_state(width, state)
                for split, records in splits:
                    acc, _ = evaluate(model, records, data.info, device=self.device)
                    out[f"cross_{split}_acc_{name}"] = acc
            return out

    return AlphaCurve


def choices(row: dict[str, float], n: int, ties: str = "largest") -> dict[str, float]:
    """One client's test accuracy under each rule (:data:`RULES`; ``selected`` under the run's
    ``ties``), and, under ``val_<rule>``, the validation accuracy of the alpha that rule picks
    (``every_alpha``: the grid's mean)."""
    val = [row[f"alpha_val_acc_{k}"] for k in range(n)]
    test = [row[f"alpha_test_acc_{k}"] for k in range(n)]
    loss = [row[f"alpha_val_loss_{k}"] for k in range(n)]
    from flcore.algorithms.widths.pa3dfl import select_alpha

    def pick(rule: Literal["largest", "smallest"]) -> int:  # Algorithm 1's own search
        alpha, _ = select_alpha(lambda a: val[round(a * (n - 1))], n, rule)
        return round(alpha * (n - 1))

    picks = {
        "received": 0,
        "trained": n - 1,
        "selected_ties_largest": pick("largest"),
        "selected_ties_smallest": pick("smallest"),
        "selected_by_val_loss": min(range(n), key=lambda k: (loss[k], k)),
        "oracle": max(range(n), key=lambda k: (test[k], -k)),
    }
    picks["selected"] = picks[f"selected_ties_{ties}"]
    out = {rule: test[k] for rule, k in picks.items()}
    out |= {f"val_{rule}": val[k] for rule, k in picks.items()}
    out["every_alpha"], out["val_every_alpha"] = statistics.fmean(test), statistics.fmean(val)
    out["alpha_selected"] = picks["selected"] / (n - 1)
    return out


def summarize(rows: list[dict[str, Any]], n: int, ties: str = "largest") -> dict[str, Any]:
    """Per rule: mean test and validation accuracy over clients (%), and against
    ``received`` the mean differences (points) and the clients ahead / level / behind on test
    with the two-sided sign test's p. ``ties``: the run's ``alpha_ties``."""
    from scipy.stats import binomtest

    per = [choices(r, n, ties) for r in rows]
    out: dict[str, Any] = {"clients": len(per)}
    for rule in RULES:
        # to 1e-6: the grid's mean and two equal accuracies tie as they should
        diffs = [round(100 * (p[rule] - p["received"]), 6) for p in per]
        ahead, behind = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
        out[rule] = {
            "test": round(100 * statistics.fmean(p[rule] for p in per), 3),
            "val": round(100 * statistics.fmean(p[f"val_{rule}"] for p in per), 3),
            "test_gain": round(statistics.fmean(diffs), 3),
            "val_gain": round(
                100 * statistics.fmean(p[f"val_{rule}"] - p["val_received"] for p in per), 3
            ),
            "ahead_level_behind": [ahead, len(per) - ahead - behind, behind],
            "sign_p": binomtest(ahead, ahead + behind).pvalue if ahead + behind else math.nan,
        }
    out["mean_alpha_selected"] = round(statistics.fmean(p["alpha_selected"] for p in per), 3)
    out["body_head"] = {
        m: {
            split: round(100 * statistics.fmean(r[f"cross_{split}_acc_{m}"] for r in rows), 3)
            for split in ("test", "val")
        }
        for m in BODY_HEAD
    }
    return out


def _check(rows: list[dict[str, Any]], n: int, ties: str) -> None:
    """The grid's alpha 0 is the run's M0 and Pa3dFL's own pick is the grid's ``selected``:
    the instrumented evaluation measured what the run measures."""
    for r in rows:
        c = choices(r, n, ties)
        if not math.isclose(c["received"], r["accuracy_before"], abs_tol=1e-9):
            raise RuntimeError(f"client {r['client']}: alpha 0 is not the received model")
        if not math.isclose(c["alpha_selected"], r["selected_alpha"], abs_tol=1e-9):
            raise RuntimeError(f"client {r['client']}: the grid's pick is not Pa3dFL's")
        if not math.isclose(c["selected"], r["accuracy"], abs_tol=1e-9):
            raise RuntimeError(f"client {r['client']}: the selected model's accuracy differs")
        ends = (r["cross_test_acc_received_global"], r["cross_test_acc_trained_local"])
        if ends != (c["received"], c["trained"]):
            raise RuntimeError(f"client {r['client']}: M0 or M1 differs from the grid's ends")


def run_name(setting: str, label: str, rounds: int, seed: int) -> str:
    tag = f"-{label}" if label else ""
    return f"{setting}-pa3dfl{tag}-r{rounds}-s{seed}"


def locate(setting: str, seed: int, args: argparse.Namespace) -> tuple[Any, str, Path]:
    """The config of one run (as reproduce_pa3dfl_table1.py gave it), its folder's name and
    the state file to read."""
    from flcore.config import load_config

    over = [f"seed={seed}", "workers=1", "executor=loop"]
    if args.rounds is not None:
        over.append(f"rounds={args.rounds}")
    cfg = load_config(REPO / f"sweeps/configs/pa3dfl/fmnist_{setting}_pa3dfl.yaml", over + args.set)
    name = run_name(setting, args.label, cfg.rounds, seed)
    state = args.runs / name / (BEST if args.state == "best" else "checkpoint.pt")
    return cfg, name, state


def sha256(path: Path) -> str:
    """The state file's content digest: what says two measurements read the same state."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def measured(doc: dict[str, Any], name: str, state: Path, clients: int) -> bool:
    """Whether ``doc`` holds this state file, to the byte, measured on these clients."""
    old = doc.get("runs", {}).get(f"{name}@{state.name}")
    return (
        old is not None
        and old.get("state_sha256") == sha256(state)
        and len(old["per_client"]) == clients
    )


def measure(cfg: Any, name: str, state: Path, clients: int | None) -> dict[str, Any]:
    """Every client (or the first ``clients``) of one run's state, scored along the grid."""
    from flcore.experiment import build_data, build_engine

    engine = build_engine(cfg, data=build_data(cfg))
    n = int(engine.algorithm.params.n_alpha)
    ties = str(engine.algorithm.params.alpha_ties)
    cls = curve_algorithm(n)
    engine.factory = _Factory(cls, engine.factory.kwargs)  # type: ignore[assignment]
    engine.algorithm.__class__ = cls  # its client_metrics name the grid's keys
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / state.name
        shutil.copyfile(state, copy)  # a run under way replaces it as it goes
        digest = sha256(copy)
        engine.load_checkpoint(copy)
    ids = list(range(clients)) if clients else None
    print(
        f"{name}: {clients or engine.data.num_clients} clients on {state.name} "
        f"(round {engine.round}), {n} alphas each",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    rows = engine.evaluate_clients(ids)["per_client"]
    _check(rows, n, ties)
    return {
        "run": name,
        "state": state.name,
        "state_round": engine.round,
        "state_sha256": digest,
        "n_alpha": n,
        "alpha_ties": ties,
        "seconds": round(time.perf_counter() - start, 1),
        "summary": summarize(rows, n, ties),
        "per_client": rows,
    }


class _Factory:
    """The executor's algorithm factory, building the instrumented class (one worker only:
    the class is local to this process)."""

    def __init__(self, cls: type, kwargs: dict[str, Any]) -> None:
        self.cls, self.kwargs, self.name = cls, kwargs, "pa3dfl"

    def __call__(self) -> Any:
        return self.cls(**self.kwargs)


def table(doc: dict[str, Any]) -> str:
    """Markdown: one row per measured run and rule."""
    lines = [
        "| run | state (round) | clients | rule | test | val | test - received "
        "| val - received | ahead / level / behind | sign test p |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(doc.get("runs", {})):
        entry = doc["runs"][key]
        s = entry["summary"]
        for rule in (x for x in RULES if x in s):  # an entry of before a rule was added
            r = s[rule]
            a, lv, b = r["ahead_level_behind"]
            lines.append(
                f"| {entry['run']} | {entry['state']} ({entry['state_round']}) | {s['clients']} "
                f"| {rule} | {r['test']:.2f} | {r['val']:.2f} | {r['test_gain']:+.2f} "
                f"| {r['val_gain']:+.2f} | {a} / {lv} / {b} | {r['sign_p']:.3g} |"
            )
    lines += [
        "",
        "| run | state (round) | body | global head: test | val | local head: test | val "
        "| fitted local head: test | val |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(doc.get("runs", {})):
        entry = doc["runs"][key]
        cells = entry["summary"].get("body_head")
        for body in ("received", "trained") if cells else ():
            g, lo = cells[f"{body}_global"], cells[f"{body}_local"]
            fit = cells.get(f"{body}_fitted")
            fitted = f"{fit['test']:.2f} | {fit['val']:.2f}" if fit else "- | -"
            lines.append(
                f"| {entry['run']} | {entry['state']} ({entry['state_round']}) | {body} "
                f"| {g['test']:.2f} | {g['val']:.2f} | {lo['test']:.2f} | {lo['val']:.2f} "
                f"| {fitted} |"
            )
    return "\n".join(lines)


def alpha_means(entry: dict[str, Any]) -> tuple[list[float], list[float], list[float]]:
    """A measured run's grid: the alphas and the mean over its clients of validation and of
    test accuracy at each (%)."""
    n, rows = int(entry["n_alpha"]), entry["per_client"]
    alphas = [k / (n - 1) for k in range(n)]

    def mean(split: str, k: int) -> float:
        return 100 * statistics.fmean(r[f"alpha_{split}_acc_{k}"] for r in rows)

    return alphas, [mean("val", k) for k in range(n)], [mean("test", k) for k in range(n)]


def plot_alpha(doc: dict[str, Any], out: Path) -> str | None:
    """``OUT/selection.png``: one panel per measured run and state, the mean validation
    (dashed) and test (solid) accuracy along the grid, and where the selected model lands on
    each (the mean over clients of what the search picked: markers at the mean picked alpha).
    None when nothing was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [doc["runs"][k] for k in sorted(doc.get("runs", {}))]
    if not entries:
        return None
    fig, axes = plt.subplots(
        1, len(entries), figsize=(4.2 * len(entries), 3.6), squeeze=False, sharey=False
    )
    for ax, entry in zip(axes[0], entries, strict=True):
        alphas, val, test = alpha_means(entry)
        s = entry["summary"]
        ax.plot(alphas, test, "-", color="black", label="test")
        ax.plot(alphas, val, "--", color="C0", label="validation")
        picked = s["mean_alpha_selected"]
        ax.plot([picked], [s["selected"]["test"]], "o", color="black", label="selected: test")
        ax.plot([picked], [s["selected"]["val"]], "o", mfc="none", color="C0",
                label="selected: validation")  # fmt: skip
        ax.set_title(f"{entry['run']}\n{entry['state']} (round {entry['state_round']})", fontsize=8)
        ax.set_xlabel("alpha (0: received M0, 1: trained M1)")
        ax.set_ylabel("accuracy over clients (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out / "selection.png")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=["ideal"], choices=["ideal", "hetero"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--rounds", type=int, help="the run's rounds (default: the config's 500)")
    ap.add_argument("--ablation", choices=sorted(ABLATIONS), help="a Table 3 ablation's run")
    ap.add_argument("--set", action="append", default=[], help="key=value, as the run had")
    ap.add_argument("--label", default="", help="the --set variant's name in the run folder")
    ap.add_argument("--state", choices=["best", "last"], default="best")
    ap.add_argument("--clients", type=int, help="the first N clients only (default: all)")
    ap.add_argument("--runs", type=Path, default=runs_dir("pa3dfl"), help="the run folders")
    ap.add_argument("--out", type=Path, default=runs_dir("pa3dfl") / "selection.json")
    ap.add_argument(
        "--records",
        default=str(RECORDS / "pa3dfl_selection" / "selection.json"),
        help="the committed record of measured states ('': none)",
    )
    ap.add_argument("--again", action="store_true", help="measure states already measured")
    ap.add_argument("--summary", action="store_true", help="print the table of OUT and the record")
    ap.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="with --summary, also draw DIR/selection.png (plot_alpha; the path to stderr)",
    )
    args = ap.parse_args(argv)
    if args.plot is not None and not args.summary:
        ap.error("--plot draws the --summary's runs: give --summary too")
    if args.ablation:
        if args.set or args.label:
            ap.error("--ablation sets its own override and label: no --set or --label")
        args.set, args.label = [ABLATIONS[args.ablation]], args.ablation
    if args.set and not args.label:
        ap.error("--set needs --label (the variant's name in the run folders)")
    if args.clients is not None and args.clients < 1:
        ap.error("--clients must be at least 1")
    doc = json.loads(args.out.read_text()) if args.out.is_file() else {"runs": {}}
    record = Path(args.records) if args.records else None
    kept = json.loads(record.read_text())["runs"] if record and record.is_file() else {}
    known = {"runs": kept | doc["runs"]}  # what was measured, here or elsewhere
    if args.summary:
        print(table(known))
        if args.plot is not None:
            print(plot_alpha(known, args.plot) or "nothing measured: no figure", file=sys.stderr)
        return
    runs = [locate(setting, seed, args) for setting in args.settings for seed in args.seeds]
    elsewhere = {n for _, n, state in runs if not state.is_file() and f"{n}@{state.name}" in kept}
    missing = [str(state) for _, n, state in runs if not state.is_file() and n not in elsewhere]
    if missing:
        ap.error(f"no run state: {', '.join(missing)}")
    for cfg, name, state in runs:
        if name in elsewhere:
            print(f"{name}: measured in {record}; its state is not here", file=sys.stderr)
            continue
        if not args.again and measured(known, name, state, args.clients or cfg.num_clients):
            print(f"{name}: {state.name} already measured (--again to redo)", file=sys.stderr)
            continue
        code = code_version()  # the code the measurement starts with
        entry = measure(cfg, name, state, args.clients) | {"overrides": args.set}
        key = f"{entry['run']}@{entry['state']}"
        doc["runs"][key] = known["runs"][key] = entry
        doc["machine"] = machine()
        write_json(args.out, doc)  # after each run: a later run's failure keeps it
        if record is not None:
            add_to_record(record, "runs", key, entry, code)
    print(table(known))


if __name__ == "__main__":
    main()
