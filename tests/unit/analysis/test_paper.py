"""The paper's numbers appear only beside runs in the paper's own setting."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.paper import (
    accuracy_comparison,
    attack_comparison,
    paper_accuracy,
    paper_attack,
    setting_of,
)

TABLE1_20 = {
    "dataset": "fmnist",
    "num_clients": 20,
    "client_fraction": 1.0,
    "rounds": 200,
    "partition.name": "dominant",
    "partition.s": 20.0,
    "samples_per_client": 600,
}
TABLE1_100 = TABLE1_20 | {"num_clients": 100, "client_fraction": 0.3}
DP = {"privacy.target_epsilon": 4.0, "privacy.delta": 1e-5}


@pytest.mark.parametrize(
    ("params", "figure"),
    [
        (TABLE1_20 | {"algorithm": "hyperfl"}, 88.28),
        (TABLE1_20 | {"algorithm": "local"}, 85.93),
        (TABLE1_100 | {"algorithm": "fedavg"}, 88.11),
        (TABLE1_20 | {"algorithm": "dp_fedavg"} | DP, 59.88),
        (TABLE1_20 | {"algorithm": "centaur"} | DP, 83.07),
        (TABLE1_100 | {"algorithm": "dp_fedavg"} | DP, 68.29),  # the same budget (D.1)
        (TABLE1_100 | {"algorithm": "centaur"} | DP, 79.77),
    ],
)
def test_a_run_in_a_table1_setting_gets_the_figure(params: dict, figure: float) -> None:
    assert paper_accuracy(params) == figure


@pytest.mark.parametrize(
    "params",
    [
        TABLE1_20 | {"algorithm": "pfedhn_pc"},  # not reported
        TABLE1_100 | {"algorithm": "ppsgd", "privacy.target_epsilon": 8.0},  # other budget
        TABLE1_20 | {"algorithm": "dp_fedavg", "privacy.target_epsilon": 8.0},  # other budget
        TABLE1_20 | {"algorithm": "fedavg", "rounds": 3},
        TABLE1_20 | {"algorithm": "fedavg", "samples_per_client": 100},
        TABLE1_20 | {"algorithm": "fedavg", "partition.name": "dirichlet"},
        TABLE1_20 | {"algorithm": "fedavg", "client_fraction": 0.5},
        TABLE1_20 | {"algorithm": "fedavg", "dataset": "cifar10"},
    ],
)
def test_any_other_setting_gets_no_figure(params: dict) -> None:
    assert paper_accuracy(params) is None


def test_attack_figures_exist_for_emnist_and_cifar10_only() -> None:
    assert paper_attack("emnist", "hyperfl") == (7.85, 0.3010, 0.7147)
    assert paper_attack("cifar10", "fedavg") == (16.16, 0.6415, 0.0536)
    assert paper_attack("fmnist", "fedavg") is None
    assert setting_of(TABLE1_100) is not None and setting_of({}) is None


def _row(run_id: str, algorithm: str, accuracy: float, **params: object) -> dict:
    base = {f"params.{k}": v for k, v in (TABLE1_20 | params).items()}
    return (
        {"run_id": run_id, "algorithm": algorithm, "status": "FINISHED"}
        | base
        | {
            "params.algorithm": algorithm,
            "accuracy": accuracy,
            "dataset": base["params.dataset"],
        }
    )


def test_accuracy_comparison_in_percent_with_spread_over_seeds() -> None:
    runs = pd.DataFrame(
        [
            _row("a", "hyperfl", 0.88),
            _row("b", "hyperfl", 0.90),
            _row("c", "fedavg", 0.80, rounds=3),  # not the paper's setting
            _row("d", "fedavg", 0.86) | {"status": "FAILED"},
        ]
    )

    table = accuracy_comparison(runs)

    assert table["algorithm"].tolist() == ["hyperfl"]
    row = table.iloc[0]
    assert row["runs"] == 2 and row["ours"] == pytest.approx(89.0) and row["paper"] == 88.28
    assert row["ours_std"] == pytest.approx(math.sqrt(2.0))
    assert math.isnan(row["ours_before"])  # no run logged accuracy_before
    assert "20 clients" in row["setting"] and "200 rounds" in row["setting"]
    assert accuracy_comparison(runs.iloc[2:]).empty


def test_attack_comparison_only_where_the_paper_measured() -> None:
    runs = pd.DataFrame(
        {
            "run_id": ["e", "f", "g"],
            "algorithm": ["hyperfl", "fedavg", "fedavg"],
            "status": ["FINISHED"] * 3,
            "dataset": ["emnist", "fmnist", "cifar10"],
            "leak_psnr": [8.0, 20.0, 15.0],
            "leak_ssim": [0.3, 0.7, 0.6],
        }
    )

    table = attack_comparison(runs)

    assert table[["dataset", "algorithm"]].values.tolist() == [
        ["cifar10", "fedavg"],
        ["emnist", "hyperfl"],
    ]
    assert table.iloc[1]["leak_psnr"] == 8.0 and table.iloc[1]["paper_psnr"] == 7.85
    assert math.isnan(table.iloc[1]["leak_lpips"])  # lpips may be absent
    assert attack_comparison(runs.drop(columns="leak_psnr")).empty


def test_accuracy_comparison_shows_the_before_training_accuracy() -> None:
    runs = pd.DataFrame(
        [
            _row("a", "fedavg", 0.90) | {"accuracy_before": 0.85},
            _row("b", "fedavg", 0.92) | {"accuracy_before": 0.87},
        ]
    )

    row = accuracy_comparison(runs).iloc[0]

    assert row["ours"] == pytest.approx(91.0) and row["ours_before"] == pytest.approx(86.0)
    assert row["paper"] == 85.67
