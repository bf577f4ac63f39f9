"""Check LoDMeta's claims on FMNIST few-shot clients, in resumable chunks (issue 26 section 5).

The paper (Yang & Kwok) reports mini-ImageNet and Meta-Dataset; here its claims are checked on the
offline default (``sweeps/configs/lodmeta/fmnist_<method>.yaml``: 100 training clients and 30
unseen ones, 5-way K-shot tasks from FMNIST classes 0-4 and 5-9, CONV4, K = 5, eta 1e-3), in the
settings

- ``regular-5shot`` (the configs'), ``regular-1shot``: the 3-regular expander;
- ``smallworld-5shot``, ``smallworld-1shot``: Watts-Strogatz, k 4, p 0.3 (the server algorithms
  FedMAML and FedAlt take no graph and run only in the ``regular-*`` settings).

Each run lives in ``OUT/<setting>-<method>[-<label>]-s<seed>/`` (default OUT:
``~/.cache/fedsweep-runs/lodmeta``), resumable as benchmarks/reproduce_table1.py's
(``--max-minutes``, ``--checkpoint-every``, ``--until-round``; benchmarks/_runs.py); an ended
run also leaves its record under ``--records`` (default ``benchmarks/records/lodmeta/``, committed),
which ``--summary`` reads beside OUT's folders.
``--grid`` runs Tables 2-3's grid for ``lodmeta``: the per-release epsilon in {0.5, 0.6, 0.7, 0.8}
x delta in {0.4, 0.1, 0.02, 1e-5}, labelled ``eps<e>-d<delta>``, at the default clip M
(``flcore.config.PERTURBATION_CLIP``, from measured norms) or ``--clip`` (another M adds
``-M<M>`` to the labels);
``--eps`` and ``--delta`` keep only some rows and columns (``--eps 0.5 0.8 --delta 1e-5``: the two
delta-1e-5 corners); ``--set``, with its ``--label``, applies to every cell. ``--ladder Z ...``
runs LoDMeta at noise multipliers z below the grid's (delta 1e-5, the same M), labelled
``z<z>-d1e-05`` (``-r<steps>`` with ``--rounds``): where the grid sits at the untrained network's
level, claim 4's trend is looked for there. ``--reference`` measures (and runs nothing else), per
setting, the accuracy of the untrained initialisation adapted the same way (what K SGD steps on the
support set give without any meta-training: FMNIST's 5-way tasks are easy), and leaves it under
``--records``/reference/ for ``--summary``: a row of the table, and claim 4's floor (a grid cell no
better than it meta-learned nothing). ``--early`` reruns each chosen run's first 250 steps
evaluated every 25 (label ``early``, or ``<label>-early`` with ``--set``; the same computation: a
walk's steps do not depend on its length or on when it is evaluated): claim 2 compares the
communication at which runs reach a target, which the configs' evaluation every 250 steps leaves
anywhere in a 250-step bracket; the summary merges the two curves and says the bracket its ratio
lies in.

Needs flcore only (no Ray, MLflow or Optuna). The output is one JSON object; ``--summary``
prints the markdown table of OUT (means ± std over seeds), the ``--grid`` cells in the layout of
the paper's Tables 2-3, the claims the runs support (the issue's checks 1-4, numbered as there
(its item 5 is the settings above), and 6, the paper's own reading of its Figures 1-4: the walk's
Adam variants level with MAML and FedAlt), and writes
``OUT/accuracy_vs_communication-<setting>.png`` (the paper's Figures 1-4).

    .venv/bin/python benchmarks/reproduce_lodmeta.py --seeds 0 1 2 \
        --methods lodmeta lodmeta_basic lodmeta_sgd
    .venv/bin/python benchmarks/reproduce_lodmeta.py --grid --seeds 0
    .venv/bin/python benchmarks/reproduce_lodmeta.py --summary
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402
from _runs import (  # noqa: E402
    add_run_options,
    claim_line,
    compare,
    ended_rows,
    epsilon_cell,
    execution_overrides,
    read_curve,
    record_file,
    records_dir,
    resume_run,
    run_ended,
    save_figure,
    scan_runs,
    seed_cell,
    under_way_note,
)

from flcore.config import PERTURBATION_CLIP  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "sweeps" / "configs" / "lodmeta"
METHODS = ("lodmeta", "lodmeta_basic", "lodmeta_sgd", "fedmaml", "fedalt", "l2c")
SERVER = frozenset({"fedmaml", "fedalt"})
#: setting -> (graph overrides, k_shot)
SETTINGS: dict[str, tuple[list[str], int]] = {
    "regular-5shot": (["graph.name=regular", "graph.degree=3"], 5),
    "regular-1shot": (["graph.name=regular", "graph.degree=3"], 1),
    "smallworld-5shot": (["graph.name=watts_strogatz", "graph.k=4", "graph.p=0.3"], 5),
    "smallworld-1shot": (["graph.name=watts_strogatz", "graph.k=4", "graph.p=0.3"], 1),
}
#: the label of FedMAML at one client a round (``--set algorithm_params.clients_per_round=1``),
#: the paper's "MAML (1 client)", drawn beside MAML in the figures
ONE_CLIENT = "1client"
#: steps of every config's run (sweeps/configs/lodmeta/): a run with fewer is still under way
STEPS = 2000
#: ``--early``: a run's first steps again, evaluated densely (claim 2's cost to reach a target is
#: known only to the evaluation grid: every 250 steps, the configs' ``eval_every``, leaves it
#: anywhere between 0 and 250 steps when a run reaches it at its first evaluation)
EARLY, EARLY_STEPS, EARLY_EVERY = "early", 250, 25
#: ``--reference`` leaves its records in this folder of ``--records``; a grid cell that does not
#: beat its setting's untrained reference by more than :data:`LEARNS` points learned nothing
REFERENCE, LEARNS = "reference", 1.0
#: ``--ladder``'s runs: a noise multiplier z a run at this delta, labelled ``z<z>-d<delta>``
#: (``-r<steps>`` with ``--rounds``)
LADDER_DELTA = 1e-5
_LADDER = re.compile(r"^z(?P<z>[0-9.e+-]+?)-d(?P<delta>[0-9.e+-]+?)(-r(?P<steps>\d+))?$")
GRID_EPS = (0.5, 0.6, 0.7, 0.8)
GRID_DELTA = (0.4, 0.1, 0.02, 1e-5)
_RUN = re.compile(r"^(?P<setting>(regular|smallworld)-\dshot)-(?P<name>.+)-s(?P<seed>\d+)$")


def _pct(value: Any) -> float | None:
    return None if value is None else round(100.0 * float(value), 2)


def _overrides(method: str, setting: str, seed: int, args: argparse.Namespace) -> list[str]:
    graph, shots = SETTINGS[setting]
    over = [f"seed={seed}", f"workers={args.workers}", f"fewshot.k_shot={shots}"]
    over += execution_overrides(args)  # --device, --global-eval-every: how, not what
    over += [] if method in SERVER else graph
    if args.rounds is not None:
        over.append(f"rounds={args.rounds}")
    return over


Point = tuple[float, float, float | None, float | None]


def _curve(run: dict[str, Any]) -> list[Point]:
    """(comm_units, accuracy, unseen_accuracy, bytes up + down so far, None if not logged) of
    each evaluated round of a run's log (its folder's, or its record's)."""
    rows = read_curve(run)
    return [
        (
            r["comm_units"],
            r["accuracy"],
            r.get("unseen_accuracy"),
            r["bytes_up"] + r["bytes_down"]
            if r.get("bytes_up") is not None and r.get("bytes_down") is not None
            else None,
        )
        for r in rows
        if r.get("accuracy") is not None and r.get("comm_units") is not None
    ]


