"""Summarise ``reproduce_table1.py``'s run folders: accuracies by round beside the paper's.

Reads every ``OUT/<method>[-label]-<clients>-s<seed>/metrics.jsonl`` (the last row of each round
counts) and prints one JSON object: per run, ``accuracy`` (after the round's local training) and
``accuracy_before`` (the models the clients started the round with) at each evaluated round, in
%, the epsilon spent, rounds done, seconds of running time, and the paper's Table 1 figure; then
the mean and standard deviation over seeds of each (method, label, clients) at the furthest
round it evaluated, over the seeds that reached it (a seed still running is named, not
averaged). ``--markdown`` prints the BENCHMARKS.md tables instead: a row per run ("after /
before" by round), then a row per (method, label, clients) with the means over seeds beside the
paper. ``--plot PNG`` draws the seed means by round, before and after local training.
``--clients 20`` (or 100) keeps only that column's runs, e.g. to plot one setting alone.

    .venv/bin/python benchmarks/table1_summary.py --rounds 10 50 100 200
    .venv/bin/python benchmarks/table1_summary.py --markdown --plot table1.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runs import runs_dir  # noqa: E402

from analysis.paper import ACCURACY, FMNIST_20, FMNIST_100  # noqa: E402

PAPER_ROUND = 200  # Table 1's figures are at round 200: a gap at an earlier round is not theirs
_RUN = re.compile(r"^(?P<name>.+)-(?P<clients>\d+)-s(?P<seed>\d+)$")


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100.0 * value, 2)


def read_run(folder: Path, methods: list[str]) -> dict | None:
    """One run folder's figures, or None if it is not a run folder."""
    m = _RUN.match(folder.name)
    log = folder / "metrics.jsonl"
    if m is None or not log.is_file():
        return None
    name = m["name"]
    method = next((x for x in sorted(methods, key=len, reverse=True) if name.startswith(x)), name)
    label = name[len(method) + 1 :] if name != method else ""
    rows: dict[int, dict] = {}
    for line in log.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["round"])] = row  # a round replayed after a resume: the last row
    evaluated = {r: row for r, row in sorted(rows.items()) if row.get("accuracy") is not None}
    spent = folder / "spent.json"
    clients = int(m["clients"])
    last = rows[max(rows)] if rows else {}
    return {
        "run": folder.name,
        "method": method,
        "label": label,
        "clients": clients,
        "seed": int(m["seed"]),
        "rounds_done": max(rows) if rows else 0,
        "seconds": json.loads(spent.read_text())["seconds"] if spent.is_file() else None,
        "epsilon": last.get("epsilon"),
        "accuracy": {r: _pct(row["accuracy"]) for r, row in evaluated.items()},
        "accuracy_before": {r: _pct(row.get("accuracy_before")) for r, row in evaluated.items()},
        "paper": ACCURACY[FMNIST_20 if clients == 20 else FMNIST_100].get(method),
    }


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _furthest(group: list[dict]) -> tuple[int, list[dict], list[dict]] | None:
    """The furthest round any run of the group evaluated, the runs that reached it, and the
    rest (seeds still running); None if no run evaluated a round."""
    lasts = [max(r["accuracy"]) for r in group if r["accuracy"]]
    if not lasts:
        return None
    at = max(lasts)
    return (
        at,
        [r for r in group if at in r["accuracy"]],
        [r for r in group if at not in r["accuracy"]],
    )


