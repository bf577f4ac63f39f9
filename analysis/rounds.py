"""Round-by-round curves of chosen runs (accuracy, bytes per round, ...) as a PNG.

Input is the long table of :func:`analysis.load.load_histories` (``run_id``, ``metric``,
``step``, ``value``): one panel per metric, one line per run (:func:`plot_rounds`), or a metric
against another logged at the same rounds (:func:`plot_against`: LoDMeta's accuracy against
communication, its Figures 1-4). Matplotlib's object API only, as in :mod:`analysis.plots`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.plots import _MARKERS, _figure_class

__all__ = ["plot_against", "plot_rounds"]

_COLUMNS = ("run_id", "metric", "step", "value")
_CHARS_PER_PANEL = 46  # legend characters (10 pt, marker and gaps included) across one panel


def _legend_columns(names: Sequence[str], panels: int) -> int:
    """At most 4 legend columns, fewer where the longest name would push the legend past the
    figure's edges (the figure is ``panels`` panels wide)."""
    per_entry = max(len(n) for n in names) + 6  # the marker, its line and the gap after
    return max(1, min(4, len(names), panels * _CHARS_PER_PANEL // per_entry))


def _finish(fig, axes, used: int, ncols: int, title: str | None, path: str | Path) -> Path:  # type: ignore[no-untyped-def]
    """Hide the unused panels, one legend of every run below them, the title; save as PNG."""
    for ax in axes[used:]:
        ax.set_visible(False)
    handles, names = [], []
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            if name not in names:
                handles.append(handle)
                names.append(name)
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncols=_legend_columns(names, ncols))
    if title:
        fig.suptitle(title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, format="png")
    return out


def plot_rounds(
    history: pd.DataFrame,
    metrics: Sequence[str],
    path: str | Path,
    *,
    labels: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Path:
    """One panel per metric, one line per run, the round on the x axis.

    Args:
        history: long table with columns ``run_id``, ``metric``, ``step``, ``value``.
        metrics: the metrics to draw, one panel each, in this order.
        path: where the PNG goes; parent folders are created.
        labels: a legend label per run id (default: the first 8 characters of the id).
        title: the figure title.

    Infinite and missing values are not drawn (a panel says how many were left out).

    Raises:
        ValueError: ``history`` lacks a column, or no metric is given.
    """
    missing = [c for c in _COLUMNS if c not in history.columns]
    if missing:
        raise ValueError(f"history lacks column(s) {', '.join(missing)}")
    if not metrics:
        raise ValueError("name at least one metric to plot")
    from matplotlib.ticker import MaxNLocator

    labels = dict(labels or {})
    runs = list(dict.fromkeys(history["run_id"]))
    steps = history["step"].to_numpy(dtype=float)
    first, last = (steps.min(), steps.max()) if len(steps) else (1.0, 1.0)
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = _figure_class()(figsize=(4.6 * ncols, 3.4 * nrows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, metric in zip(axes, metrics, strict=False):
        rows = history[history["metric"] == metric]
        hidden = 0
        for i, run_id in enumerate(runs):
            mine = rows[rows["run_id"] == run_id].sort_values("step")
            values = mine["value"].to_numpy(dtype=float)
            keep = np.isfinite(values)
            hidden += int((~keep).sum())
            if keep.any():
                ax.plot(
                    mine["step"].to_numpy()[keep],
                    values[keep],
                    marker=_MARKERS[i % len(_MARKERS)],
                    markersize=4,
                    color=f"C{i % 10}",
                    label=labels.get(run_id, str(run_id)[:8]),
                )
        note = f" ({hidden} non-finite not drawn)" if hidden else ""
        ax.set_title(metric + note, fontsize=10)
        ax.set_xlabel("round")
        ax.set_xlim(first - 0.3, last + 0.3)  # one round still gets a sensible axis
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, color="0.9", linewidth=0.6)
        if not len(rows):
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    return _finish(fig, axes, len(metrics), ncols, title, path)


def plot_against(
    history: pd.DataFrame,
    x: str,
    ys: Sequence[str],
    path: str | Path,
    *,
    labels: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Path:
    """One panel per metric in ``ys``, one line per run, metric ``x`` on the x axis: each point
    is a round at which the run logged both (LoDMeta's accuracy against its cumulative
    communication, ``comm_units``). Runs that never logged ``x`` are left out; non-finite
    values are not drawn.

    Raises:
        ValueError: ``history`` lacks a column, no ``ys`` are given, or no run logged ``x``.
    """
    missing = [c for c in _COLUMNS if c not in history.columns]
    if missing:
        raise ValueError(f"history lacks column(s) {', '.join(missing)}")
    if not ys:
        raise ValueError("name at least one metric to plot against " + x)
    wide = history.pivot_table(index=["run_id", "step"], columns="metric", values="value")
    if x not in wide.columns:
        raise ValueError(f"no run logged {x!r}")
    labels = dict(labels or {})
    runs = [r for r in dict.fromkeys(history["run_id"]) if wide.loc[r][x].notna().any()]
    ncols = min(3, len(ys))
    nrows = -(-len(ys) // ncols)
    fig = _figure_class()(figsize=(4.6 * ncols, 3.4 * nrows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, y in zip(axes, ys, strict=False):
        for i, run_id in enumerate(runs):
            if y not in wide.columns:
                continue
            mine = wide.loc[run_id][[x, y]].astype(float)
            mine = mine[np.isfinite(mine[x]) & np.isfinite(mine[y])].sort_values(x)
            if len(mine):
                ax.plot(
                    mine[x].to_numpy(),
                    mine[y].to_numpy(),
                    marker=_MARKERS[i % len(_MARKERS)],
                    markersize=4,
                    color=f"C{i % 10}",
                    label=labels.get(run_id, str(run_id)[:8]),
                )
        ax.set_title(f"{y} against {x}", fontsize=10)
        ax.set_xlabel(x)
        ax.grid(True, color="0.9", linewidth=0.6)
        if y not in wide.columns:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    return _finish(fig, axes, len(ys), ncols, title, path)
