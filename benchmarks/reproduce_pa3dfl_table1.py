"""Reproduce Pa3dFL's Table 1 (Fashion-MNIST columns, Ideal and Hetero) in resumable chunks.

Runs each method's config ``sweeps/configs/pa3dfl/fmnist_<setting>_<method>.yaml`` (Pa3dFL's
Appendix D: 100 IID clients of 600 records split 0.8/0.1/0.1 into train/validation/test, capacity
ratios all 1 (ideal) or ~ U[0.01, 1] (hetero), client fraction 0.2, batch 50, 5 local epochs, lr
decay 0.998, 500 rounds with early stopping once 0.2R rounds pass without a validation gain) for
each setting and seed. Each run lives in ``OUT/<setting>-<method>[-<label>]-r<rounds>-s<seed>/``
(default OUT: ``~/.cache/fedsweep-runs/pa3dfl``, see benchmarks/_runs.py): every
``--checkpoint-every`` rounds, and when the run ends (its last round or its early stop), the
engine's whole state goes to ``checkpoint.pt``; a later invocation with the same OUT resumes each
run where it stopped and skips ended ones, exactly as benchmarks/reproduce_table1.py does
(``--max-minutes`` stops cleanly after the next checkpoint past that budget, ``--until-round``
after that round). Per-round metrics go to ``metrics.jsonl``, the engine's summary to
``summary.json``. An ended run also leaves its record under ``--records`` (default
``benchmarks/records/pa3dfl/``, committed: see benchmarks/_runs.py); ``--summary`` reads the
records beside OUT's folders, and a run that has a record but no folder under OUT (it ended on
another machine) is reported from its record and not run again. Needs flcore only (no Ray,
MLflow or Optuna). ``benchmarks/pa3dfl_queue.sh`` runs what issue 24 still needs, in its order,
resumably.

An ended run is also measured on every client (``all_clients.json``, benchmarks/_runs.py
``evaluate_all_clients``): its best-validation state (``best.pt``, the best window's last round)
trains and evaluates each of the 100 clients as the next round would, nothing aggregated (a run
whose loss turned NaN, on that state only if it is from before the NaN round). The
window's figure averages about 200 client evaluations of ten states, sampled clients only; this
is one state, every client once, as a paper's mean over clients reads. ``--summary`` shows it
beside the window's figure (the table's last column); ``--replay-best`` replays a run that ended
before runs kept ``best.pt`` to its best round first (as long as the run took to get there);
``--no-all-clients`` skips it. Beneath the tables ``--summary`` pairs Pa3dFL with every other
method client by client, run against run of the same seed (the same capacity draw and test
records): mean difference, clients ahead / level / behind, sign and Wilcoxon tests
(``paired_table``), the test of Table 1's Hetero ordering that one seed allows.

``--ablation no-hn`` / ``--ablation flanc-dec`` runs Table 3's ablations of Pa3dFL (without
the HN's aggregation of the personal parts; with FLANC's decomposition), labelled so, and
compares their Hetero runs with Table 3's Fashion-MNIST figures (78.94, 84.58).

``--rounds N`` runs N rounds instead of the config's 500 (early stopping's patience is then
0.2N); such a run carries ``r<N>`` in its folder and ``rounds`` in its output, and its paper
figure is shown as ``paper`` but never compared (``comparable: false``): only a run of the
config's own rounds without ``--set`` overrides is the paper's setting.

The result is one JSON object on stdout: per run, the rounds done, whether early stopping ended
it, its best-validation round, the accuracies of that round (``accuracy``, ``accuracy_before``,
the worst capacity cluster's), the wall seconds spent and the paper's figure. ``--summary``
prints instead a markdown table of the runs under OUT (means over seeds): method, setting,
rounds, ours, paper, difference, worst-width accuracy, and beneath it each Hetero capacity
cluster's accuracy per method (:func:`width_table`), where "ours" is the accuracy of the model
the method deploys (:data:`OURS_METRIC`):

- ``accuracy_before`` for methods whose deployed model is the global model (FedAvg, FLANC,
  FjORD, HeteroFL, FedRolex): the (width-p_i) global model each client receives, on its own test
  records;
- ``accuracy`` for the personalized methods (Ditto, pFedHN, Local-only, LG-FedAvg, TailorFL,
  pFedGate, Pa3dFL): each client's personal model after its local training.

The configs stop early on the validation accuracy of that same model (:data:`SELECT_METRIC`),
averaged over a window of :data:`WINDOW` evaluation rounds (flcore.engine): one round's figure
is a mean over its 20 sampled clients, of varied widths, so the best single round is mostly the
luckiest draw of clients, and its test accuracy, on the same clients, shares the luck (1.2-1.4
points on session 28's FLANC and TailorFL runs, BENCHMARKS.md). ``--summary`` scores every run
by this rule from its logged curve (:func:`rescore`), so runs that ended under the earlier rule
(one round, ``val_accuracy`` for every method) are judged alike; their worst-width cell, which
the curve does not hold, is shown only for runs whose own summary followed the rule.

    .venv/bin/python benchmarks/reproduce_pa3dfl_table1.py --methods fedavg pa3dfl \\
        --settings hetero --seeds 0 1 2 --max-minutes 50
    .venv/bin/python benchmarks/reproduce_pa3dfl_table1.py --summary
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
    ALL_CLIENTS,
    BEST,
    RunBusy,
    add_all_clients_to_record,
    add_run_options,
    claim_line,
    compare,
    evaluate_all_clients,
    execution_overrides,
    read_curve,
    record_file,
    records_dir,
    replay_best,
    resume_run,
    run_ended,
    save_figure,
    scan_runs,
    seed_cell,
    summary_ended,
)

from analysis.paper import PA3DFL_ABLATION_FMNIST, PA3DFL_FMNIST  # noqa: E402
from flcore.engine import window_mean  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "sweeps" / "configs" / "pa3dfl"
METHODS = (
    "fedavg",
    "ditto",
    "pfedhn",
    "flanc",
    "fjord",
    "heterofl",
    "fedrolex",
    "local",
    "lg_fedavg",
    "tailorfl",
    "pfedgate",
    "pa3dfl",
)
SETTINGS = ("ideal", "hetero")
#: Table 3's ablations (``--ablation NAME``, Pa3dFL only): the override, and the paper's
#: Fashion-MNIST figure, which is its Hetero setting's (89.55 x (1 - 11.84%) = 78.94)
ABLATIONS: dict[str, tuple[str, str]] = {
    "no-hn": ("algorithm_params.hn_aggregation=false", "without_hn_aggregation"),
    "flanc-dec": ("algorithm_params.decomposition=flanc", "flanc_decomposition"),
}


def paper_figure(method: str, setting: str, label: str | None) -> float | None:
    """The paper's figure for a run: Table 1's cell, or Table 3's for an ablation label."""
    if label in ABLATIONS:
        if method != "pa3dfl" or setting != "hetero":
            return None
        return PA3DFL_ABLATION_FMNIST[ABLATIONS[label][1]]
    return PA3DFL_FMNIST[setting].get(method)


