"""The plotly front: traces per group, infinities in a labelled band, run ids on hover,
a self-contained HTML file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.interactive import figure_html, pareto_figure, write_pareto_html
from analysis.pareto import Objective

pytest.importorskip("plotly")

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")


def table() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d", "e"],
            "algorithm": ["dp", "dp", "dp", "plain", "plain"],
            "epsilon": [1.0, 4.0, 8.0, math.inf, math.inf],
            "accuracy": [0.6, 0.75, 0.7, 0.85, 0.8],
        }
    )


def test_front_and_dominated_points_per_group() -> None:
    fig = pareto_figure(table(), EPS, ACC)

    traces = {t.name: t for t in fig.data}
    assert set(traces) == {
        "dp (n=3)",
        "dp: dominated",
        "plain (n=2)",
        "plain: dominated",
        "front of all",
    }
    assert list(traces["dp (n=3)"].customdata[:, 0]) == ["a", "b"]  # c is dominated by b
    assert list(traces["dp: dominated"].customdata[:, 0]) == ["c"]
    assert traces["dp: dominated"].marker.opacity == 0.25
    assert traces["dp (n=3)"].line.shape == "hv"  # x = epsilon, smaller is better: post steps


def test_infinity_sits_in_a_labelled_band_and_hover_says_inf() -> None:
    fig = pareto_figure(table(), EPS, ACC)

    plain = next(t for t in fig.data if t.name == "plain (n=2)")
    xaxis = fig.layout.xaxis
    assert np.isfinite(plain.x).all() and plain.x[0] > 8.0  # drawn past the finite range
    assert "ε = ∞ (no DP)" in xaxis.ticktext
    assert xaxis.tickvals[list(xaxis.ticktext).index("ε = ∞ (no DP)")] == plain.x[0]
    assert plain.customdata[0, 1] == "inf"
    assert len(fig.layout.shapes) == 1  # the shaded band of the x axis


def test_rows_with_nan_are_left_out_and_missing_columns_named() -> None:
    df = table()
    df.loc[0, "accuracy"] = np.nan

    fig = pareto_figure(df, EPS, ACC, by=None)

    assert sum(len(t.x) for t in fig.data) == 4
    with pytest.raises(ValueError, match="method"):
        pareto_figure(df, EPS, ACC, by="method")


def test_html_is_self_contained(tmp_path: Path) -> None:
    out = write_pareto_html(table(), EPS, ACC, tmp_path / "f" / "front.html")
    div = figure_html(pareto_figure(table(), EPS, ACC), include_plotlyjs=False)

    text = out.read_text()
    assert "<html>" in text[:100] and "Plotly.newPlot" in text
    assert len(text) > 1_000_000  # plotly.js inlined, not fetched
    assert 'src="http' not in text
    assert div.startswith("<div") and "Plotly.newPlot" in div and len(div) < 100_000
