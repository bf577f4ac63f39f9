"""Everything the commands show people: rich tables of results, fronts, plans and attacks, and
runs tables as a table, CSV or Parquet."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from sweeps.cli.output import err_console, wide_console

__all__ = [
    "QueryFormat",
    "emit",
    "left_out",
    "print_attack",
    "print_front",
    "print_fronts",
    "print_notes",
    "print_plan",
    "print_summary",
]


class QueryFormat(StrEnum):
    table = "table"
    csv = "csv"
    parquet = "parquet"


#: what ``fedsweep run`` shows of its summary, in this order: every run's figures, then those only
#: some runs have (privacy beyond ``epsilon``, the worst capacity cluster, early stopping's best
#: window, an attack's headline leakage: `fedsweep attack` shows all of it), shown when the
#: summary holds them
_SUMMARY_ROWS = (
    "algorithm",
    "dataset",
    "accuracy",
    "accuracy_before",
    "global_accuracy",
    "accuracy_worst_width",
    "accuracy_before_worst_width",
    "epsilon",
    "dp_guarantee",
    "dp_relation",
    "client_sampling",
    "rounds",
    "rounds_completed",
    "best_round",
    "best_window_start",
    "early_stopped",
    "evaluated_clients",
    "leak_psnr_gain",
    "leak_ssim_gain",
    "leak_identified",
    "leak_psnr_gain_worst_round",
    "leak_identified_worst_round",
    "leak_reason",
    "seconds",
    "bytes_up",
    "bytes_down",
    "run_id",
    "metrics_path",
)
#: the rows every run shows, ``None`` where its summary lacks the figure
_ALWAYS = frozenset(
    ("algorithm", "dataset", "accuracy", "accuracy_before", "global_accuracy", "epsilon")
    + ("rounds", "seconds", "bytes_up", "bytes_down", "run_id", "metrics_path")
)


def _summary_keys(result: dict[str, Any]) -> list[str]:
    keys = [k for k in _SUMMARY_ROWS if k in _ALWAYS or k in result]
    at = keys.index("epsilon") + 1  # the other epsilons beside it (epsilon_shared, ...)
    more = sorted(k for k in result if k.startswith("epsilon_"))
    keys[at:at] = more
    return keys


def print_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="result", show_header=False)
    for key in _summary_keys(result):
        value = result.get(key)
        if key == "early_stopped" and value is not None:  # 1.0 / 0.0 as an MLflow metric
            value = "yes" if value else "no"
        elif isinstance(value, float):
            value = f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
        table.add_row(key, str(value))
    Console().print(table)


def print_attack(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"{doc['attack']} on {doc['algorithm']}: leakage", show_header=False)
    for key, value in doc.items():
        if value is None or key in ("attack", "algorithm", "reason", "lpips_reason"):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, shown)
    Console().print(table)
    for key in ("reason", "lpips_reason"):
        if doc.get(key):
            err_console.print(f"[yellow]{key}:[/] {escape(str(doc[key]))}", highlight=False)


def print_plan(p: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"sweep plan: {p['sweep']} (dry run: nothing started)", show_header=False)
    for key, value in p.items():
        table.add_row(key, json.dumps(value) if isinstance(value, list | dict) else str(value))
    Console().print(table)


def print_front(summary: dict[str, Any]) -> None:
    from rich.table import Table

    trials = summary["trials"]
    left_out = summary.get("n_invalid", sum(t["status"] != "FINISHED" for t in trials))
    by_alg = summary.get("pareto_by_algorithm") or {}
    rows = [r for alg in sorted(by_alg) for r in by_alg[alg]]
    objectives = [
        k for k in (rows[0] if rows else {}) if k not in {"run_id", "algorithm", "on_overall_front"}
    ]
    table = Table(
        title=f"Pareto fronts of {summary['experiment']}, per algorithm "
        f"({len(trials)} trials, {left_out} left out; * = on the overall front)"
    )
    for col in ["algorithm", *objectives, "overall", "run_id"]:
        table.add_column(col)
    for row in rows:
        values = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in objectives]
        table.add_row(
            row["algorithm"], *values, "*" if row["on_overall_front"] else "", row["run_id"]
        )
    Console().print(table)
    reasons = summary.get("invalid_reasons") or {}
    if reasons:
        Console().print(
            "left out of the fronts: " + "; ".join(f"{n} {why}" for why, n in reasons.items())
        )
    for note in summary.get("notes") or []:
        Console().print(f"note: {note}")
    for png in summary.get("pareto_pngs") or [summary.get("pareto_png")] * bool(
        summary.get("pareto_png")
    ):
        Console().print(f"Pareto plot: {png}")
    Console().print(
        f"results: {summary['results_parquet']}; MLflow parent run "
        f"{summary['parent_run_id']} (browse: fedsweep ui; report: fedsweep report "
        f"--experiment {summary.get('experiment', 'quickstart')} --out report.html)"
    )


def left_out(result: Any) -> str:
    """``"3 left out as invalid: 2 stopped early, 1 FAILED"``."""
    if not result.n_invalid:
        return "none left out"
    reasons = ", ".join(f"{n} {r}" for r, n in result.invalid_reasons.items())
    return f"{result.n_invalid} left out as invalid: {reasons}"


def print_notes(notes: list[str]) -> None:
    for note in notes:
        Console().print(f"[bold yellow]note:[/] {note}", highlight=False)


def print_fronts(analysis: Any, title: str, by: str | None) -> None:
    from rich.table import Table

    from analysis.tables import fmt, mean_std, run_ids_of

    result = analysis.result
    overall = set(result.front.get("run_id", []))
    names = [o.name for o in result.objectives]
    seeds = "n_seeds" in result.table.columns
    # What each epsilon guarantees (shared-only and none stand at inf), where runs say it.
    dp = "dp_guarantee" in result.table.columns and result.table["dp_guarantee"].notna().any()
    table = Table(title=title)
    columns = [by or "front", *names, *(["dp_guarantee"] if dp else [])]
    for col in [*columns, *(["seeds"] if seeds else []), "overall", "run_id(s)"]:
        table.add_column(col)
    fronts = result.per_group if by is not None else {"all": result.front}
    for group in sorted(fronts):
        for _, row in fronts[group].iterrows():
            table.add_row(
                group,
                *[mean_std(row, n) for n in names],
                *([fmt(row.get("dp_guarantee"))] if dp else []),
                *([fmt(row["n_seeds"])] if seeds else []),
                "*" if row.get("run_id") in overall else "",
                " ".join(run_ids_of(row)),
            )
    wide_console().print(table)


def emit(df: Any, format_: QueryFormat, out: Path | None) -> None:
    """Write a runs table as a rich table, CSV or Parquet, to ``out`` or stdout."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    if format_ is QueryFormat.parquet and out is not None:
        df.to_parquet(out, index=False)
    elif format_ is QueryFormat.csv:
        if out is None:
            typer.echo(df.to_csv(index=False), nl=False)
        else:
            df.to_csv(out, index=False)
    else:
        from rich.table import Table

        from analysis.tables import fmt

        table = Table()
        for col in df.columns:
            table.add_column(str(col))
        for row in df.itertuples(index=False):
            table.add_row(*[fmt(v) for v in row])
        if out is None:
            wide_console().print(table)
        else:
            with out.open("w") as f:
                Console(file=f, width=200).print(table)
    if out is not None:
        err_console.print(f"wrote {escape(str(out))}")