def is_comparable(rounds: int, label: str | None, overrides: list[str]) -> bool:
    """The paper's setting: the config's 500 rounds, and no override but an ablation's own."""
    if label in ABLATIONS:
        return rounds == 500 and overrides == [ABLATIONS[label][0]]
    return rounds == 500 and not overrides and not label


#: the accuracy of the model each method deploys: the global model a client receives
#: (``accuracy_before``) or the client's personal model after local training (``accuracy``)
OURS_METRIC: dict[str, str] = {
    **dict.fromkeys(("fedavg", "flanc", "fjord", "heterofl", "fedrolex"), "accuracy_before"),
    **dict.fromkeys(
        ("ditto", "pfedhn", "local", "lg_fedavg", "tailorfl", "pfedgate", "pa3dfl"), "accuracy"
    ),
}
#: the validation metric each method's config stops on: that of the model it deploys
SELECT_METRIC: dict[str, str] = {m: f"val_{metric}" for m, metric in OURS_METRIC.items()}
#: evaluation rounds early stopping averages (the configs' ``early_stopping.window``)
WINDOW = 10
_RUN = re.compile(r"^(?P<setting>ideal|hetero)-(?P<name>.+)-r(?P<rounds>\d+)-s(?P<seed>\d+)$")


def _pct(value: Any) -> float | None:
    return None if value is None else round(100.0 * float(value), 2)


def config_path(setting: str, method: str) -> Path:
    return CONFIGS / f"fmnist_{setting}_{method}.yaml"