def run_one(
    method: str,
    setting: str,
    seed: int,
    args: argparse.Namespace,
    deadline: float,
    extra: list[str],
    label: str,
) -> dict[str, Any]:
    """Run (or resume, or only read) one run; returns its JSON record."""
    from flcore.config import load_config

    cfg = load_config(
        CONFIGS / f"fmnist_{method}.yaml", [*_overrides(method, setting, seed, args), *extra]
    )
    tag = f"-{label}" if label else ""
    run_dir = Path(args.out) / f"{setting}-{method}{tag}-s{seed}"
    engine, summary, spent = resume_run(
        cfg,
        run_dir,
        checkpoint_every=args.checkpoint_every,
        deadline=deadline,
        until_round=args.until_round,
        record=record_file(args, run_dir.name),
    )
    return {
        "run": run_dir.name,
        "method": method,
        "setting": setting,
        "overrides": extra,
        "seed": seed,
        "steps": engine.rounds,
        "steps_done": engine.round,
        "ended": run_ended(engine, summary),
        "diverged_round": summary.get("diverged_round"),
        "accuracy": _pct(summary.get("accuracy")),
        "unseen_accuracy": _pct(summary.get("unseen_accuracy")),
        "comm_units": summary.get("comm_units"),
        "bytes_up": summary.get("bytes_up"),
        "epsilon": summary.get("epsilon"),
        "epsilon_accountant": summary.get("epsilon_accountant"),
        "epsilon_paper": summary.get("epsilon_paper"),
        "dp_guarantee": engine.algorithm.privacy_tags()["dp_guarantee"],
        "seconds": round(spent, 1),
    }


