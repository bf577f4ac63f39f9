"""The Pareto PNG: written, a real PNG, with infinities, groups, and odd tables."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.pareto import Objective
from analysis.plots import axis_label, plot_pareto_2d

pytest.importorskip("matplotlib")

ACC = Objective("accuracy", "max")
EPS = Objective("epsilon", "min")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep_table() -> pd.DataFrame:
    """Two DP algorithms over a few epsilons, and a non-DP algorithm at epsilon = inf."""
    rows = [("fedavg", math.inf, 0.82), ("fedavg", math.inf, 0.80)]
    for eps, acc in [(0.5, 0.55), (1.0, 0.61), (2.0, 0.66), (4.0, 0.64), (8.0, 0.72)]:
        rows += [("dp-fedavg", eps, acc), ("dp-fedprox", eps * 1.1, acc + 0.01)]
    rows.append(("dp-fedprox", np.nan, 0.7))  # never measured: not drawn
    return pd.DataFrame(rows, columns=["algorithm", "epsilon", "accuracy"])


def assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_writes_a_png_with_an_infinite_epsilon_and_several_algorithms(tmp_path: Path) -> None:
    out = plot_pareto_2d(sweep_table(), EPS, ACC, path=tmp_path / "figs" / "front.png")

    assert out == tmp_path / "figs" / "front.png"
    assert_png(out)


def test_png_size_via_pil(tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image")

    out = plot_pareto_2d(sweep_table(), EPS, ACC, path=tmp_path / "front.png", title="t")

    with image.open(out) as png:
        assert png.format == "PNG"
        assert png.size[0] > 400 and png.size[1] > 300


@pytest.mark.parametrize(
    ("x", "y", "by"),
    [
        (ACC, EPS, "algorithm"),  # infinity on the y axis
        (Objective("loss", "min"), ACC, None),  # one group, no infinity
        (Objective("loss", "min"), EPS, None),  # min/min with -inf loss
        (Objective("accuracy", "max"), Objective("loss", "max"), "algorithm"),
    ],
)
def test_other_axes_and_directions(
    tmp_path: Path, x: Objective, y: Objective, by: str | None
) -> None:
    table = sweep_table().assign(loss=lambda t: 1 - t["accuracy"])
    table.loc[0, "loss"] = -math.inf

    assert_png(plot_pareto_2d(table, x, y, by=by, path=tmp_path / "p.png"))


def test_only_infinite_values_and_an_empty_table_still_plot(tmp_path: Path) -> None:
    table = sweep_table()

    assert_png(plot_pareto_2d(table.iloc[:2], EPS, ACC, path=tmp_path / "inf.png"))
    assert_png(plot_pareto_2d(table.iloc[:0], EPS, ACC, path=tmp_path / "empty.png"))


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="method"):
        plot_pareto_2d(sweep_table(), EPS, ACC, by="method", path=tmp_path / "x.png")


def test_axis_labels_say_which_way_is_better() -> None:
    assert axis_label(ACC, "y") == "accuracy (↑ better)"
    assert axis_label(EPS, "y") == "epsilon (↓ better)"
    assert axis_label(EPS, "x") == "epsilon (← better)"
    assert axis_label(ACC, "x") == "accuracy (→ better)"


def test_embedding_plot_separates_groups_and_rejects_bad_shapes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import pytest

    from analysis.plots import plot_embeddings

    rng = np.random.default_rng(0)
    emb = np.concatenate([rng.normal(0, 0.1, (5, 16)), rng.normal(3, 0.1, (5, 16))])
    png = plot_embeddings(emb, tmp_path / "e.png", labels=["a"] * 5 + ["b"] * 5)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one = plot_embeddings(np.ones((3, 4)), tmp_path / "same.png")  # identical rows: no crash
    assert one.stat().st_size > 1000
    with pytest.raises(ValueError, match="2-D"):
        plot_embeddings(np.ones(4), tmp_path / "x.png")