def run_one(
    method: str, setting: str, seed: int, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Run (or resume, or only read) one run; returns its JSON record."""
    from flcore.config import load_config

    over = [f"seed={seed}", f"workers={args.workers}", *execution_overrides(args)]
    if args.rounds is not None:
        over.append(f"rounds={args.rounds}")
    cfg = load_config(config_path(setting, method), [*over, *args.set])
    label = f"-{args.label}" if args.label else ""
    run_dir = Path(args.out) / f"{setting}-{method}{label}-r{cfg.rounds}-s{seed}"
    record = record_file(args, run_dir.name)
    if record is not None and record.is_file() and not run_dir.is_dir():
        # the run ended elsewhere (another machine or session) and left its record: it stands
        return recorded_run(record, method, setting, seed, args)
    engine, summary, spent = resume_run(
        cfg,
        run_dir,
        checkpoint_every=args.checkpoint_every,
        deadline=deadline,
        until_round=args.until_round,
        record=record,
    )
    every = None
    if run_ended(engine, summary) and args.all_clients:
        diverged = summary.get("diverged_round")
        if args.replay_best and engine.early_stopping_metric is not None and diverged is None:
            replay_best(cfg, run_dir, checkpoint_every=args.checkpoint_every, deadline=deadline)
        # a diverged run: on its best state before the NaN round, as it reports (or not at all)
        every = evaluate_all_clients(cfg, run_dir, diverged_round=diverged)
        if every is not None and record is not None and record.is_file():
            add_all_clients_to_record(record, every)
    return run_row(
        run_dir.name, method, setting, seed, args, summary, every,
        rounds=engine.rounds, rounds_done=engine.round, ended=run_ended(engine, summary),
        stopped_early=engine.stopped_early, seconds=round(spent, 1), device=cfg.device,
    )  # fmt: skip


def recorded_run(
    record: Path, method: str, setting: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """What :func:`run_one` returns for a run that ended elsewhere: read from its committed
    record, nothing run (delete the record, or pass another ``--records``, to run it again)."""
    doc = json.loads(record.read_text())
    summary = doc["summary"]
    print(f"{doc['run']}: ended before (record {record}); not run again", file=sys.stderr)
    return run_row(
        doc["run"], method, setting, seed, args, summary, doc.get("all_clients"),
        rounds=doc["config"].get("rounds"), rounds_done=summary.get("rounds_completed"),
        ended=True, stopped_early=summary.get("early_stopped") == 1.0,
        seconds=doc.get("seconds"), device=doc["config"].get("device"),
        from_record=str(record),
    )  # fmt: skip


def run_row(
    name: str,
    method: str,
    setting: str,
    seed: int,
    args: argparse.Namespace,
    summary: dict[str, Any],
    every: dict[str, Any] | None,
    **run: Any,
) -> dict[str, Any]:
    """One run's entry in the JSON output: its name and what it ran (``run``: rounds, rounds
    done, ended, stopped early, seconds, device, ...), its summary's accuracies in %, the
    all-client evaluation's (``every``, if measured) and the paper's figure."""
    metric = OURS_METRIC[method]
    every = every or {}
    return {
        "run": name,
        "method": method,
        "setting": setting,
        "overrides": args.set,
        "seed": seed,
        **run,
        "diverged_round": summary.get("diverged_round"),
        "best_round": summary.get("best_round"),
        "ours_metric": metric,
        "accuracy": _pct(summary.get("accuracy")),
        "accuracy_before": _pct(summary.get("accuracy_before")),
        "accuracy_worst_width": _pct(summary.get("accuracy_worst_width")),
        "accuracy_before_worst_width": _pct(summary.get("accuracy_before_worst_width")),
        "global_accuracy": _pct(summary.get("global_accuracy")),
        "all_clients": _pct(every.get(metric)),
        "all_clients_worst_width": _pct(every.get(f"{metric}_worst_width")),
        "all_clients_round": every.get("state_round"),
        "paper": paper_figure(method, setting, args.label),
        "comparable": is_comparable(run["rounds"], args.label, args.set),
    }


def read_runs(out: Path, records: Path | None = None) -> list[dict[str, Any]]:
    """Every run folder under ``out`` with a ``summary.json`` or a ``metrics.jsonl`` (a run
    whose first chunk is still running: summary ``{}``), and every record under ``records`` of
    a run with no such folder: its name parts and summary."""
    found = scan_runs(out, _RUN, METHODS, records, under_way=True)
    return [r | {"rounds": int(r["rounds"])} for r in found]


def trailing_means(curve: list[dict[str, Any]], key: str, window: int = WINDOW) -> list[tuple]:
    """``(round, mean)`` of ``key`` over the last ``window`` rounds that measured it (fewer at
    the start), the figure early stopping tracks (:func:`rescore`), one pair per such round."""
    measured = [r for r in curve if r.get(key) is not None and math.isfinite(r[key])]
    return [
        (int(r["round"]), window_mean([x[key] for x in measured[max(0, i + 1 - window) : i + 1]]))
        for i, r in enumerate(measured)
    ]


def rescore(
    curve: list[dict[str, Any]], method: str, window: int = WINDOW
) -> tuple[float, int, int] | None:
    """Early stopping's choice, replayed on a run's logged ``curve`` (one dict per round): the
    first best mean of :data:`SELECT_METRIC` over ``window`` measuring rounds in a row (fewer
    at the start, as flcore.engine tracks it), and the mean of :data:`OURS_METRIC` over those
    rounds, with the window's first and last round. None if nothing was measured."""
    select, report = SELECT_METRIC[method], OURS_METRIC[method]
    means = trailing_means(curve, select, window)
    if not means:
        return None
    best = max(range(len(means)), key=lambda i: (means[i][1], -i))  # the first best
    measured = [r for r in curve if r.get(select) is not None and math.isfinite(r[select])]
    rows = measured[max(0, best + 1 - window) : best + 1]
    figures = [r[report] for r in rows if r.get(report) is not None]
    if not figures:
        return None
    return statistics.fmean(figures), int(rows[0]["round"]), int(rows[-1]["round"])


