"""Round-by-round curves of chosen runs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.rounds import plot_rounds

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def history() -> pd.DataFrame:
    rows = [("a", "accuracy", r, 0.3 + 0.1 * r) for r in (1, 2, 3)]
    rows += [("b", "accuracy", r, 0.2 + 0.1 * r) for r in (1, 2, 3)]
    rows += [("a", "round_bytes_up", r, 3.7e6) for r in (1, 2, 3)]
    rows += [("a", "epsilon", r, math.inf) for r in (1, 2, 3)]  # non-DP: nothing to draw
    return pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])


def test_one_panel_per_metric(tmp_path: Path) -> None:
    from PIL import Image

    one = plot_rounds(history(), ["accuracy"], tmp_path / "one.png")
    four = plot_rounds(
        history(),
        ["accuracy", "round_bytes_up", "epsilon", "never_logged"],
        tmp_path / "sub" / "four.png",
        labels={"a": "fedavg a", "b": "hyperfl b"},
        title="curves",
    )

    for path in (one, four):
        assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(one) as a, Image.open(four) as b:
        assert b.size[0] > 2 * a.size[0] and b.size[1] > a.size[1]  # 3 columns, 2 rows


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lacks column"):
        plot_rounds(history().drop(columns="step"), ["accuracy"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="at least one metric"):
        plot_rounds(history(), [], tmp_path / "x.png")


def test_long_labels_keep_the_legend_inside_the_figure(tmp_path: Path) -> None:
    from PIL import Image

    names = [f"centaur-paper-protocol-{i}-clients (3 seeds)" for i in range(6)]
    rows = [(n, "accuracy", r, 0.1 * i + 0.01 * r) for i, n in enumerate(names) for r in (1, 2)]
    rows += [(n, "epsilon", r, 1.0 + i) for i, n in enumerate(names) for r in (1, 2)]
    path = plot_rounds(
        pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"]),
        ["accuracy", "epsilon"],
        tmp_path / "long.png",
        labels={n: n for n in names},
    )
    with Image.open(path) as image:
        grey = image.convert("L")
        width, height = grey.size
        edges = [grey.getpixel((x, y)) for x in (0, 1, width - 2, width - 1) for y in range(height)]
    assert min(edges) > 200, "something is drawn at the figure's left or right edge"


def test_plot_against_draws_a_metric_against_communication(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    from analysis.rounds import plot_against

    # two runs: a walk (1 unit a step) and its basic variant (3 units a step); a third run
    # never logged comm_units and is left out
    rows = []
    for run, unit in (("walk", 1.0), ("basic", 3.0)):
        for step in (1, 2, 3):
            rows += [
                (run, "comm_units", step, unit * step),
                (run, "accuracy", step, 0.5 + step / 10),
            ]
    rows += [("fl", "accuracy", 1, 0.7)]
    history = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
    out = plot_against(history, "comm_units", ["accuracy"], tmp_path / "c.png")
    assert Image.open(out).size[0] > 300
    with pytest.raises(ValueError, match="no run logged"):
        plot_against(
            history[history["metric"] != "comm_units"],
            "comm_units",
            ["accuracy"],
            tmp_path / "d.png",
        )
