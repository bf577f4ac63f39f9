"""Pareto fronts of small sweep tables: non-DP runs, failed runs, groups, seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.pareto import (
    Objective,
    hypervolume,
    non_dominated_mask,
    pareto_front,
    pareto_ranks,
    parse_objectives,
)
from tests.unit.analysis._brute import brute_hypervolume

ACC_EPS = [Objective("accuracy", "max"), Objective("epsilon", "min")]
INF = math.inf


def runs(*rows: tuple[str, float, float, str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["algorithm", "epsilon", "accuracy", "status"])


# parse_objectives


@pytest.mark.parametrize(
    "spec",
    [
        "accuracy:max,epsilon:min",
        " accuracy : MAX , epsilon:min ",
        {"accuracy": "max", "epsilon": "min"},
        ["accuracy:max", {"epsilon": "min"}],
        [("accuracy", "max"), Objective("epsilon", "min")],
    ],
)
def test_parse_objectives_accepts_each_form(spec: object) -> None:
    assert parse_objectives(spec) == ACC_EPS  # type: ignore[arg-type]


def test_parse_objectives_keeps_colons_in_names() -> None:
    assert parse_objectives("metrics.test:acc:max") == [Objective("metrics.test:acc", "max")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("accuracy:maximise", "'maximise'"),
        ("accuracy", "'accuracy' has no direction"),
        (":max", "no name"),
        ("accuracy:max,,epsilon:min", "empty objective"),
        ({"epsilon": "up"}, "'epsilon': direction must be 'max' or 'min'"),
        ("accuracy:max,accuracy:min", "given twice: accuracy"),
        ([], "no objectives"),
        ([42], "cannot read an objective from 42"),
    ],
)
def test_parse_objectives_names_the_bad_part(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_objectives(spec)  # type: ignore[arg-type]


def test_objective_rejects_a_bad_direction() -> None:
    with pytest.raises(ValueError, match="direction must be"):
        Objective("accuracy", "up")  # type: ignore[arg-type]


# array functions


def test_identical_points_are_all_kept_and_inf_is_worst_for_min() -> None:
    values = np.array([[0.8, 1.0], [0.8, 1.0], [0.8, INF], [0.9, INF], [np.nan, 0.5]])

    mask = non_dominated_mask(values, ["max", "min"])
    ranks = pareto_ranks(values, ["max", "min"])

    assert mask.tolist() == [True, True, False, True, False]
    assert ranks.tolist() == [0, 0, 1, 0, -1]


def test_array_functions_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match="2-D"):
        non_dominated_mask(np.zeros(3), ["max"])
    with pytest.raises(ValueError, match="1 direction"):
        pareto_ranks(np.zeros((3, 2)), ["max"])
    with pytest.raises(ValueError, match="'max' or 'min'"):
        non_dominated_mask(np.zeros((3, 1)), ["up"])
    with pytest.raises(ValueError, match="finite"):
        hypervolume(np.zeros((3, 2)), ["min", "min"], [1.0, INF])
    with pytest.raises(ValueError, match="one value per objective"):
        hypervolume(np.zeros((3, 2)), ["min", "min"], [1.0])


def test_hypervolume_of_a_staircase() -> None:
    points = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [3.0, 3.0]])

    assert hypervolume(points, ["min", "min"], [4.0, 4.0]) == 6.0
    assert hypervolume(-points, ["max", "max"], [-4.0, -4.0]) == 6.0
    assert hypervolume(points[:0], ["min", "min"], [4.0, 4.0]) == 0.0
    assert hypervolume(points[:, :1], ["min"], [4.0]) == 3.0


def test_hypervolume_in_four_dimensions_matches_the_grid() -> None:
    rng = np.random.default_rng(7)
    points = rng.integers(0, 4, size=(9, 4)).astype(float)
    directions = ["min", "max", "min", "max"]
    reference = [4, 0, 4, 0]

    expected = brute_hypervolume(points.tolist(), directions, reference)

    assert expected > 0
    assert hypervolume(points, directions, reference) == expected


# pareto_front


def test_non_dp_run_with_infinite_epsilon_sits_on_the_front_by_accuracy() -> None:
    df = runs(
        ("fedavg", INF, 0.85, "FINISHED"),
        ("fedavg", INF, 0.60, "FINISHED"),  # non-DP and worse than a DP run: dominated
        ("dp-fedavg", 1.0, 0.62, "FINISHED"),
        ("dp-fedavg", 4.0, 0.75, "FINISHED"),
        ("dp-fedavg", 8.0, 0.70, "FINISHED"),  # dominated by epsilon 4
    )

    result = pareto_front(df, ACC_EPS)

    assert result.front["accuracy"].tolist() == [0.85, 0.75, 0.62]
    assert result.front["epsilon"].tolist() == [INF, 4.0, 1.0]
    assert result.table["rank"].tolist() == [0, 2, 0, 0, 1]
    assert result.table["on_front"].tolist() == [True, False, True, True, False]


def test_front_is_sorted_best_first_by_the_first_objective() -> None:
    df = runs(("a", 1.0, 0.5, "FINISHED"), ("a", 3.0, 0.7, "FINISHED"))

    eps_first = pareto_front(df, ACC_EPS[::-1])

    assert eps_first.front["epsilon"].tolist() == [1.0, 3.0]


def test_failed_runs_are_counted_and_left_out() -> None:
    df = runs(
        ("a", 1.0, 0.99, "FAILED"),  # would dominate everything
        ("a", 2.0, np.nan, "KILLED"),
        ("a", 2.0, 0.70, "FINISHED"),
        ("a", 3.0, np.nan, "FINISHED"),  # finished but never evaluated
        ("b", 1.0, 0.60, "FINISHED"),
    )

    result = pareto_front(df, ACC_EPS)

    assert (result.n_runs, result.n_failed, result.n_invalid) == (5, 2, 3)  # invalid: all out
    assert result.invalid_reasons == {"FAILED": 1, "KILLED": 1, "not measured: accuracy": 1}
    assert len(result.table) == 2
    assert result.front["accuracy"].tolist() == [0.70, 0.60]


def test_without_a_status_column_every_row_counts() -> None:
    df = runs(("a", 1.0, 0.5, "x")).drop(columns="status")

    result = pareto_front(df, ACC_EPS)

    assert (result.n_runs, result.n_failed, len(result.front)) == (1, 0, 1)


def test_per_group_fronts() -> None:
    df = runs(
        ("fedavg", 1.0, 0.60, "FINISHED"),
        ("fedavg", 2.0, 0.65, "FINISHED"),
        ("fedprox", 1.0, 0.62, "FINISHED"),
        ("fedprox", 2.0, 0.61, "FINISHED"),  # dominated within fedprox
        ("fedprox", 4.0, 0.70, "FINISHED"),
    )

    result = pareto_front(df, ACC_EPS, by="algorithm")

    assert sorted(result.per_group) == ["fedavg", "fedprox"]
    assert result.per_group["fedavg"]["accuracy"].tolist() == [0.65, 0.60]
    assert result.per_group["fedprox"]["accuracy"].tolist() == [0.70, 0.62]
    assert result.table["on_group_front"].tolist() == [True, True, True, False, True]
    # fedavg at epsilon 1 loses to fedprox at epsilon 1 over all groups.
    assert result.table["on_front"].tolist() == [False, True, True, False, True]


def test_a_repeated_index_does_not_confuse_the_groups() -> None:
    df = runs(("a", 1.0, 0.6, "FINISHED"), ("a", 2.0, 0.5, "FINISHED"), ("b", 1.0, 0.7, "FINISHED"))
    df.index = [0, 0, 0]

    result = pareto_front(df, ACC_EPS, by="algorithm")

    assert result.table["on_group_front"].tolist() == [True, False, True]
    assert len(result.per_group["a"]) == 1


def test_seed_aggregation_computes_the_front_on_configuration_means() -> None:
    df = pd.DataFrame(
        {
            "algorithm": ["dp"] * 4 + ["dp"] * 2 + ["plain"] * 2 + ["dp"],
            "noise": [1.0] * 4 + [0.5] * 2 + [np.nan] * 2 + [2.0],
            "seed": [0, 1, 2, 3, 0, 1, 0, 1, 0],
            "epsilon": [2.0, 2.0, 2.0, 2.0, 5.0, 5.0, INF, INF, 1.0],
            "accuracy": [0.6, 0.7, 0.8, np.nan, 0.70, 0.80, 0.85, 0.83, 0.5],
            "status": ["FINISHED"] * 8 + ["FAILED"],
        }
    )

    result = pareto_front(df, ACC_EPS, by="algorithm", group_cols=["noise"])
    table = result.table.set_index("noise", drop=False)

    assert (result.n_failed, result.n_invalid) == (1, 2)
    assert table.loc[1.0, "n_seeds"] == 3
    assert table.loc[1.0, "accuracy"] == pytest.approx(0.7)
    assert table.loc[1.0, "accuracy_std"] == pytest.approx(0.1)
    assert table.loc[0.5, "accuracy"] == pytest.approx(0.75)
    assert "algorithm" in result.table.columns  # ``by`` joins the keys
    # The non-DP configuration (noise NaN) is kept as its own configuration.
    assert result.table["noise"].isna().sum() == 1
    assert result.front["epsilon"].tolist() == [INF, 5.0, 2.0]
    assert result.per_group["plain"]["n_seeds"].tolist() == [2]


def test_seed_aggregation_claims_the_worst_seeds_epsilon() -> None:
    # A LoDMeta walk's busiest client differs by seed: each seed's run has its own epsilon,
    # and the configuration guarantees only the largest of them (the mean under-reports).
    df = pd.DataFrame(
        {
            "noise": [1.0, 1.0, 1.0],
            "seed": [0, 1, 2],
            "epsilon": [5.78, 6.77, 6.26],
            "accuracy": [0.6, 0.7, 0.8],
            "status": ["FINISHED"] * 3,
        }
    )

    row = pareto_front(df, ACC_EPS, group_cols=["noise"]).table.iloc[0]

    assert row["epsilon"] == pytest.approx(6.77)
    assert row["accuracy"] == pytest.approx(0.7)
    assert row["epsilon_std"] == pytest.approx(np.std([5.78, 6.77, 6.26], ddof=1))


def test_unknown_columns_are_named() -> None:
    df = runs(("a", 1.0, 0.5, "FINISHED"))

    with pytest.raises(ValueError, match="objective column.*loss"):
        pareto_front(df, [Objective("loss", "min")])
    with pytest.raises(ValueError, match="group-by column.*method"):
        pareto_front(df, ACC_EPS, by="method")
    with pytest.raises(ValueError, match="configuration column.*lr"):
        pareto_front(df, ACC_EPS, group_cols=["lr"])
    with pytest.raises(ValueError, match="group_cols is empty"):
        pareto_front(df, ACC_EPS, group_cols=[])


def test_an_empty_table_gives_an_empty_front() -> None:
    result = pareto_front(runs(), ACC_EPS, by="algorithm")

    assert (result.n_runs, len(result.front), len(result.table)) == (0, 0, 0)
    assert result.per_group == {}
