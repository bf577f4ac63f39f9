"""Tables derived from runs: cells, JSON records, best configurations, communication."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.fronts import analyse_front
from analysis.pareto import Objective
from analysis.tables import (
    best_configs,
    communication,
    fmt,
    fmt_bytes,
    front_records,
    group_front_records,
    mean_std,
    run_ids_of,
    shared_config,
    varying_params,
)

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")


def runs() -> pd.DataFrame:
    """Local-only with two seeds of one lr and one of another; FedAvg; a FAILED HyperFL."""
    return pd.DataFrame(
        {
            "run_id": ["l1", "l2", "l3", "f1", "h1"],
            "algorithm": ["local", "local", "local", "fedavg", "hyperfl"],
            "status": ["FINISHED"] * 4 + ["FAILED"],
            "dataset": ["fmnist"] * 5,
            "params.lr": [0.01, 0.01, 0.1, 0.01, 0.01],
            "params.seed": [0, 1, 0, 0, 0],
            "params.rounds": [2] * 5,
            "params.num_clients": [4] * 5,
            "params.client_fraction": [1.0] * 5,
            "accuracy": [0.5, 0.6, 0.4, 0.7, 0.9],
            "epsilon": [0.0, 0.0, 0.0, math.inf, math.inf],
            "bytes_up": [0.0, 0.0, 0.0, 4e6, 5.1e8],
            "bytes_down": [0.0, 0.0, 0.0, 4e6, 5.1e8],
        }
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(math.inf, "∞"), (-math.inf, "−∞"), (math.nan, "–"), (None, "–"), (0.123456, "0.1235")],
)
def test_cells(value: object, text: str) -> None:
    assert fmt(value) == text


def test_bytes_and_mean_std() -> None:
    assert fmt_bytes(3746112.0) == "3.75 MB"
    assert fmt_bytes(512.0) == "512 B" and fmt_bytes(4.78e8) == "478 MB"
    assert mean_std({"accuracy": 0.55, "accuracy_std": 0.0707}, "accuracy") == "0.55 ± 0.071"
    assert mean_std({"accuracy": 0.55, "accuracy_std": math.nan}, "accuracy") == "0.55"
    assert mean_std({"epsilon": math.inf}, "epsilon") == "∞"


# runs made before the DP tags existed: the keys are there, null
NO_TAGS = {"dp_guarantee": None, "dp_relation": None, "client_sampling": None}


def test_records_carry_seeds_and_run_ids() -> None:
    fa = analyse_front(runs(), [ACC, EPS])

    front = front_records(fa)
    groups = group_front_records(fa)

    assert fa.seeds_averaged
    assert front == [
        {
            "run_id": "f1",
            "algorithm": "fedavg",
            **NO_TAGS,
            "accuracy": 0.7,
            "epsilon": math.inf,
            "n_seeds": 1,
            "run_ids": ["f1"],
        },
        {
            "run_id": "l1",
            "algorithm": "local",
            **NO_TAGS,
            "accuracy": pytest.approx(0.55),
            "accuracy_std": pytest.approx(np.std([0.5, 0.6], ddof=1)),
            "epsilon": 0.0,
            "epsilon_std": 0.0,
            "n_seeds": 2,
            "run_ids": ["l1", "l2"],
        },
    ]
    assert set(groups) == {"fedavg", "local"}  # the failed HyperFL run has no front
    assert [r["on_overall_front"] for r in groups["local"]] == [True]
    assert run_ids_of({"run_id": "x"}) == ["x"] and run_ids_of({"run_ids": "a,b"}) == ["a", "b"]


def test_best_configs_show_what_varies_inside_each_algorithm() -> None:
    fa = analyse_front(runs(), [ACC, EPS])

    best = best_configs(runs(), fa)

    assert list(best["local"].columns) == ["accuracy", "epsilon", "seeds", "lr", "runs"]
    assert best["local"].iloc[0]["lr"] == "0.01" and best["local"].iloc[0]["seeds"] == 2
    assert best["local"].iloc[0]["runs"] == ["l1", "l2"]
    assert list(best["fedavg"].columns) == ["accuracy", "epsilon", "seeds", "runs"]
    assert varying_params(runs()) == ["params.lr"]
    assert shared_config(runs())["num_clients"] == 4 and "lr" not in shared_config(runs())


def test_communication_per_round_and_against_fedavg() -> None:
    df = runs()
    df.loc[df["run_id"] == "h1", "status"] = "FINISHED"

    table = communication(df).set_index("algorithm")

    assert table.loc["fedavg", "up_per_round"] == 2e6
    assert table.loc["hyperfl", "up_vs_fedavg"] == pytest.approx(127.5)
    assert table.loc["local", "up_vs_fedavg"] == 0.0 and table.loc["local", "runs"] == 3
    assert {"dataset", "num_clients", "client_fraction"} <= set(table.columns)


def test_communication_without_a_reference_or_bytes() -> None:
    no_fedavg = communication(runs()[runs()["algorithm"] == "local"])

    assert no_fedavg["up_vs_fedavg"].isna().all()
    assert communication(runs().drop(columns="bytes_up")).empty
    # the rounds metric (what a run completed) wins over the configured rounds
    done = runs().assign(rounds=[1.0, 1.0, 1.0, 1.0, np.nan])
    assert communication(done).set_index("algorithm").loc["fedavg", "up_per_round"] == 4e6
