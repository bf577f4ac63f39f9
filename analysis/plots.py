"""Static plots of sweep results: the 2-D privacy/utility Pareto front as a PNG.

Matplotlib is imported lazily (it is optional) and used through its object API
(:class:`matplotlib.figure.Figure`, no ``pyplot``): nothing selects a backend or touches global
state, so plotting works headless and never changes a notebook's backend.

Infinite values (a non-DP run has ``epsilon = +inf``) are drawn, not dropped: the axis gets a
shaded band past its finite range, separated by a dashed "axis break" line, and the infinite
points sit in the middle of that band, whose tick reads ``ε = ∞ (no DP)`` for an epsilon axis
and ``∞`` otherwise (``-inf`` gets the same treatment on the other side). A run without a formal
DP guarantee (``dp_guarantee`` ``shared-only`` or ``none``) has ``epsilon = inf`` in the tables
:func:`analysis.pareto.pareto_front` returns, so it is drawn in that band.

A plot whose epsilon axis mixes neighbouring relations (``dp_relation``) says so under the axes
and in the PNG's ``Description`` text chunk (:func:`analysis.guarantees.relation_note`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.guarantees import relation_note
from analysis.pareto import Objective, non_dominated_mask

__all__ = ["axis_label", "plot_embeddings", "plot_pareto_2d"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
_INF_GAP = 0.08  # the break line sits this fraction of the finite span past the finite range
_INF_AT = 0.16  # infinite points sit this fraction of the finite span past the finite range
_MARGIN = 0.05


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plotting needs matplotlib, which is not installed: pip install matplotlib"
        ) from err
    return Figure


def axis_label(objective: Objective, axis: str) -> str:
    """``"accuracy (↑ better)"``; on the x axis the arrow points left or right."""
    if axis == "x":
        arrow = "→" if objective.direction == "max" else "←"
    else:
        arrow = "↑" if objective.direction == "max" else "↓"
    return f"{objective.name} ({arrow} better)"


def _inf_text(name: str, sign: str) -> str:
    """The tick label of an infinite band: a non-DP epsilon says so."""
    lowered = name.lower().split(".")[-1]
    if "epsilon" in lowered or lowered in {"eps", "ε"}:
        return "ε = ∞ (no DP)" if sign == "" else f"ε = {sign}∞"
    return f"{sign}∞"


@dataclass(frozen=True)
class _AxisMap:
    """Where each value of one axis is drawn: finite values as they are, ±inf in a side band."""

    lo: float
    hi: float
    span: float
    pos_inf: bool
    neg_inf: bool
    finite: bool

    @classmethod
    def of(cls, values: np.ndarray) -> _AxisMap:
        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        span = hi - lo if hi > lo else max(abs(hi), 1.0)
        pos_inf, neg_inf = bool(np.any(values == np.inf)), bool(np.any(values == -np.inf))
        return cls(lo, hi, span, pos_inf, neg_inf, bool(finite.size))

    @property
    def pos_at(self) -> float:
        return self.hi + _INF_AT * self.span

    @property
    def neg_at(self) -> float:
        return self.lo - _INF_AT * self.span

    def __call__(self, values: np.ndarray) -> np.ndarray:
        out = np.where(values == np.inf, self.pos_at, values)
        return np.where(values == -np.inf, self.neg_at, out)

    def limits(self) -> tuple[float, float]:
        low = (self.neg_at if self.neg_inf else self.lo) - _MARGIN * self.span
        high = (self.pos_at if self.pos_inf else self.hi) + _MARGIN * self.span
        return low, high

    def decorate(self, ax: Any, axis: str, name: str) -> None:
        """Shade the infinite bands, draw the break lines, and label the ∞ ticks."""
        if not (self.pos_inf or self.neg_inf):
            return
        from matplotlib.ticker import MaxNLocator

        low, high = self.limits()
        gap = _INF_GAP * self.span
        # Finite ticks only inside the finite range: no axis of made-up numbers when all are inf.
        ticks = [
            float(t)
            for t in MaxNLocator(nbins=6).tick_values(self.lo, self.hi)
            if self.finite and self.lo - gap < t < self.hi + gap
        ]
        labels = [f"{t:g}" for t in ticks]
        span_fn = ax.axvspan if axis == "x" else ax.axhspan
        line_fn = ax.axvline if axis == "x" else ax.axhline
        sides = [
            (self.pos_inf, self.hi + gap, high, self.pos_at, ""),
            (self.neg_inf, low, self.lo - gap, self.neg_at, "−"),
        ]
        for present, start, end, at, sign in sides:
            if not present:
                continue
            span_fn(start, end, color="0.93", zorder=0)
            line_fn(start if sign == "" else end, color="0.55", linestyle="--", linewidth=0.8)
            ticks.append(at)
            text = _inf_text(name, sign)
            # Under the x axis a long label would collide with its neighbours: wrap it.
            labels.append(text.replace(" (", "\n(") if axis == "x" else text)
        if axis == "x":
            ax.set_xticks(ticks, labels=labels)
        else:
            ax.set_yticks(ticks, labels=labels)


def _front_order(
    xs: np.ndarray, ys: np.ndarray, x: Objective, y: Objective
) -> tuple[np.ndarray, str]:
    """Indices of the 2-D front sorted by x ascending, and the step style of its staircase."""
    mask = non_dominated_mask(np.column_stack([xs, ys]), [x.direction, y.direction])
    idx = np.flatnonzero(mask)
    y_key = -ys[idx] if y.direction == "max" else ys[idx]
    idx = idx[np.lexsort((y_key, xs[idx]))]
    # The staircase passes through the worse corners: after each point when smaller x is better.
    return idx, "post" if x.direction == "min" else "pre"


def plot_pareto_2d(
    table: pd.DataFrame,
    x: Objective,
    y: Objective,
    *,
    by: str | None = "algorithm",
    path: str | Path,
    title: str | None = None,
) -> Path:
    """Scatter ``y`` against ``x``, one colour and marker per ``by`` group, fronts highlighted.

    Each group's own 2-D front (recomputed on ``x`` and ``y``, so the picture is right even when
    ``table`` was ranked on more objectives) is drawn solid and joined by a staircase in front
    order; its dominated points are faint. With several groups the front over all of them is a
    dashed black staircase. Rows with NaN in ``x`` or ``y`` are not drawn; infinities are (see
    the module docstring).

    Args:
        table: one row per run or configuration, e.g. ``ParetoResult.table``.
        x, y: the objectives on the horizontal and vertical axes.
        by: the column that names the groups, or None for a single group.
        path: where the PNG goes; parent folders are created.
        title: the figure title; a default names the objectives.

    Returns:
        The path of the PNG.

    Raises:
        ValueError: a named column is not in ``table``.
        ImportError: matplotlib is not installed.
    """
    columns = [x.name, y.name] + ([by] if by is not None else [])
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"column(s) not in the table: {', '.join(missing)}")
    data = table[columns].copy()
    data[x.name] = data[x.name].astype(float)
    data[y.name] = data[y.name].astype(float)
    n_hidden = int(data[[x.name, y.name]].isna().any(axis=1).sum())
    drawn = data[[x.name, y.name]].notna().all(axis=1).to_numpy()
    data = data.loc[drawn]
    note = relation_note(table.loc[drawn], [x.name, y.name])
    groups = (
        {str(k): v for k, v in data.groupby(by, dropna=False, sort=True).indices.items()}
        if by is not None
        else {"all runs": np.arange(len(data))}
    )
    xs, ys = data[x.name].to_numpy(), data[y.name].to_numpy()
    xmap, ymap = _AxisMap.of(xs), _AxisMap.of(ys)
    px, py = xmap(xs), ymap(ys)

    fig = _figure_class()(figsize=(8, 5.2), layout="constrained")
    ax = fig.add_subplot()
    for i, (name, positions) in enumerate(groups.items()):
        colour, marker = f"C{i % 10}", _MARKERS[i % len(_MARKERS)]
        order, where = _front_order(xs[positions], ys[positions], x, y)
        front = positions[order]
        rest = np.setdiff1d(positions, front)
        ax.scatter(px[rest], py[rest], color=colour, marker=marker, alpha=0.25, s=30, lw=0)
        ax.step(px[front], py[front], where=where, color=colour, lw=1.6, alpha=0.9, zorder=2)
        ax.scatter(
            px[front],
            py[front],
            color=colour,
            marker=marker,
            s=48,
            edgecolor="white",
            linewidth=0.7,
            zorder=3,
            label=f"{name} (n={len(positions)})",
        )
    if len(groups) > 1 and len(data):
        order, where = _front_order(xs, ys, x, y)
        ax.step(
            px[order],
            py[order],
            where=where,
            color="black",
            lw=1.0,
            ls="--",
            zorder=2.5,  # under the markers, over the group staircases
            label="front of all",
        )
    if len(data):
        # A legend entry for the faint points: their colour is the group's, only lighter.
        ax.scatter([], [], color="0.3", alpha=0.25, s=30, lw=0, label="dominated (faint)")
    else:
        ax.text(0.5, 0.5, "no runs with both values", ha="center", transform=ax.transAxes)

    ax.set_xlim(*xmap.limits())
    ax.set_ylim(*ymap.limits())
    xmap.decorate(ax, "x", x.name)
    ymap.decorate(ax, "y", y.name)
    ax.set_xlabel(axis_label(x, "x"))
    ax.set_ylabel(axis_label(y, "y"))
    ax.grid(True, color="0.9", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    default = f"Pareto front: {y.name} vs {x.name}"
    if n_hidden:
        default += f" ({n_hidden} row{'s' if n_hidden > 1 else ''} with a missing value not drawn)"
    ax.set_title(title if title is not None else default)
    if len(data):
        ax.legend(title=by, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if note:
        import textwrap

        fig.supxlabel("note: " + textwrap.fill(note, 120), fontsize=7.5, color="#8a4b00")

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150, format="png", metadata={"Description": note} if note else None)
    return out


def plot_embeddings(
    embeddings: np.ndarray,
    path: str | Path,
    *,
    labels: list[str] | None = None,
    title: str = "client embeddings (first two principal components)",
) -> Path:
    """Scatter the rows of ``embeddings`` on their first two principal components (HyperFL's
    Figure 8), coloured by ``labels`` (for example each client's dominant-class group) and
    annotated with the client id. Returns the PNG path."""
    emb = np.asarray(embeddings, dtype=np.float64)
    if emb.ndim != 2 or len(emb) < 1:
        raise ValueError(f"embeddings must be a non-empty 2-D array, got shape {emb.shape}")
    centred = emb - emb.mean(axis=0)
    if len(emb) > 1 and np.abs(centred).max() > 0:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[: min(2, vt.shape[0])].T
    else:
        xy = np.zeros((len(emb), 2))
    if xy.shape[1] == 1:
        xy = np.column_stack([xy[:, 0], np.zeros(len(xy))])
    labels = labels or ["clients"] * len(emb)
    fig = _figure_class()(figsize=(5.5, 4.5))
    ax = fig.subplots()
    for i, name in enumerate(dict.fromkeys(labels)):
        idx = [j for j, lab in enumerate(labels) if lab == name]
        ax.scatter(xy[idx, 0], xy[idx, 1], label=name, marker=_MARKERS[i % len(_MARKERS)])
    for j, (x, y) in enumerate(xy):
        ax.annotate(str(j), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.set_title(title, fontsize=10)
    if len(set(labels)) > 1:
        ax.legend(fontsize=8)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


def plot_attack_grid(
    originals: np.ndarray,
    reconstructions: np.ndarray,
    path: str | Path,
    *,
    title: str = "originals (top) and reconstructions (bottom)",
    captions: list[str] | None = None,
) -> Path:
    """The attack image grid: originals above their reconstructions, one column per record.

    Args:
        originals, reconstructions: ``[n, C, H, W]`` arrays in ``[0, 1]`` (C = 1 or 3).
        captions: one line under each reconstruction (e.g. its PSNR).
    Returns the PNG path.
    """
    orig = np.asarray(originals, dtype=np.float32)
    rec = np.asarray(reconstructions, dtype=np.float32)
    if orig.shape != rec.shape or orig.ndim != 4 or len(orig) == 0:
        raise ValueError(
            f"need two [n, C, H, W] arrays of one shape, got {orig.shape} and {rec.shape}"
        )
    n = len(orig)
    fig = _figure_class()(figsize=(1.2 * n + 0.4, 2.9))
    axes = np.asarray(fig.subplots(2, n, squeeze=False))
    for row, imgs in enumerate((orig, rec)):
        for j in range(n):
            ax = axes[row, j]
            img = np.clip(imgs[j].transpose(1, 2, 0), 0, 1)
            if img.shape[-1] == 1:
                ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
            else:
                ax.imshow(img)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 1 and captions:
                ax.set_xlabel(captions[j], fontsize=7)
    axes[0, 0].set_ylabel("original", fontsize=8)
    axes[1, 0].set_ylabel("attack", fontsize=8)
    fig.suptitle(title, fontsize=9)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out