def _has_curve(run: dict[str, Any]) -> bool:
    """Whether :func:`read_curve` has something to read for a run :func:`read_runs` found."""
    folder = run.get("folder")
    if folder is not None:
        return (Path(folder) / "metrics.jsonl").is_file()
    return bool((run.get("record") or {}).get("curve"))


def all_clients(run: dict[str, Any]) -> dict[str, Any] | None:
    """The all-client evaluation of a run :func:`read_runs` found: its folder's
    ``all_clients.json``, or its record's ``all_clients``; None if it has none."""
    folder = run.get("folder")
    if folder is not None:
        file = Path(folder) / ALL_CLIENTS
        return dict(json.loads(file.read_text())) if file.is_file() else None
    return (run.get("record") or {}).get("all_clients")


def _last_round(run: dict[str, Any], curve: list[dict[str, Any]] | None = None) -> int:
    """The last round a run got to: its ``summary.json``'s, or its curve's when that is
    further (a run under way logs rounds past the summary its last chunk wrote)."""
    curve = (read_curve(run) if _has_curve(run) else []) if curve is None else curve
    return max([int(run["summary"].get("rounds", 0))] + [int(r["round"]) for r in curve])


def _summary_current(run: dict[str, Any]) -> bool:
    """Whether a run's summary covers every round it logged (not one a later chunk passed)."""
    return int(run["summary"].get("rounds", 0)) >= _last_round(run)


def _follows_rule(summary: dict[str, Any], method: str) -> bool:
    """Whether a run's own summary was chosen by the summary's rule (metric and window)."""
    start, end = summary.get("best_window_start"), summary.get("best_round")
    return (
        summary.get(f"best_{SELECT_METRIC[method]}") is not None
        and start is not None
        and end is not None
        and end - start + 1 <= WINDOW
    )


def _ours(run: dict[str, Any], curve: list[dict[str, Any]]) -> float | None:
    """A run's figure (a fraction, :data:`OURS_METRIC`): its logged curve rescored by the
    window rule (:func:`rescore`), else its summary's value; None if it has neither."""
    method = run["method"]
    scored = rescore(curve, method) if curve else None
    return scored[0] if scored is not None else run["summary"].get(OURS_METRIC[method])


