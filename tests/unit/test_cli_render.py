"""`fedsweep run`'s result table: every run's figures always, and the figures only some runs
have (the epsilon's meaning, the worst capacity cluster, early stopping's best round, an attack's
headline leakage) whenever the summary holds them, so a reported accuracy is never read as the
last round's when it is the best window's."""

from __future__ import annotations

import math

import pytest

from sweeps.cli.render import print_summary


def _rows(out: str) -> dict[str, str]:
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0]:
            rows[cells[0]] = cells[1]
    return rows


BASE = {
    "algorithm": "fedavg",
    "dataset": "fmnist",
    "accuracy": 0.5,
    "accuracy_before": 0.25,
    "global_accuracy": None,
    "epsilon": math.inf,
    "rounds": 2,
    "seconds": 1.5,
    "bytes_up": 10,
    "bytes_down": 10,
    "run_id": "r",
    "metrics_path": "m",
}


def test_a_plain_run_shows_every_runs_figures_only(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(BASE | {"leak_psnr": 12.0, "best_val_accuracy": 0.3})
    rows = _rows(capsys.readouterr().out)
    assert list(rows) == list(BASE)
    assert rows["accuracy"] == "0.5000" and rows["epsilon"] == "inf"


def test_early_stopping_privacy_capacity_and_attack_rows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    extra = {
        "epsilon": 2.0,
        "epsilon_shared": 2.0,
        "dp_guarantee": "record-level",
        "dp_relation": "add-remove",
        "accuracy_worst_width": 0.125,
        "rounds_completed": 2,
        "best_round": 1,
        "best_window_start": 1,
        "early_stopped": 0.0,
        "leak_psnr_gain": 0.5,
        "leak_identified": 0.75,
    }
    print_summary(BASE | extra)
    rows = _rows(capsys.readouterr().out)
    assert set(extra) <= set(rows)
    order = list(rows)
    assert order.index("epsilon_shared") == order.index("epsilon") + 1
    assert order.index("accuracy_worst_width") < order.index("epsilon") < order.index("rounds")
    assert order.index("rounds") < order.index("best_round") < order.index("seconds")
    assert rows["best_round"] == "1" and rows["dp_relation"] == "add-remove"
    assert rows["early_stopped"] == "no"
