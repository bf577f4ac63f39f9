"""analyse_front: objectives checked, seeds averaged, fronts per group and overall against brute
force on random run tables, failed and unmeasured runs counted, hypervolume per front."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.fronts import (
    ObjectiveError,
    analyse_front,
    check_objectives,
    config_columns,
    metric_columns,
    repeated_seeds,
)
from analysis.pareto import Objective, hypervolume
from tests.unit.analysis._brute import brute_mask, brute_ranks

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")
INF = math.inf


def table(rows: list[tuple]) -> pd.DataFrame:
    """(run_id, algorithm, lr, seed, accuracy, epsilon, status) rows."""
    cols = ["run_id", "algorithm", "params.lr", "params.seed", "accuracy", "epsilon", "status"]
    return pd.DataFrame(rows, columns=cols)


# random run tables: a few algorithms and configurations, values with ties, inf and NaN
VALUE = st.one_of(st.integers(0, 3).map(float), st.sampled_from([INF, math.nan]))
ROW = st.tuples(
    st.sampled_from(["fedavg", "hyperfl", "local"]),
    st.sampled_from([0.01, 0.1]),
    st.integers(0, 2),
    VALUE,
    VALUE,
    st.sampled_from(["FINISHED"] * 4 + ["FAILED", "KILLED"]),
)


def random_table(rows: list[tuple]) -> pd.DataFrame:
    return table([(f"r{i}", *row) for i, row in enumerate(rows)])


def _measured(df: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """(finished runs, finished runs with both objectives), as plain dicts."""
    ok = [r for r in df.to_dict("records") if r["status"] == "FINISHED"]
    valid = [r for r in ok if not (math.isnan(r["accuracy"]) or math.isnan(r["epsilon"]))]
    return ok, valid


@settings(max_examples=120, deadline=None)
@given(st.lists(ROW, max_size=14))
def test_fronts_per_group_and_overall_equal_brute_force(rows: list[tuple]) -> None:
    df = random_table(rows)
    if df["accuracy"].isna().all() or df["epsilon"].isna().all():
        return  # no run reports an objective: an error, tested below

    fa = analyse_front(df, [ACC, EPS], by="algorithm", average_seeds=False)

    ok, valid = _measured(df)
    assert fa.result.n_failed == len(df) - len(ok)
    assert fa.result.n_invalid == len(df) - len(valid)  # every run left out
    points = [[r["accuracy"], r["epsilon"]] for r in valid]
    mask = brute_mask(points, ["max", "min"])
    assert set(fa.result.front["run_id"]) == {
        r["run_id"] for r, m in zip(valid, mask, strict=True) if m
    }
    ranks = dict(zip(fa.result.table["run_id"], fa.result.table["rank"], strict=True))
    assert [ranks[r["run_id"]] for r in valid] == brute_ranks(points, ["max", "min"])
    for algorithm in {r["algorithm"] for r in valid}:
        mine = [r for r in valid if r["algorithm"] == algorithm]
        mask = brute_mask([[r["accuracy"], r["epsilon"]] for r in mine], ["max", "min"])
        expected = {r["run_id"] for r, m in zip(mine, mask, strict=True) if m}
        assert set(fa.result.per_group[algorithm]["run_id"]) == expected


@settings(max_examples=80, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=14))
def test_averaged_fronts_are_the_fronts_of_the_configuration_means(rows: list[tuple]) -> None:
    df = random_table(rows)
    if df["accuracy"].isna().all() or df["epsilon"].isna().all():
        return

    fa = analyse_front(df, [ACC, EPS], by="algorithm", average_seeds=True)

    # by hand: the measured finished runs of each (algorithm, lr), their mean accuracy and
    # their worst (largest) epsilon: the guarantee every seed has
    groups: dict[tuple, list[dict]] = {}
    for r in _measured(df)[1]:
        groups.setdefault((r["algorithm"], r["params.lr"]), []).append(r)
    keys = sorted(groups)
    means = [
        [np.mean([r["accuracy"] for r in groups[k]]), max(r["epsilon"] for r in groups[k])]
        for k in keys
    ]
    mask = brute_mask(means, ["max", "min"])
    ids = [",".join(r["run_id"] for r in groups[k]) for k in keys]
    assert set(fa.result.front["run_ids"]) == {i for i, m in zip(ids, mask, strict=True) if m}
    assert fa.seeds_averaged
    assert fa.result.table["n_seeds"].sum() == sum(len(v) for v in groups.values())


def test_seeds_are_averaged_only_when_a_configuration_has_several() -> None:
    runs = table(
        [
            ("a", "local", 0.1, 0, 0.50, 0.0, "FINISHED"),
            ("b", "local", 0.1, 1, 0.60, 0.0, "FINISHED"),
            ("c", "fedavg", 0.1, 0, 0.70, INF, "FINISHED"),
            ("d", "fedavg", 0.1, 1, 0.99, INF, "FAILED"),
        ]
    )

    averaged = analyse_front(runs, [ACC, EPS])
    single = analyse_front(runs[runs["run_id"] != "b"], [ACC, EPS])

    assert averaged.seeds_averaged and not single.seeds_averaged
    local = averaged.result.table.set_index("algorithm").loc["local"]
    assert local["accuracy"] == pytest.approx(0.55)
    assert local["accuracy_std"] == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert local["n_seeds"] == 2 and local["run_ids"] == "a,b" and local["run_id"] == "a"
    fedavg = averaged.result.table.set_index("algorithm").loc["fedavg"]
    assert fedavg["n_seeds"] == 1 and fedavg["run_ids"] == "c"  # the FAILED seed is left out
    assert averaged.statuses == {"FINISHED": 3, "FAILED": 1}
    assert averaged.result.n_failed == 1


def test_same_seed_repeats_are_not_averaged_as_seeds() -> None:
    runs = table(
        [
            ("a", "local", 0.1, 0, 0.5, 0.0, "FINISHED"),
            ("b", "local", 0.1, 0, 0.6, 0.0, "FINISHED"),
        ]
    )

    assert not repeated_seeds(runs, config_columns(runs))
    assert not analyse_front(runs, [ACC, EPS]).seeds_averaged


def test_config_columns_leave_out_seeds_and_paths() -> None:
    df = pd.DataFrame(
        columns=["run_id", "params.lr", "params.seed", "params.output_dir", "params.rounds"]
    )

    assert config_columns(df) == ["params.lr", "params.rounds"]


def test_an_objective_no_run_reports_is_named_with_the_metrics_there_are() -> None:
    runs = table([("a", "local", 0.1, 0, 0.5, np.nan, "FINISHED")])

    with pytest.raises(ObjectiveError, match=r"'leak_psnr'.*metrics of these runs: accuracy"):
        check_objectives(runs, [ACC, Objective("leak_psnr", "min")])
    with pytest.raises(ObjectiveError, match="'epsilon'"):  # present but never measured
        analyse_front(runs, [ACC, EPS])
    assert metric_columns(runs) == ["accuracy", "epsilon"]


def test_bad_group_column_and_reference_length_are_errors() -> None:
    runs = table([("a", "local", 0.1, 0, 0.5, 0.0, "FINISHED")])

    with pytest.raises(ValueError, match="group-by column 'method'"):
        analyse_front(runs, [ACC, EPS], by="method")
    with pytest.raises(ValueError, match="one value per objective"):
        analyse_front(runs, [ACC, EPS], reference=[0.0])


def test_hypervolume_of_each_front_and_of_all() -> None:
    runs = table(
        [
            ("a", "dp", 0.1, 0, 0.6, 1.0, "FINISHED"),
            ("b", "dp", 0.2, 0, 0.8, 4.0, "FINISHED"),
            ("c", "plain", 0.1, 0, 0.9, INF, "FINISHED"),  # inf: adds no volume
            ("d", "local", 0.1, 0, 0.5, 0.0, "FINISHED"),
        ]
    )

    fa = analyse_front(runs, [ACC, EPS], reference=[0.0, 10.0])

    dp = np.array([[0.6, 1.0], [0.8, 4.0]])
    assert fa.hypervolume["dp"] == pytest.approx(hypervolume(dp, ["max", "min"], [0, 10]))
    assert fa.hypervolume["plain"] == 0.0
    assert fa.hypervolume["local"] == pytest.approx(0.5 * 10)
    # all: local's (0.5, 0) plus dp's points beyond it
    assert fa.hypervolume["all"] == pytest.approx(0.5 * 10 + 0.1 * 9 + 0.2 * 6)
