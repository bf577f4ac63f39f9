"""What lands on a front (issue 23 §3): failed, pruned, early-stopped and unmeasured runs are
left out of every front and counted as invalid, by reason."""

from __future__ import annotations

import math

import pandas as pd

from analysis.fronts import analyse_front
from analysis.pareto import Objective, pareto_front
from analysis.tables import communication
from analysis.validity import exclusion_reasons, stopped_early

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")
COLUMNS = [
    "run_id",
    "algorithm",
    "status",
    "trial_status",
    "stopped_early",
    "accuracy",
    "epsilon",
]


def trials(rows: list[tuple]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["trial_id"] = [f"t{i}" for i in range(len(df))]
    return df


def test_a_stopped_early_trial_never_appears_on_a_front() -> None:
    # Stopped after 1 of 3 rounds: a lower epsilon only because it trained less, so it would
    # dominate. Tagged true, whatever MLflow's status reads.
    df = trials(
        [
            ("ok", "dp_fedavg", "FINISHED", "FINISHED", None, 0.80, 3.0),
            ("asha", "dp_fedavg", "KILLED", "PRUNED", True, 0.85, 1.0),
            ("asha2", "dp_fedavg", "FINISHED", "FINISHED", "true", 0.90, 0.5),
        ]
    )

    result = pareto_front(df, [ACC, EPS], by="algorithm")

    assert result.front["run_id"].tolist() == ["ok"]
    assert result.per_group["dp_fedavg"]["run_id"].tolist() == ["ok"]
    assert result.invalid_reasons == {"stopped early": 2}
    assert (result.n_failed, result.n_invalid) == (2, 2)


def test_a_trial_an_old_sweep_closed_as_finished_after_asha_stopped_it() -> None:
    # Before trials were tagged, a stopped trial read FINISHED; its last round gives it away.
    df = trials(
        [
            ("full", "fedavg", "FINISHED", "FINISHED", None, 0.80, math.inf),
            ("cut", "fedavg", "FINISHED", "FINISHED", None, 0.95, math.inf),
        ]
    )
    df["round"] = [10, 2]
    df["params.rounds"] = [10, 10]
    single_run = df.drop(columns="trial_id")  # a `fedsweep run`: no trial, not inferred

    assert stopped_early(df).tolist() == [False, True]
    assert pareto_front(df, [ACC, EPS]).front["run_id"].tolist() == ["full"]
    assert not stopped_early(single_run).any()
    df["stopped_early"] = [None, False]  # an explicit tag wins over the inference
    assert not stopped_early(df).any()


def test_failed_and_pruned_trials_and_unmeasured_runs_are_counted_invalid() -> None:
    df = trials(
        [
            ("ok", "fedavg", "FINISHED", "FINISHED", None, 0.70, math.inf),
            ("err", "fedavg", "FAILED", "FAILED", None, 0.99, 0.0),
            ("pruned", "fedavg", "FINISHED", "PRUNED", None, 0.98, 0.0),  # tag says PRUNED
            ("killed", "fedavg", "KILLED", None, None, 0.97, 0.0),
            ("nan", "fedavg", "FINISHED", "FINISHED", None, math.nan, 0.0),
            ("null", "fedavg", "FINISHED", "FINISHED", None, None, None),
        ]
    )

    analysis = analyse_front(df, [ACC, EPS])
    result = analysis.result

    assert result.front["run_id"].tolist() == ["ok"]
    assert (result.n_runs, result.n_failed, result.n_invalid) == (6, 3, 5)
    assert result.invalid_reasons == {
        "FAILED": 1,
        "KILLED": 1,
        "PRUNED": 1,
        "not measured: accuracy": 1,
        "not measured: accuracy, epsilon": 1,
    }


def test_exclusion_reasons_per_row_in_order() -> None:
    df = trials(
        [
            ("a", "x", "KILLED", "PRUNED", "true", 1.0, 1.0),
            ("b", "x", "KILLED", "PRUNED", None, 1.0, 1.0),
            ("c", "x", "RUNNING", None, None, 1.0, 1.0),
            ("d", "x", None, None, None, 1.0, 1.0),
            ("e", "x", "FINISHED", None, None, 1.0, 1.0),
        ]
    )

    reasons = exclusion_reasons(df, ["accuracy"]).tolist()

    assert reasons == ["stopped early", "PRUNED", "RUNNING", "no status", None]


def test_communication_leaves_stopped_trials_out() -> None:
    df = trials(
        [
            ("full", "fedavg", "FINISHED", "FINISHED", None, 0.8, math.inf),
            ("cut", "fedavg", "KILLED", "PRUNED", True, 0.8, math.inf),
        ]
    )
    df["bytes_up"] = [100.0, 10.0]
    df["bytes_down"] = [100.0, 10.0]
    df["params.rounds"] = [10, 10]
    df["dataset"] = "fmnist"

    table = communication(df)

    assert table["runs"].tolist() == [1] and table["up_per_round"].tolist() == [10.0]
