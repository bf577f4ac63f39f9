"""The files ``fedsweep pareto`` writes for a front: CSVs, a PNG and an interactive HTML."""

from __future__ import annotations

import re
from pathlib import Path

from analysis.fronts import FrontAnalysis

__all__ = ["file_stem", "write_front_files"]


def file_stem(names: list[str]) -> str:
    """A file-name stem for a set of experiments: ``"a+b"``, unsafe characters as ``_``."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", "+".join(names)) or "runs"


def write_front_files(
    analysis: FrontAnalysis,
    out_dir: str | Path,
    stem: str,
    *,
    by: str | None = "algorithm",
    title: str | None = None,
) -> dict[str, Path]:
    """Write ``<stem>_pareto.csv`` (the overall front), ``<stem>_ranks.csv`` (every usable run
    or configuration with its ``rank``, ``on_front`` and ``on_group_front``), and with two or
    more objectives ``<stem>_pareto.png`` and ``<stem>_pareto.html`` (the first objective on x,
    the second on y).

    Returns:
        The paths written, keyed ``csv``, ``ranks_csv``, ``png``, ``html``.
    """
    from analysis.interactive import write_pareto_html
    from analysis.plots import plot_pareto_2d

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = analysis.result
    files = {"csv": out / f"{stem}_pareto.csv", "ranks_csv": out / f"{stem}_ranks.csv"}
    result.front.to_csv(files["csv"], index=False)
    result.table.sort_values("rank", kind="mergesort").to_csv(files["ranks_csv"], index=False)
    if len(result.objectives) >= 2:
        x, y = result.objectives[0], result.objectives[1]
        files["png"] = plot_pareto_2d(
            result.table, x, y, by=by, path=out / f"{stem}_pareto.png", title=title
        )
        files["html"] = write_pareto_html(
            result.table, x, y, out / f"{stem}_pareto.html", by=by, title=title
        )
    return files
