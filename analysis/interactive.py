"""The 2-D Pareto front as an interactive plotly figure (hover shows each run's id and values).

The same picture as :func:`analysis.plots.plot_pareto_2d`: one colour per group, each group's
front solid and joined by a staircase, its dominated points faint, the front over all groups
dashed; infinite values (a non-DP epsilon) sit in a shaded band past the finite range with an
``∞`` tick; a figure whose epsilon axis mixes neighbouring relations carries the note of
:func:`analysis.guarantees.relation_note` under the plot. Hover shows each run's
``dp_guarantee`` when the table has it. Plotly is imported lazily; :func:`figure_html` embeds
plotly.js so the page works offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.guarantees import relation_note
from analysis.pareto import Objective
from analysis.plots import _INF_GAP, _AxisMap, _front_order, _inf_text, axis_label

__all__ = ["figure_html", "pareto_figure", "write_pareto_html"]

# matplotlib's tab10, so the PNG and the interactive figure colour groups alike
_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_SYMBOLS = ("circle", "square", "triangle-up", "diamond", "triangle-down", "cross", "x")


def _go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("interactive plots need plotly: pip install plotly") from err
    return go


def _text(value: float) -> str:
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.6g}"


def _axis(amap: _AxisMap, objective: Objective) -> dict[str, Any]:
    """Plotly axis settings: range, title, and the ∞ ticks when the values hold infinities."""
    low, high = amap.limits()
    axis: dict[str, Any] = {"title": {"text": axis_label(objective, "y")}, "range": [low, high]}
    if amap.pos_inf or amap.neg_inf:
        from matplotlib.ticker import MaxNLocator

        ticks = [
            float(t)
            for t in MaxNLocator(nbins=6).tick_values(amap.lo, amap.hi)
            if amap.finite and amap.lo <= t <= amap.hi
        ]
        labels = [f"{t:g}" for t in ticks]
        if amap.pos_inf:
            ticks.append(amap.pos_at)
            labels.append(_inf_text(objective.name, ""))
        if amap.neg_inf:
            ticks.append(amap.neg_at)
            labels.append(_inf_text(objective.name, "−"))
        axis |= {"tickmode": "array", "tickvals": ticks, "ticktext": labels}
    return axis


def _bands(amap: _AxisMap, axis: str) -> list[dict[str, Any]]:
    """Shaded rectangles for the infinite bands of one axis (plotly layout shapes)."""
    low, high = amap.limits()
    gap = _INF_GAP * amap.span
    spans = [(amap.hi + gap, high)] if amap.pos_inf else []
    spans += [(low, amap.lo - gap)] if amap.neg_inf else []
    style = {"type": "rect", "layer": "below", "line": {"width": 0}}
    style["fillcolor"] = "rgba(0,0,0,0.07)"
    if axis == "x":
        return [
            style | {"xref": "x", "x0": a, "x1": b, "yref": "y domain", "y0": 0, "y1": 1}
            for a, b in spans
        ]
    return [
        style | {"yref": "y", "y0": a, "y1": b, "xref": "x domain", "x0": 0, "x1": 1}
        for a, b in spans
    ]


def pareto_figure(
    table: pd.DataFrame,
    x: Objective,
    y: Objective,
    *,
    by: str | None = "algorithm",
    title: str | None = None,
) -> Any:
    """A plotly ``Figure`` of ``y`` against ``x``, fronts highlighted, one trace pair per group.

    Args:
        table: one row per run or configuration (e.g. ``ParetoResult.table``); a ``run_id``
            column, when present, is shown on hover.
        x, y: the objectives on the axes.
        by: the group column, or None.
        title: the figure title.

    Raises:
        ValueError: a named column is not in ``table``.
    """
    go = _go()
    columns = [x.name, y.name] + ([by] if by is not None else [])
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"column(s) not in the table: {', '.join(missing)}")
    data = table.copy()
    data[x.name] = data[x.name].astype(float)
    data[y.name] = data[y.name].astype(float)
    data = data.loc[data[[x.name, y.name]].notna().all(axis=1).to_numpy()]
    note = relation_note(data, [x.name, y.name])
    xs, ys = data[x.name].to_numpy(), data[y.name].to_numpy()
    xmap, ymap = _AxisMap.of(xs), _AxisMap.of(ys)
    px, py = xmap(xs), ymap(ys)
    ids = data["run_id"].astype(str).to_numpy() if "run_id" in data else np.full(len(data), "")
    guarantee = (
        data["dp_guarantee"].fillna("–").astype(str).to_numpy()
        if "dp_guarantee" in data
        else np.full(len(data), "–")
    )
    hover = np.column_stack([ids, [_text(v) for v in xs], [_text(v) for v in ys], guarantee])
    template = (
        f"run %{{customdata[0]}}<br>{x.name} = %{{customdata[1]}}<br>"
        f"{y.name} = %{{customdata[2]}}<br>dp_guarantee = %{{customdata[3]}}"
        "<extra>%{fullData.name}</extra>"
    )
    groups = (
        {str(k): v for k, v in data.groupby(by, dropna=False, sort=True).indices.items()}
        if by is not None
        else {"all runs": np.arange(len(data))}
    )
    fig = go.Figure()
    for i, (name, positions) in enumerate(groups.items()):
        colour, symbol = _COLOURS[i % len(_COLOURS)], _SYMBOLS[i % len(_SYMBOLS)]
        order, where = _front_order(xs[positions], ys[positions], x, y)
        front = positions[order]
        rest = np.setdiff1d(positions, front)
        shape = "hv" if where == "post" else "vh"
        fig.add_trace(
            go.Scatter(
                x=px[front],
                y=py[front],
                customdata=hover[front],
                mode="lines+markers",
                line={"shape": shape, "color": colour, "width": 2},
                marker={"color": colour, "symbol": symbol, "size": 9},
                name=f"{name} (n={len(positions)})",
                legendgroup=name,
                hovertemplate=template,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=px[rest],
                y=py[rest],
                customdata=hover[rest],
                mode="markers",
                marker={"color": colour, "symbol": symbol, "size": 7, "opacity": 0.25},
                name=f"{name}: dominated",
                legendgroup=name,
                showlegend=False,
                hovertemplate=template,
            )
        )
    if len(groups) > 1 and len(data):
        order, where = _front_order(xs, ys, x, y)
        fig.add_trace(
            go.Scatter(
                x=px[order],
                y=py[order],
                mode="lines",
                line={"shape": "hv" if where == "post" else "vh", "color": "black", "dash": "dash"},
                name="front of all",
                hoverinfo="skip",
            )
        )
    xaxis, yaxis = _axis(xmap, x), _axis(ymap, y)
    xaxis["title"]["text"] = axis_label(x, "x")
    fig.update_layout(
        title={"text": title or f"Pareto front: {y.name} vs {x.name} (hover for run ids)"},
        xaxis=xaxis,
        yaxis=yaxis,
        shapes=_bands(xmap, "x") + _bands(ymap, "y"),
        template="plotly_white",
        legend={"title": {"text": by or ""}},
        margin={"l": 60, "r": 20, "t": 50, "b": 110 if note else 50},
        height=480,
    )
    if note:
        fig.add_annotation(
            text="note: " + note,
            xref="paper",
            yref="paper",
            x=0,
            y=-0.2,
            xanchor="left",
            yanchor="top",
            showarrow=False,
            align="left",
            width=900,
            font={"size": 11, "color": "#8a4b00"},
        )
    return fig


def figure_html(fig: Any, *, include_plotlyjs: bool | str = True, div_id: str | None = None) -> str:
    """A ``<div>`` (plus, by default, plotly.js inline) to place in a page: with
    ``include_plotlyjs=True`` the page needs no network."""
    return str(
        fig.to_html(
            full_html=False,
            include_plotlyjs=include_plotlyjs,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
    )


def write_pareto_html(
    table: pd.DataFrame,
    x: Objective,
    y: Objective,
    path: str | Path,
    *,
    by: str | None = "algorithm",
    title: str | None = None,
) -> Path:
    """Write :func:`pareto_figure` as a self-contained HTML file (plotly.js inline)."""
    fig = pareto_figure(table, x, y, by=by, title=title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(out, include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    return out
