"""Laws of the Pareto functions, checked against brute force on small random point sets."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.pareto import hypervolume, non_dominated_mask, pareto_ranks
from tests.unit.analysis._brute import brute_hypervolume, brute_mask, brute_ranks

SPECIAL = st.sampled_from([math.inf, -math.inf, math.nan])
VALUE = st.one_of(st.integers(0, 4).map(float), SPECIAL)
DIRECTION = st.sampled_from(["max", "min"])


@st.composite
def point_sets(draw: st.DrawFn, value: st.SearchStrategy[float] = VALUE, max_k: int = 3):
    """(rows, directions): up to 12 rows of 2-3 objectives, small values so duplicates occur."""
    k = draw(st.integers(2, max_k))
    rows = draw(st.lists(st.lists(value, min_size=k, max_size=k), max_size=12))
    directions = draw(st.lists(DIRECTION, min_size=k, max_size=k))
    return rows, directions


@settings(max_examples=150, deadline=None)
@given(point_sets())
def test_mask_equals_brute_force(case: tuple[list[list[float]], list[str]]) -> None:
    rows, directions = case
    values = np.array(rows, dtype=float).reshape(len(rows), len(directions))
    assert non_dominated_mask(values, directions).tolist() == brute_mask(rows, directions)


@settings(max_examples=100, deadline=None)
@given(point_sets())
def test_ranks_equal_brute_force_peeling(case: tuple[list[list[float]], list[str]]) -> None:
    rows, directions = case
    values = np.array(rows, dtype=float).reshape(len(rows), len(directions))
    assert pareto_ranks(values, directions).tolist() == brute_ranks(rows, directions)


INTS_AND_SPECIAL = st.one_of(st.integers(0, 6).map(float), SPECIAL)


@settings(max_examples=100, deadline=None)
@given(
    point_sets(value=INTS_AND_SPECIAL),
    st.lists(st.integers(0, 6), min_size=3, max_size=3),
)
def test_hypervolume_equals_grid_count(
    case: tuple[list[list[float]], list[str]], reference: list[int]
) -> None:
    rows, directions = case
    reference = reference[: len(directions)]
    values = np.array(rows, dtype=float).reshape(len(rows), len(directions))
    expected = brute_hypervolume(rows, directions, reference)
    assert hypervolume(values, directions, reference) == expected


@settings(max_examples=100, deadline=None)
@given(
    point_sets(value=INTS_AND_SPECIAL),
    st.lists(INTS_AND_SPECIAL, min_size=3, max_size=3),
    st.lists(st.integers(0, 6), min_size=3, max_size=3),
)
def test_adding_a_point_never_decreases_hypervolume(
    case: tuple[list[list[float]], list[str]], extra: list[float], reference: list[int]
) -> None:
    rows, directions = case
    k = len(directions)
    values = np.array(rows, dtype=float).reshape(len(rows), k)
    more = np.vstack([values, np.array(extra[:k], dtype=float)])
    before = hypervolume(values, directions, reference[:k])
    assert hypervolume(more, directions, reference[:k]) >= before - 1e-9