def summary_table(runs: list[dict[str, Any]]) -> str:
    """Markdown: one row per (method, setting, label, rounds), means over its ended seeds;
    seeds still under way are named beside them with their progress (a mean that took a
    half-trained seed in would be neither's figure). A group with no ended seed shows its runs
    so far, its difference ``n/a (run not ended)``."""
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["method"], r["setting"], r["label"], r["rounds"]), []).append(r)
    lines = [
        "| method | setting | rounds | seeds | ours (metric) | paper | difference | worst width "
        "| all clients, best state (worst width) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(METHODS)}
    for (method, setting, label, rounds), group in sorted(
        groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1], kv[0][2], kv[0][3])
    ):
        metric = OURS_METRIC[method]
        curves = {id(g): read_curve(g) if _has_curve(g) else [] for g in group}
        done = sorted({_last_round(g, curves[id(g)]) for g in group})
        # a run still under way (neither its last round nor its early stop) is no result
        # yet: the cells are its ended seeds', the others named beside them with their
        # progress; a group with none ended shows its runs so far
        ended = [g for g in group if summary_ended(g["summary"], rounds)]
        under_way = [g for g in group if not summary_ended(g["summary"], rounds)]
        shown = ended or group
        ours = [100 * v for g in shown if (v := _ours(g, curves[id(g)])) is not None]
        worst = [
            100 * s[f"{metric}_worst_width"]
            for g in shown
            if _follows_rule(s := g["summary"], method)
            and _summary_current(g)
            and s.get(f"{metric}_worst_width") is not None
        ]
        paper = paper_figure(method, setting, label)
        # an ablation's folder name is its label: its override is the ablation's own
        comparable = rounds == 500 and (not label or label in ABLATIONS)
        diverged = sorted(
            {int(d) for g in ended if (d := g["summary"].get("diverged_round")) is not None}
        )
        diff = (
            f"n/a (diverged: NaN loss at round {', '.join(map(str, diverged))}; ours is the "
            "best validation round before it)"
            if diverged
            else f"n/a (not the paper's setting{'' if ended else '; run not ended'})"
            if not comparable
            else "n/a (run not ended)"
            if not ended
            else f"{statistics.fmean(ours) - paper:+.2f}"
            if ours and paper is not None
            else "-"
        )
        name = f"{method} ({label})" if label else method
        every = [
            e for g in shown if (e := all_clients(g)) is not None and e.get(metric) is not None
        ]
        every_cell = seed_cell([100 * e[metric] for e in every])
        if every:
            worst_every = [
                100 * e[f"{metric}_worst_width"]
                for e in every
                if e.get(f"{metric}_worst_width") is not None
            ]
            every_cell += f" ({seed_cell(worst_every)})" if worst_every else ""
            if len(every) < len(shown):
                every_cell += f", {len(every)} of {len(shown)} seeds"
        seeds_cell, ours_cell = str(len(shown)), f"{seed_cell(ours)} ({metric})"
        if ended and under_way:
            seeds_cell += f" (+{len(under_way)} under way)"
            progress = []
            for g in sorted(under_way, key=lambda g: g["seed"]):
                so_far = rescore(curves[id(g)], method) if curves[id(g)] else None
                figure = f"{100 * so_far[0]:.2f} so far, " if so_far is not None else ""
                progress.append(f"seed {g['seed']} {figure}round {_last_round(g, curves[id(g)])}")
            ours_cell += f"; under way: {'; '.join(progress)}"
        lines.append(
            f"| {name} | {setting} | {rounds} (ran {', '.join(map(str, done))}) | {seeds_cell} "
            f"| {ours_cell} | {paper if paper is not None else '-'} | {diff} "
            f"| {seed_cell(worst)} | {every_cell} |"
        )
    return "\n".join(lines)


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def width_table(
    runs: list[dict[str, Any]], setting: str = "hetero", every_client: bool = False
) -> str:
    """Markdown: each capacity cluster's accuracy (the deployed model's, :data:`OURS_METRIC`)
    for every method's runs of ``setting`` whose summary followed the window rule
    (:func:`_follows_rule`) and covers every round it logged: one column per (method, label,
    rounds) with its seed count (its ended seeds; its chunks so far when none ended), one row
    per width, means over the seeds whose draw has that width (a capacity-unaware method's
    seeds may have trained different widths: FedAvg's min_i p_i). The paper reports none; it
    shows who a method serves well (Pa3dFL's narrowest clients against FedAvg's,
    BENCHMARKS.md). ``every_client``: the clusters of each run's all-client evaluation
    (:func:`all_clients`) instead, for the runs that have one. Empty when no run qualifies."""
    qualified: dict[tuple[str, str, int], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in runs:
        method, summary = r["method"], r["summary"]
        if every_client:
            summary = all_clients(r) or {}
        if r["setting"] != setting or not (
            summary if every_client else _follows_rule(summary, method) and _summary_current(r)
        ):
            continue
        qualified.setdefault((method, r["label"], r["rounds"]), []).append((r, summary))
    columns: dict[tuple[str, str, int], dict[float, list[float]]] = {}
    seeds: dict[tuple[str, str, int], set[int]] = {}
    for column, found in qualified.items():
        # a column's ended seeds only, as in summary_table; its chunks so far if none ended
        ended = [(r, s) for r, s in found if summary_ended(r["summary"], r["rounds"])]
        for r, summary in ended or found:
            prefix = f"{OURS_METRIC[r['method']]}_width_"
            cells = columns.setdefault(column, {})
            seeds.setdefault(column, set()).add(r["seed"])
            for name, value in summary.items():
                if name.startswith(prefix) and value is not None:
                    cells.setdefault(float(name.removeprefix(prefix)), []).append(100 * value)
    columns = {k: v for k, v in columns.items() if v}
    if not columns:
        return ""
    order = {m: i for i, m in enumerate(METHODS)}
    keys = sorted(columns, key=lambda k: (order[k[0]], k[1], k[2]))
    names = [
        f"{m} ({label + ', ' if label else ''}r{n}, {_seeds(len(seeds[m, label, n]))})"
        for m, label, n in keys
    ]
    lines = [
        f"| width ({setting}) | {' | '.join(names)} |",
        "|---|" + "---|" * len(keys),
    ]
    for width in sorted({w for cells in columns.values() for w in cells}):
        row = [seed_cell(columns[k].get(width, [])) for k in keys]
        lines.append(f"| {width:g} | {' | '.join(row)} |")
    return "\n".join(lines)


#: the method whose Table 1 ordering :func:`paired_table` tests (the paper's Hetero column:
#: Pa3dFL above FedAvg, HeteroFL and FLANC; FjORD above Pa3dFL)
PAIRED_ANCHOR = "pa3dfl"


def _per_client(run: dict[str, Any]) -> dict[int, tuple[float | None, float]] | None:
    """A run's per-client (width, deployed accuracy) on its best state, or None."""
    rows = (all_clients(run) or {}).get("per_client")
    metric = OURS_METRIC[run["method"]]
    if not rows:
        return None
    return {int(r["client"]): (r.get("width"), float(r[metric])) for r in rows if metric in r}


def _client_diffs(
    rows_a: dict[int, tuple[float | None, float]], rows_b: dict[int, tuple[float | None, float]]
) -> list[float] | None:
    """Per client both runs measured, ``a`` minus ``b`` in points (to 1e-3 points: a record's 6
    digits and a folder's full floats tie alike); None when they share no client or a client's
    width differs between them (:func:`_per_client` rows)."""
    clients = sorted(rows_a.keys() & rows_b.keys())
    if not clients or any(rows_a[c][0] != rows_b[c][0] for c in clients):
        return None
    return [round(100 * (rows_a[c][1] - rows_b[c][1]), 3) for c in clients]


def paired_table(runs: list[dict[str, Any]], anchor: str = PAIRED_ANCHOR) -> str:
    """Markdown: ``anchor``'s deployed model against each other method's, client by client.

    Two runs pair when they share the setting and seed (so the capacity draw and every
    client's test records) and both measured every client on their best state
    (``per_client`` rows of :func:`all_clients`; a pair whose clients' widths differ is left
    out). Per pair, in points of :data:`OURS_METRIC` each: the mean difference over clients,
    the clients ahead / level / behind, the two-sided sign test's p (ahead against behind)
    and the Wilcoxon signed-rank test's p (zero differences dropped). The tests take the two
    trained models as given: a small p says the gap is not the test records' noise, not that
    another training seed would keep it. Empty when no pair exists."""
    from scipy.stats import binomtest, wilcoxon

    measured = [(r, rows) for r in runs if (rows := _per_client(r))]
    lines = []
    order = {m: i for i, m in enumerate(METHODS)}
    for a, rows_a in measured:
        if a["method"] != anchor or a["label"]:
            continue
        others = sorted(
            (
                (b, rows_b)
                for b, rows_b in measured
                if (b["setting"], b["seed"]) == (a["setting"], a["seed"])
                and (b["method"], b["label"]) != (anchor, "")
            ),
            key=lambda br: (order[br[0]["method"]], br[0]["label"], br[0]["rounds"]),
        )
        for b, rows_b in others:
            diffs = _client_diffs(rows_a, rows_b)
            if diffs is None:
                continue
            ahead = sum(d > 0 for d in diffs)
            behind = sum(d < 0 for d in diffs)
            sign = binomtest(ahead, ahead + behind).pvalue if ahead + behind else math.nan
            ranks = wilcoxon(diffs).pvalue if ahead + behind else math.nan
            name = f"{b['method']} ({b['label']})" if b["label"] else b["method"]
            lines.append(
                f"| {a['setting']} | {a['seed']} | {anchor} (r{a['rounds']}) "
                f"| {name} (r{b['rounds']}) | {len(diffs)} | {statistics.fmean(diffs):+.2f} "
                f"| {ahead} / {len(diffs) - ahead - behind} / {behind} "
                f"| {sign:.3g} | {ranks:.3g} |"
            )
    if not lines:
        return ""
    head = [
        f"| setting | seed | {anchor} | against | clients | mean difference (points) "
        "| ahead / level / behind | sign test p | Wilcoxon p |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines)


#: Table 1's Hetero ordering the issue asks to keep (Pa3dFL above FedAvg, HeteroFL and FLANC),
#: and TailorFL, 1.14 below Pa3dFL in the paper ("report it, don't force it"): (setting,
#: method Pa3dFL is above, the paper's two cells)
ORDERINGS = (
    ("hetero", "fedavg"),
    ("hetero", "heterofl"),
    ("hetero", "flanc"),
    ("hetero", "tailorfl"),
)


def _seed_values(runs: list[dict[str, Any]], method: str, setting: str) -> dict[int, float]:
    """Seed -> the deployed model's figure (%, :data:`OURS_METRIC`, rescored by the window
    rule as :func:`summary_table` does) of ``method``'s ended, unlabelled 500-round runs of
    ``setting``: the paper's setting only."""
    out = {}
    for r in runs:
        if (r["method"], r["setting"], r["label"], r["rounds"]) != (method, setting, "", 500):
            continue
        if not summary_ended(r["summary"], 500) or r["summary"].get("diverged_round") is not None:
            continue
        value = _ours(r, read_curve(r) if _has_curve(r) else [])
        if value is not None:
            out[int(r["seed"])] = 100 * float(value)
    return out


def _paired_by_seed(runs: list[dict[str, Any]], a: str, b: str, setting: str) -> list[str]:
    """``s<seed> <mean difference>`` of ``a`` minus ``b``, client by client on each seed where
    both unlabelled 500-round runs measured every client with the same widths."""
    rows = {
        (r["method"], int(r["seed"])): pc
        for r in runs
        if r["setting"] == setting and not r["label"] and r["rounds"] == 500
        if (pc := _per_client(r))
    }
    out = []
    for seed in sorted({s for m, s in rows if m == a}):
        x, y = rows.get((a, seed)), rows.get((b, seed))
        if x is None or y is None:
            continue
        diffs = _client_diffs(x, y)
        if diffs is not None:
            out.append(f"s{seed} {statistics.fmean(diffs):+.2f}")
    return out


def ordering_claims(runs: list[dict[str, Any]], anchor: str = PAIRED_ANCHOR) -> list[str]:
    """Table 1's orderings (:data:`ORDERINGS`), each a verdict of
    :func:`benchmarks._runs.compare` on the two methods' per-seed figures at the paper's 500
    rounds (``not measured`` where a side has no ended 500-round run: an r200 run is no
    evidence for a 500-round cell; ``inconclusive`` below three seeds a side or within two
    standard errors), with the paper's cells, the seeds behind each side and, where they
    exist, the client-by-client differences per seed (:func:`paired_table`)."""
    lines = []
    for n, (setting, other) in enumerate(ORDERINGS, start=1):
        a, b = _seed_values(runs, anchor, setting), _seed_values(runs, other, setting)
        verdict, shown = compare(list(a.values()), list(b.values()), ">")
        paper_a, paper_b = paper_figure(anchor, setting, ""), paper_figure(other, setting, "")
        seeds = f"seeds {sorted(a) or '-'} / {sorted(b) or '-'}"
        paired = _paired_by_seed(runs, anchor, other, setting)
        extra = f"; client by client: {', '.join(paired)}" if paired else ""
        if not b:
            shorter = sorted(
                {f"r{r['rounds']}" + (f" {r['label']}" if r["label"] else "") for r in runs
                 if (r["method"], r["setting"]) == (other, setting) and r["rounds"] != 500}
            )  # fmt: skip
            if shorter:
                extra += f"; {other} has {', '.join(shorter)} runs only, no 500-round evidence"
        text = (
            f"{setting}: {anchor} above {other} (paper {paper_a} > {paper_b}; ours at 500 "
            f"rounds, {seeds}{extra})"
        )
        lines.append(claim_line(n, text, [(verdict, shown)]))
    return lines


#: one colour a method in every figure (matplotlib's ten, then navy; Pa3dFL black): no two
#: alike (a light grey beside C7's grey read as one method)
COLOURS = dict(enumerate([*(f"C{i}" for i in range(10)), "navy", "black"]))


def draw_setting(runs: list[dict[str, Any]], setting: str):  # type: ignore[no-untyped-def]
    """The figure of one setting's runs, or None if none has a curve: each (method, label,
    rounds)'s lowest seed, the deployed model's accuracy (:data:`OURS_METRIC`) by round as the
    :data:`WINDOW`-round trailing mean early stopping tracks (:func:`trailing_means`), to the
    run's last logged round (runs under way end early), with the paper's figure as a dot of the
    same colour at round 500 where the run is the paper's method and setting or a Table 3
    ablation. One colour a method (:data:`COLOURS`; Pa3dFL's black and thicker); solid: the
    config's 500 rounds, dashed: shorter runs (r200), dash-dotted: Table 3's ablations (Pa3dFL's
    colour too), dotted: other labelled variants."""
    import matplotlib.pyplot as plt

    order = {m: i for i, m in enumerate(METHODS)}
    first: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        if r["setting"] == setting and _has_curve(r):
            first.setdefault((r["method"], r["label"], r["rounds"]), r)
    if not first:
        return None
    fig, ax = plt.subplots(figsize=(9, 5.2), layout="constrained")
    for key in sorted(first, key=lambda k: (order[k[0]], k[1], k[2])):
        (method, label, rounds), run = key, first[key]
        points = trailing_means(read_curve(run), OURS_METRIC[method])
        if not points:
            continue
        name = f"{method} ({label})" if label else method
        style = "-." if label in ABLATIONS else ":" if label else "-" if rounds == 500 else "--"
        colour = COLOURS[order[method]]
        ax.plot(
            [p[0] for p in points],
            [100 * p[1] for p in points],
            ls=style,
            lw=2.0 if method == PAIRED_ANCHOR else 1.3,
            color=colour,
            label=f"{name}, r{rounds}, seed {run['seed']}",
        )
        paper = paper_figure(method, setting, label)
        if paper is not None and (not label or label in ABLATIONS):
            ax.plot([500], [paper], "o", ms=5, color=colour)
    ax.set_ylim(bottom=max(ax.get_ylim()[0], 60))
    ax.set_xlabel("round")
    ax.set_ylabel(f"accuracy of the deployed model (%), {WINDOW}-round trailing mean")
    ax.set_title(f"Pa3dFL Table 1, Fashion-MNIST {setting}: ours by round; dots at 500: the paper")
    ax.grid(True, color="0.9")
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    return fig


def plot_curves(runs: list[dict[str, Any]], out: Path) -> list[str]:
    """``OUT/table1-<setting>.png`` of each setting with runs (:func:`draw_setting`); the paths
    written."""
    import matplotlib

    matplotlib.use("Agg")
    figures = {s: draw_setting(runs, s) for s in SETTINGS}
    return [save_figure(f, out / f"table1-{s}.png") for s, f in figures.items() if f is not None]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    add_run_options(
        ap,
        "pa3dfl",
        rounds_help="rounds per run (default: the config's 500)",
        summary_help="print the markdown table of OUT",
    )
    ap.add_argument(
        "--no-all-clients",
        dest="all_clients",
        action="store_false",
        help=f"skip measuring every client on an ended run's best state ({ALL_CLIENTS})",
    )
    ap.add_argument(
        "--replay-best",
        action="store_true",
        help=f"replay an ended run that has no {BEST} (it ended before runs kept one) from "
        "round 0 to its best round, resumably, to measure every client on that state",
    )
    ap.add_argument(
        "--ablation",
        choices=sorted(ABLATIONS),
        help="a Table 3 ablation of Pa3dFL (sets its override and label, compared with Table 3)",
    )
    ap.add_argument(
        "--plot",
        type=Path,
        metavar="DIR",
        help="with --summary, also draw each setting's curves to DIR/table1-<setting>.png "
        "(plot_curves; the paths go to stderr)",
    )
    args = ap.parse_args(argv)
    if args.plot is not None and not args.summary:
        ap.error("--plot draws the --summary's runs: give --summary too")
    if args.ablation:
        if args.methods == list(METHODS):
            args.methods = ["pa3dfl"]
        if args.set or args.label or args.methods != ["pa3dfl"]:
            ap.error("--ablation runs Pa3dFL alone, without --set or --label")
        args.set, args.label = [ABLATIONS[args.ablation][0]], args.ablation
    if args.set and not args.label:
        ap.error("--set needs --label (the variant's name in the run folders)")
    if args.summary:
        runs = read_runs(Path(args.out), records_dir(args))
        print(summary_table(runs))
        widths = width_table(runs)
        if widths:
            print("\nEach capacity cluster's accuracy (deployed model, runs under the rule):\n")
            print(widths)
        widths = width_table(runs, every_client=True)
        if widths:
            print("\nThe same, every client on the run's best-validation state (all_clients):\n")
            print(widths)
        if args.plot is not None:
            print("\n".join(plot_curves(runs, args.plot)), file=sys.stderr)
        paired = paired_table(runs)
        if paired:
            print(
                f"\n{PAIRED_ANCHOR} against each method, client by client (same seed, so the "
                "same capacity draw and test records; every client on each run's best state):\n"
            )
            print(paired)
        print("\nTable 1's ordering (verdicts on the seeds' figures at 500 rounds):\n")
        print("\n".join(ordering_claims(runs)))
        return
    missing = [
        str(config_path(s, m))
        for s in args.settings
        for m in args.methods
        if not config_path(s, m).is_file()
    ]
    if missing:
        ap.error(f"no config: {', '.join(missing)}")
    deadline = time.time() + args.max_minutes * 60
    runs, busy = [], []
    for s in args.settings:
        for m in args.methods:
            for seed in args.seeds:
                try:
                    runs.append(run_one(m, s, seed, args, deadline))
                except RunBusy as e:  # another process runs it: the others go on
                    busy.append(str(e))
                    print(f"skipped: {e}", file=sys.stderr)
    print(json.dumps({"machine": machine(), "runs": runs}, indent=1))
    if busy:
        sys.exit(f"{len(busy)} run(s) left to the processes running them")


if __name__ == "__main__":
    main()
