"""Fronts default to the sweep's own objectives (issue 23 §5.4): the pure decision."""

from __future__ import annotations

import pytest

from analysis.fronts import ObjectiveError
from analysis.sweep_objectives import SweepObjectives, choose_objectives, objectives_text


def test_runs_from_no_sweep_keep_the_old_default() -> None:
    objectives, source = choose_objectives([])

    assert objectives_text(objectives) == "accuracy:max,epsilon:min"
    assert source.startswith("default")


def test_one_sweep_gives_its_objectives_in_its_order() -> None:
    sweep = SweepObjectives("s", "p1", "leak_psnr_gain_worst_round:min,accuracy:max")

    objectives, source = choose_objectives([sweep])

    assert objectives_text(objectives) == "leak_psnr_gain_worst_round:min,accuracy:max"
    assert "sweep s" in source and "p1" in source


def test_sweeps_with_the_same_objectives_share_them() -> None:
    a = SweepObjectives("b-sweep", "p2", "epsilon:min,accuracy:max")
    b = SweepObjectives("a-sweep", "p1", "accuracy:max,epsilon:min")
    old = SweepObjectives("old", "p0", None)  # a parent that records none: not counted

    objectives, source = choose_objectives([a, b, old])

    assert objectives_text(objectives) == "accuracy:max,epsilon:min"  # a-sweep's order
    assert "sweeps a-sweep, b-sweep" in source


def test_sweeps_with_different_objectives_ask_for_them() -> None:
    a = SweepObjectives("a", "p1", "accuracy:max,epsilon:min")
    b = SweepObjectives("b", "p2", "accuracy:max,leak_psnr:min")

    with pytest.raises(ObjectiveError, match="different objectives.*--objectives") as err:
        choose_objectives([a, b])
    assert "a (accuracy:max,epsilon:min)" in str(err.value)
    assert "b (accuracy:max,leak_psnr:min)" in str(err.value)


def test_an_unreadable_record_is_named() -> None:
    with pytest.raises(ObjectiveError, match="sweep 'a'.*'accuracy'"):
        choose_objectives([SweepObjectives("a", "p1", "accuracy")])