def _groups(runs: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["method"], run["label"], run["clients"]), []).append(run)
    return dict(sorted(groups.items()))


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and std over seeds of each (method, label, clients) at the furthest round it
    evaluated, over the seeds that reached that round."""
    out = []
    for (method, label, clients), group in _groups(runs).items():
        furthest = _furthest(group)
        if furthest is None:
            continue
        at, done, running = furthest
        after = _mean_std([r["accuracy"][at] for r in done])
        befores = [r["accuracy_before"][at] for r in done]
        before = _mean_std(befores) if None not in befores else (None, None)
        out.append(
            {
                "method": method,
                "label": label,
                "clients": clients,
                "seeds": sorted(r["seed"] for r in done),
                "unfinished_seeds": sorted(r["seed"] for r in running),
                "round": at,
                "accuracy": after[0],
                "accuracy_std": after[1],
                "accuracy_before": before[0],
                "accuracy_before_std": before[1],
                "paper": group[0]["paper"],
            }
        )
    return out


def _cell(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f}" + ("" if std is None else f" ± {std:.2f}")


def markdown(runs: list[dict], rounds: list[int]) -> str:
    head = "| run | paper | " + " | ".join(f"{r}" for r in rounds) + " |"
    lines = [head, "|" + "---|" * (len(rounds) + 2)]
    for run in runs:
        cells = []
        for r in rounds:
            a, b = run["accuracy"].get(r), run["accuracy_before"].get(r)
            cells.append("" if a is None else f"{a:.2f} / {'-' if b is None else f'{b:.2f}'}")
        lines.append(f"| {run['run']} | {run['paper'] or '-'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_means(summary: list[dict]) -> str:
    """A row per (method, label, clients): means ± sample std over seeds, and before - paper
    (only at the paper's round)."""
    lines = [
        "| method | clients | seeds | round | paper | after | before | before - paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        name = s["method"] + (f" ({s['label']})" if s["label"] else "")
        gap = (
            "-"
            if s["paper"] is None or s["accuracy_before"] is None or s["round"] != PAPER_ROUND
            else f"{s['accuracy_before'] - s['paper']:+.2f}"
        )
        seeds = ", ".join(map(str, s["seeds"]))
        if s["unfinished_seeds"]:
            seeds += f" ({', '.join(map(str, s['unfinished_seeds']))} running)"
        lines.append(
            f"| {name} | {s['clients']} | {seeds} | {s['round']} "
            f"| {s['paper'] or '-'} | {_cell(s['accuracy'], s['accuracy_std'])} "
            f"| {_cell(s['accuracy_before'], s['accuracy_before_std'])} | {gap} |"
        )
    return "\n".join(lines)


def plot_means(runs: list[dict], path: Path) -> Path:
    """Seed means by round, one line per (method, label, clients), over the seeds that reached
    the group's furthest round; one panel before local training (the paper's metric), one
    after."""
    import pandas as pd

    from analysis.rounds import plot_rounds

    rows = []
    for (method, label, clients), group in _groups(runs).items():
        furthest = _furthest(group)
        if furthest is None:
            continue
        done = furthest[1]
        name = "-".join(x for x in (method, label, str(clients)) if x)
        key = f"{name} ({len(done)} seed{'s' if len(done) > 1 else ''})"
        for metric, column in (("before local training", "accuracy_before"), ("after", "accuracy")):
            for rnd in sorted(set.intersection(*(set(r[column]) for r in done))):
                values = [r[column][rnd] for r in done]
                if None not in values:
                    rows.append((key, f"{metric} (%)", rnd, statistics.fmean(values)))
    history = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
    if history.empty:
        raise SystemExit("no evaluated rounds to plot")
    return plot_rounds(
        history,
        ["before local training (%)", "after (%)"],
        path,
        labels={k: k for k in history["run_id"].unique()},
        title="Table 1 (Fashion-MNIST): seed means by round",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(runs_dir("table1")))
    ap.add_argument("--rounds", nargs="+", type=int, default=[10, 50, 100, 150, 200])
    ap.add_argument(
        "--markdown", action="store_true", help="rows 'after / before' by round, then seed means"
    )
    ap.add_argument("--plot", type=Path, help="also write the seed means by round to this PNG")
    ap.add_argument(
        "--clients", type=int, choices=[20, 100], help="only the runs with this many clients"
    )
    args = ap.parse_args()
    if not Path(args.out).is_dir():
        ap.error(f"--out {args.out}: no such folder (reproduce_table1.py writes its runs there)")
    methods = sorted(ACCURACY[FMNIST_20]) + ["pfedhn_pc", "dp_fedavg_client"]
    runs = [
        run
        for folder in sorted(Path(args.out).iterdir())
        if folder.is_dir() and (run := read_run(folder, methods)) is not None
        if args.clients is None or run["clients"] == args.clients
    ]
    if args.plot is not None:
        print(f"wrote {plot_means(runs, args.plot)}", file=sys.stderr)
    if args.markdown:
        print(markdown(runs, args.rounds) + "\n\n" + markdown_means(summarise(runs)))
    else:
        print(json.dumps({"runs": runs, "summary": summarise(runs)}, indent=1))


if __name__ == "__main__":
    main()