def reference(setting: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The untrained initialisation, adapted and scored as every run's clients are (with the
    ``--set`` overrides, so a variant's reference is its own)."""
    import torch

    from flcore.config import load_config
    from flcore.experiment import build_engine

    over = [*_overrides("lodmeta", setting, seed, args), *args.set]
    cfg = load_config(CONFIGS / "fmnist_lodmeta.yaml", over)
    engine = build_engine(cfg)
    out = engine.algorithm.evaluate_server(engine.data, engine.client_states, torch.device("cpu"))
    return {
        "setting": setting,
        "seed": seed,
        "label": args.label,
        **{k: _pct(out[k]) for k in ("accuracy", "unseen_accuracy")},
    }


def read_runs(out: Path, records: Path | None = None) -> list[dict[str, Any]]:
    """Every run folder under ``out`` with a ``summary.json``, and every record under
    ``records`` of a run with no such folder: each with its accuracy curve."""
    found = scan_runs(out, _RUN, METHODS, records, length=STEPS)
    return [r | {"curve": _curve(r)} for r in found]


def reference_file(records: Path, setting: str, seed: int, label: str) -> Path:
    """Where ``--reference`` leaves a setting's untrained accuracy for ``seed`` (and a ``--set``
    variant's under its label)."""
    tag = f"-{label}" if label else ""
    return records / REFERENCE / f"{setting}{tag}-s{seed}.json"


References = dict[tuple[str, str], list[dict[str, Any]]]


def read_references(records: Path | None) -> References:
    """The ``--reference`` records under ``records``: (setting, label) -> one record a seed."""
    out: References = {}
    folder = None if records is None else records / REFERENCE
    for file in sorted(folder.glob("*.json")) if folder is not None and folder.is_dir() else []:
        rec = json.loads(file.read_text())
        out.setdefault((rec["setting"], rec.get("label") or ""), []).append(rec)
    return out


def _group(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in runs:
        cell = out.setdefault((r["setting"], r["method"], r["label"]), {})
        s = r["summary"]
        for key in ("accuracy", "unseen_accuracy"):
            if s.get(key) is not None:
                cell.setdefault(key, []).append(100.0 * float(s[key]))
        for key in ("comm_units", "epsilon", "epsilon_accountant", "epsilon_paper", "rounds"):
            if s.get(key) is not None:
                cell.setdefault(key, []).append(float(s[key]))
    return out


def summary_table(runs: list[dict[str, Any]], references: References | None = None) -> str:
    """Markdown: one row per (setting, method, label), means ± std over its ended seeds (a seed
    under way named beside them with its figures so far; a row of runs none of which has ended
    shows them); and a row per setting (and label) for the untrained network adapted the same
    way (``--reference``)."""
    lines = [
        "| setting | method | seeds | steps | accuracy | unseen accuracy | comm units | epsilon "
        "| epsilon_accountant | epsilon_paper |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(METHODS)}
    groups, paused = ended_rows(runs, _group)
    for (setting, method, label), cell in sorted(
        groups.items(), key=lambda kv: (list(SETTINGS).index(kv[0][0]), order[kv[0][1]], kv[0][2])
    ):

        def first(key: str, c: dict[str, list[float]] = cell) -> str:
            return f"{c[key][0]:.3g}" if c.get(key) else "-"

        def weakest(key: str, c: dict[str, list[float]] = cell) -> str:
            return epsilon_cell(c.get(key, []), ".3g")

        name = f"{method} ({label})" if label else method
        steps = ", ".join(str(int(r)) for r in sorted(set(cell.get("rounds", []))))
        under_way = paused[(setting, method, label)]
        seeds = f"{len(cell.get('rounds', []))}"
        seeds += f" (+{len(under_way)} under way)" if under_way else ""
        lines.append(
            f"| {setting} | {name} | {seeds} | {steps} "
            f"| {seed_cell(cell.get('accuracy', []))}{under_way_note(under_way, unit='step')} "
            f"| {seed_cell(cell.get('unseen_accuracy', []))} "
            f"| {first('comm_units')} | {weakest('epsilon')} | {weakest('epsilon_accountant')} "
            f"| {weakest('epsilon_paper')} |"
        )
    for (setting, label), recs in sorted(
        (references or {}).items(), key=lambda kv: (list(SETTINGS).index(kv[0][0]), kv[0][1])
    ):
        name = "untrained network" + (f" ({label})" if label else "")
        acc = [float(r["accuracy"]) for r in recs if r.get("accuracy") is not None]
        unseen = [float(r["unseen_accuracy"]) for r in recs if r.get("unseen_accuracy") is not None]
        lines.append(
            f"| {setting} | {name} | {len(recs)} | 0 | {seed_cell(acc)} | {seed_cell(unseen)} "
            "| 0 | - | - | - |"
        )
    return "\n".join(lines)


def grid_label(epsilon: float, delta: float) -> str:
    """The label of the ``--grid`` cell at per-release ``epsilon`` and ``delta``."""
    return f"eps{epsilon:g}-d{delta:g}"


def grid_cells(runs: list[dict[str, Any]]) -> dict[tuple[float, float], dict[str, Any]]:
    """The ``--grid`` runs (ended or under way) of ``regular-5shot`` LoDMeta, seed 0, by
    (epsilon, delta)."""
    found = {
        r["label"]: r
        for r in runs
        if r["setting"] == "regular-5shot" and r["method"] == "lodmeta" and r["seed"] == 0
    }
    return {
        (e, d): found[grid_label(e, d)]
        for e in GRID_EPS
        for d in GRID_DELTA
        if grid_label(e, d) in found
    }


def grid_tables(runs: list[dict[str, Any]]) -> str:
    """Markdown in the layout of the paper's Tables 2-3 (rows: per-release epsilon, largest
    first; columns: delta, largest first): the ``--grid`` cells of ``regular-5shot`` LoDMeta,
    seed 0, each "training / unseen" accuracy (%), and the walk's epsilons: ``epsilon`` (where
    the fronts place the run: inf for a weak-delta cell), ``epsilon_accountant`` (the accountant's
    over the walk's visits) and ``epsilon_paper`` (Theorem 4.5). A cell under way shows its step
    ("at step N"), a cell never run "-": nothing is filled in."""
    found = grid_cells(runs)
    head = "| epsilon \\ delta | " + " | ".join(f"{d:g}" for d in GRID_DELTA) + " |"
    rule = "|---|" + "---|" * len(GRID_DELTA)

    def cell(e: float, d: float, show: Any) -> str:
        run = found.get((e, d))
        if run is None:
            return "-"
        if not full_length(run):
            return f"at step {int(run['summary'].get('rounds') or 0)}"
        return str(show(run["summary"]))

    def accuracies(s: dict[str, Any]) -> str:
        return " / ".join(
            "-" if s.get(k) is None else f"{100.0 * float(s[k]):.2f}"
            for k in ("accuracy", "unseen_accuracy")
        )

    def epsilons(s: dict[str, Any]) -> str:
        keys = ("epsilon", "epsilon_accountant", "epsilon_paper")
        return " / ".join(epsilon_cell([float(s[k])] if k in s else [], ".3g") for k in keys)

    out = []
    for title, show in (
        ("accuracy of training / unseen clients (%)", accuracies),
        ("epsilon (on the fronts) / epsilon_accountant / epsilon_paper (Theorem 4.5)", epsilons),
    ):
        rows = [
            f"| {e:g} | " + " | ".join(cell(e, d, show) for d in GRID_DELTA) + " |"
            for e in sorted(GRID_EPS, reverse=True)
        ]
        out.append("\n".join([f"Tables 2-3 grid, {title}:", "", head, rule, *rows]))
    return "\n\n".join(out)


def cost_to_reach(curve: list[Point], target: float, column: int = 0) -> float | None:
    """The communication at which a run's training-client accuracy first reaches ``target`` (a
    fraction), in Table 1's units (``column`` 0) or in bytes (3); None if it never does."""
    return next((point[column] for point in curve if point[1] >= target), None)


def reach_bracket(curve: list[Point], target: float) -> tuple[float, float] | None:
    """``(before, at)``: the units of the evaluation before the one that first reaches
    ``target`` (0 if that is the first) and of that one; the run reached it somewhere in
    ``(before, at]``. None if it never does."""
    before = 0.0
    for point in curve:
        if point[1] >= target:
            return before, point[0]
        before = point[0]
    return None


def early_label(label: str) -> str:
    """The label of the ``--early`` run of the runs labelled ``label`` ('' : unlabelled)."""
    return f"{label}-{EARLY}" if label else EARLY


def merged_curve(
    runs: list[dict[str, Any]], setting: str, method: str, seed: int, label: str = ""
) -> list[Point]:
    """The run's curve with its ``--early`` run's denser first steps (the same computation
    evaluated more often: where both evaluated, they agree), by units; either alone if the
    other is missing, empty if both are."""
    full = _find(runs, setting, method, seed, label)
    early = _find(runs, setting, method, seed, early_label(label))
    points = {p[0]: p for p in (early["curve"] if early else [])}
    for p in full["curve"] if full else []:
        q = points.setdefault(p[0], p)
        if abs(q[1] - p[1]) > 1e-4:  # records keep 6 significant digits
            raise ValueError(
                f"the early run of {setting}-{method} seed {seed} is not its full run's first "
                f"steps: accuracy {q[1]:.6f} against {p[1]:.6f} at {p[0]:g} units"
            )
    return [points[u] for u in sorted(points)]


def _find(
    runs: list[dict[str, Any]], setting: str, method: str, seed: int, label: str
) -> dict[str, Any] | None:
    key = (setting, label, method, seed)
    return next(
        (r for r in runs if (r["setting"], r["label"], r["method"], r["seed"]) == key), None
    )


def claim2_target(lodmeta_run: dict[str, Any]) -> float:
    """Claim 2's accuracy to reach: 95% of the LoDMeta run's final training-client accuracy
    (the claims and the figure's dashed line both use it)."""
    return 0.95 * lodmeta_run["curve"][-1][1]


def full_length(run: dict[str, Any]) -> bool:
    """Whether a run has done the configs' :data:`STEPS` steps (a folder stopped on the way,
    by ``--until-round`` or ``--max-minutes``, has a summary of the steps so far)."""
    return int(run["summary"].get("rounds") or 0) >= STEPS


def learned(accuracy: float, floor: float) -> bool:
    """Whether a run's accuracy (%) beats the untrained network's ``floor`` by more than
    :data:`LEARNS` points: a run that does not meta-learned nothing."""
    return accuracy > floor + LEARNS


def ladder_part(runs: list[dict[str, Any]], floor: float | None) -> tuple[str, str] | None:
    """Claim 4 below the grid's noise: the ``--ladder`` runs of ``regular-5shot`` LoDMeta, seed
    0, at their longest length: whether accuracy falls as z grows, rung to rung, and from which
    z on it is no better than the untrained network (``floor``). One seed: inconclusive."""
    rungs: dict[int, dict[float, dict[str, Any]]] = {}
    for r in runs:
        m = _LADDER.match(r["label"])
        if r["setting"] != "regular-5shot" or r["method"] != "lodmeta" or r["seed"] != 0 or not m:
            continue
        if r["summary"].get("accuracy") is None:
            continue
        rungs.setdefault(int(r["summary"].get("rounds") or 0), {})[float(m["z"])] = r["summary"]
    if not rungs:
        return None
    steps = max(rungs)
    ladder = sorted(rungs[steps].items())  # z ascending
    acc = [100.0 * float(summary["accuracy"]) for _, summary in ladder]
    falls = sum(1 for a, b in zip(acc, acc[1:], strict=False) if b <= a)
    shown = (
        f"noise ladder ({len(ladder)} rungs, z {ladder[0][0]:g} to {ladder[-1][0]:g}, {steps} "
        f"steps): accuracy falls as z grows on {falls}/{len(ladder) - 1} adjacent rungs"
    )
    if floor is not None:
        above = [(z, su) for (z, su), a in zip(ladder, acc, strict=True) if learned(a, floor)]
        shown += f", {len(above)}/{len(ladder)} above the untrained network adapted" + (
            f" (the noisiest at z {above[-1][0]:g}, epsilon {above[-1][1].get('epsilon'):.3g})"
            if above
            else ""
        )
    return "inconclusive", shown


def grid_trend(runs: list[dict[str, Any]]) -> tuple[float, float, int] | None:
    """Spearman's rank correlation between the ``--grid`` cells' noise multiplier z and their
    training-client accuracy (``regular-5shot`` LoDMeta, seed 0, ended runs): ``(rho, p, n)``,
    None under three cells. The cells share the seed, so the same walk and the same Gaussian
    draws, scaled by each cell's z: the correlation reads how seed 0's walk degrades with z,
    not how seeds vary."""
    from scipy.stats import spearmanr

    points = [
        (float(r["summary"]["noise_multiplier"]), float(r["summary"]["accuracy"]))
        for r in grid_cells(runs).values()
        if full_length(r)
        and r["summary"].get("noise_multiplier") is not None
        and r["summary"].get("accuracy") is not None
    ]
    if len(points) < 3:
        return None
    rho, p = spearmanr([z for z, _ in points], [a for _, a in points])
    return float(rho), float(p), len(points)


def claims(runs: list[dict[str, Any]], references: References | None = None) -> list[str]:
    """The paper's claims (issue 26 section 5) on the unlabelled runs of ``regular-5shot``
    that have done their :data:`STEPS` steps; claim 2 also reads the other method's runs still
    under way and the ``--early`` runs, as what they show: the communication at which the run
    reached the target, or that it had not by its last evaluation (a bound, not a "never")."""
    every = runs
    runs = [r for r in runs if full_length(r)]
    g = _group(runs)
    s = "regular-5shot"

    def v(method: str, key: str, setting: str = s, label: str = "") -> list[float]:
        return g.get((setting, method, label), {}).get(key, [])

    one = [
        compare(v("lodmeta", "accuracy"), v("lodmeta_basic", "accuracy"), "~"),
        compare(v("lodmeta_basic", "accuracy"), v("lodmeta_sgd", "accuracy"), ">"),
    ]
    # 2: per unit of communication, to reach 95% of LoDMeta's own final accuracy (per seed), in
    # Table 1's units (the verdict: the paper's claim) and in bytes (L2C's 3 units count one
    # client's exchange, while each of its rounds has every client gossip). A run reaches the
    # target between two evaluations, so each seed's ratio is known within a bracket: both
    # reached it, (a0/b1, a1/b0); the other not (yet) by its last evaluation at U units (ended
    # or under way, its own run or only its --early one), (0, a1/U). The verdict needs three
    # seeds and the brackets' mean on one side of 0.5: --early runs make them narrow.
    two: list[tuple[str, str]] = []
    seeds = sorted({r["seed"] for r in runs if r["setting"] == s and not r["label"]})
    for other in ("lodmeta_basic", "l2c"):
        ratios, lows, highs, in_bytes = [], [], [], []
        for seed in seeds:
            lod = _find(runs, s, "lodmeta", seed, "")  # ended
            mine, theirs = (
                merged_curve(every, s, "lodmeta", seed),
                merged_curve(every, s, other, seed),
            )
            if lod is None or not lod["curve"] or not theirs:
                continue
            target = claim2_target(lod)
            a, b = reach_bracket(mine, target), reach_bracket(theirs, target)
            if a is None:  # cannot be: LoDMeta's curve ends at the accuracy the target is 95% of
                continue
            if b is None:  # beyond the other's last evaluation
                lows.append(0.0)
                highs.append(a[1] / theirs[-1][0])
                continue
            ratios.append(a[1] / b[1])
            lows.append(a[0] / b[1])
            highs.append(a[1] / b[0] if b[0] > 0 else math.inf)
            a_bytes, b_bytes = cost_to_reach(mine, target, 3), cost_to_reach(theirs, target, 3)
            if a_bytes is not None and b_bytes is not None:
                in_bytes.append(a_bytes / b_bytes)
        if not lows:
            two.append(("not measured", f"{other}: -"))
            continue
        low, high = statistics.fmean(lows), statistics.fmean(highs)
        if len(lows) < 3:
            verdict = "inconclusive"
        else:
            verdict = (
                "supported" if high <= 0.5 else "NOT supported" if low > 0.5 else "inconclusive"
            )
        point = (
            f"{statistics.fmean(ratios):.2f} where both reached it ({len(ratios)} seeds"
            + (
                f", in bytes {statistics.fmean(in_bytes):.3f}"
                if len(in_bytes) == len(ratios)
                else ""
            )
            + "), "
            if ratios
            else ""
        )
        two.append(
            (
                verdict,
                f"{other}: LoDMeta's cost / {other}'s = {point}between {low:.2f} and {high:.2f} "
                f"at the evaluations ({len(lows)} seeds)",
            )
        )
    three = [compare(v("lodmeta", "accuracy"), v("lodmeta", "unseen_accuracy"), ">")]
    # 4: the grid's trend (one seed: a monotone count, not a test)
    grid = {
        (e, d): v("lodmeta", "accuracy", label=grid_label(e, d))
        for e in GRID_EPS
        for d in GRID_DELTA
    }
    have = {k: x[0] for k, x in grid.items() if x}
    falls = sum(
        1
        for (e, d), acc in have.items()
        for (e2, d2), acc2 in have.items()
        if (e2 < e and d2 == d or d2 < d and e2 == e) and acc2 <= acc
    )
    pairs = sum(
        1 for (e, d) in have for (e2, d2) in have if (e2 < e and d2 == d or d2 < d and e2 == e)
    )
    shown = f"{falls}/{pairs} smaller-epsilon-or-delta pairs lose accuracy (one seed)"
    # a trend needs something to fall from: a cell at or below the untrained network adapted
    # (seed 0's reference, the grid's seed) meta-learned nothing, whatever its neighbours show
    ref = [
        float(r["accuracy"])
        for r in (references or {}).get((s, ""), [])
        if r["seed"] == 0 and r.get("accuracy") is not None
    ]
    if have and ref:
        above = sum(1 for acc in have.values() if learned(acc, ref[0]))
        shown += (
            f"; {above}/{len(have)} cells above the untrained network adapted ({ref[0]:.2f})"
            + (": no cell meta-learns, so there is no accuracy to fall" if not above else "")
        )
    trend = grid_trend(runs)
    if trend is not None:
        rho, p, n = trend
        shown += (
            f"; accuracy against the cell's noise multiplier z: Spearman rho {rho:+.2f} over {n} "
            f"cells (p {p:.2g}; one seed, whose noise draws every cell shares, scaled by z)"
        )
    four = [("inconclusive" if pairs or have else "not measured", shown)]
    ladder = ladder_part(every, ref[0] if ref else None)
    if ladder is not None:
        four.append(ladder)
    # 6 (the paper's reading of its Figures 1-4, beyond the list): the walk's Adam
    # variants end level with the server methods (MAML, FedAlt; within 1 point) on the training
    # clients, and level or above them on the unseen ones ("comparable or even better", Fig. 2;
    # "much better", Fig. 4). Each at its configs' 2,000 steps (a walk's hop, a server's round)
    six = [
        _named(f"{walk} - {server}, {who}", compare(v(walk, key), v(server, key), relation))
        for key, who, relation in (
            ("accuracy", "training", "~"),
            ("unseen_accuracy", "unseen", ">="),
        )
        for walk in ("lodmeta", "lodmeta_basic")
        for server in sorted(SERVER)
    ]
    return [
        claim_line(1, "per step, LoDMeta ~ LoDMeta(basic) > LoDMeta(SGD)", one),
        claim_line(
            2, "per unit of communication, LoDMeta needs about 1/3 of basic's and L2C's cost", two
        ),
        claim_line(3, "unseen-client accuracy below training-client accuracy", three),
        claim_line(4, "Tables 2-3: accuracy falls as epsilon or delta shrink", four),
        claim_line(
            6,
            "Figures 1-4: LoDMeta and LoDMeta(basic) ~ MAML and FedAlt on training clients, "
            ">= on unseen clients",
            six,
        ),
    ]


def _named(name: str, part: tuple[str, str]) -> tuple[str, str]:
    """A :func:`compare` part with the pair it compares named (several parts to one claim)."""
    verdict, shown = part
    return verdict, f"{name} {shown}"


def figure_curves(
    runs: list[dict[str, Any]], setting: str
) -> tuple[int, dict[str, tuple[list[Point], bool]], float | None] | None:
    """What ``setting``'s figure shows: its first seed, each method's curve at that seed (the
    unlabelled run merged with its ``--early`` run's denser first steps, or the early run alone,
    flagged True: L2C's first rounds), and claim 2's target (95% of LoDMeta's final accuracy;
    None without an ended LoDMeta run). None when the setting has no such run."""
    kinds = ("", early_label(""))
    chosen = [r for r in runs if r["setting"] == setting and r["label"] in kinds and r["curve"]]
    if not chosen:
        return None
    seed = min(r["seed"] for r in chosen)
    curves = {}
    for method in METHODS:
        if any(r["method"] == method and r["seed"] == seed for r in chosen):
            only_early = _find(runs, setting, method, seed, "") is None
            curves[method] = (merged_curve(runs, setting, method, seed), only_early)
    # the paper's "MAML (1 client)" beside MAML: FedMAML at one client a round (--label 1client)
    one = _find(runs, setting, "fedmaml", seed, ONE_CLIENT)
    if one is not None and one["curve"]:
        curves["fedmaml (1 client)"] = (one["curve"], False)
    lod = _find(runs, setting, "lodmeta", seed, "")
    target = claim2_target(lod) if lod and lod["curve"] and full_length(lod) else None
    return seed, curves, target


def draw_curves(curves: dict[str, Any], target: float | None, title: str):  # type: ignore[no-untyped-def]
    """The figure of :func:`figure_curves`' curves: training clients (left), unseen clients
    (right; methods without unseen clients are left out), one colour a method in both."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for i, (method, (curve, only_early)) in enumerate(curves.items()):
        name = method + (f" (first {curve[-1][0]:g} units only)" if only_early else "")
        units = [c[0] for c in curve]
        style = {"marker": ".", "label": name, "color": f"C{i}"}
        axes[0].plot(units, [100 * c[1] for c in curve], **style)
        unseen = [c[2] for c in curve]
        if all(u is not None for u in unseen):  # (L2C has no unseen clients)
            axes[1].plot(units, [100 * float(u) for u in unseen], **style)  # type: ignore[arg-type]
    if target is not None:
        axes[0].axhline(
            100 * target, color="0.5", ls="--", lw=1, label="95% of LoDMeta's final (claim 2)"
        )
    for ax, what in zip(axes, ("training clients", "unseen clients"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("communication (relative units, LoDMeta Table 1)")
        ax.set_ylabel(f"accuracy of {what} (%)")
        ax.grid(True, color="0.9")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def plot_curves(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """``OUT/accuracy_vs_communication-<setting>.png``: :func:`figure_curves` of each setting,
    training and unseen clients, with claim 2's target as a dashed line (OUT is made if need
    be: on a fresh machine the summary reads the committed records alone)."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    for setting in SETTINGS:
        shown = figure_curves(runs, setting)
        if shown is None:
            continue
        seed, curves, target = shown
        fig = draw_curves(curves, target, f"FMNIST few-shot, {setting}, seed {seed}")
        written.append(save_figure(fig, out / f"accuracy_vs_communication-{setting}.png"))
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--settings", nargs="+", default=["regular-5shot"], choices=list(SETTINGS))
    ap.add_argument("--grid", action="store_true", help="Tables 2-3's epsilon x delta grid")
    ap.add_argument(
        "--clip",
        type=float,
        default=None,
        help=f"the grid's and the ladder's clip M (default {PERTURBATION_CLIP}, the configs'; "
        "another M labels the runs M<M>)",
    )
    ap.add_argument(
        "--eps",
        nargs="+",
        type=float,
        choices=GRID_EPS,
        help="only these rows of the grid (per-release epsilon; default: all)",
    )
    ap.add_argument(
        "--delta",
        nargs="+",
        type=float,
        choices=GRID_DELTA,
        help="only these columns of the grid (default: all)",
    )
    ap.add_argument(
        "--ladder",
        nargs="+",
        type=float,
        metavar="Z",
        default=[],
        help=f"LoDMeta at these noise multipliers z (delta {LADDER_DELTA:g}, the grid's M), "
        "labelled z<z>-d<delta>[-r<--rounds>]: claim 4 below the grid's noise",
    )
    ap.add_argument(
        "--reference",
        action="store_true",
        help="only the untrained network's accuracy (no run starts)",
    )
    ap.add_argument(
        "--early",
        action="store_true",
        help=f"each run's first --early-steps steps again, evaluated every --early-every (label "
        f"{EARLY!r}): claim 2's cost to reach a target, to those steps",
    )
    ap.add_argument(
        "--early-steps", type=int, default=EARLY_STEPS, help="an early run's steps (%(default)s)"
    )
    ap.add_argument(
        "--early-every",
        type=int,
        default=EARLY_EVERY,
        help="an early run evaluates every this many steps (%(default)s)",
    )
    add_run_options(
        ap,
        "lodmeta",
        rounds_help="steps (default: the config's 2000)",
        summary_help="print the table and the claims, and plot accuracy against communication",
    )
    args = ap.parse_args(argv)
    if args.set and not args.label:
        ap.error("--set needs --label (the variant's name in the run folders)")
    out = Path(args.out)
    if args.summary:
        runs = read_runs(out, records_dir(args))
        references = read_references(records_dir(args))
        print(summary_table(runs, references))
        print()
        print(grid_tables(runs))
        print()
        print("\n".join(claims(runs, references)))
        print()
        print("\n".join(plot_curves(runs, out)))
        return
    if args.clip is not None and not args.clip > 0:
        ap.error(f"--clip must be > 0, got {args.clip}")
    if any(not z > 0 for z in args.ladder):
        ap.error("--ladder's noise multipliers must be > 0 (z 0 is the unlabelled run, clipped)")
    if not args.grid and (args.eps or args.delta):
        ap.error("--eps and --delta choose cells of --grid; add --grid")
    if args.reference and (args.grid or args.ladder):
        ap.error("--reference measures the untrained network alone: not with --grid or --ladder")
    if args.early and (args.grid or args.ladder or args.reference or args.rounds):
        ap.error(
            "--early reruns the first steps of the configs' own runs (those claim 2 reads): "
            "not with --grid, --ladder, --reference or --rounds"
        )
    if args.early_steps < 1 or not 1 <= args.early_every <= args.early_steps:
        ap.error("--early-steps must be >= 1 and --early-every in [1, --early-steps]")
    # the grid's cells in its own order, whatever order --eps and --delta name them in
    grid = [(e, d) for e in GRID_EPS for d in GRID_DELTA]
    grid = [
        (e, d) for e, d in grid if e in (args.eps or GRID_EPS) and d in (args.delta or GRID_DELTA)
    ]
    # (label, privacy overrides) of each grid cell and ladder rung; a --set variant keeps its
    # own label after the cell's
    m = PERTURBATION_CLIP if args.clip is None else args.clip
    tail = (f"-M{m:g}" if m != PERTURBATION_CLIP else "") + (f"-{args.label}" if args.label else "")
    cells = [
        (grid_label(e, d) + tail, [f"privacy.release_epsilon={e}", f"privacy.delta={d}"])
        for e, d in (grid if args.grid else [])
    ] + [
        (
            f"z{z:g}-d{LADDER_DELTA:g}" + (f"-r{args.rounds}" if args.rounds else "") + tail,
            [f"privacy.noise_multiplier={z}", f"privacy.delta={LADDER_DELTA}"],
        )
        for z in args.ladder
    ]
    import torch

    torch.set_num_threads(1)
    deadline = time.time() + args.max_minutes * 60
    records: list[dict[str, Any]] = []
    for setting in args.settings:
        for seed in args.seeds:
            if args.reference:
                records.append(reference(setting, seed, args))
                if (folder := records_dir(args)) is not None:
                    file = reference_file(folder, setting, seed, args.label)
                    file.parent.mkdir(parents=True, exist_ok=True)
                    file.write_text(json.dumps(records[-1] | {"machine": machine()}, indent=1))
                continue  # the reference alone: no run starts
            if cells:
                clip = f"privacy.clip={m}"
                for cell, privacy in cells:
                    extra = ["privacy.mechanism=perturbation", *privacy, clip]
                    records.append(
                        run_one("lodmeta", setting, seed, args, deadline, [*extra, *args.set], cell)
                    )
                continue
            for method in args.methods:
                if method in SERVER and not setting.startswith("regular"):
                    continue  # a server algorithm has no graph: one setting is enough
                extra, label = args.set, args.label
                if args.early:  # a --set variant's early run is "<label>-early"
                    extra = [*extra, f"rounds={args.early_steps}", f"eval_every={args.early_every}"]
                    label = early_label(label)
                records.append(run_one(method, setting, seed, args, deadline, extra, label))
    print(json.dumps({"machine": machine(), "runs": records}, indent=1))


if __name__ == "__main__":
    main()
