"""How a sweep trial combines its seeds' figures (sweeps.trainable.combine_seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sweeps.trainable import combine_seeds


def test_accuracies_are_means_and_an_epsilon_is_the_worst_seeds() -> None:
    # a LoDMeta walk's busiest client differs by seed, and so does each seed's epsilon
    latest = [
        {"accuracy": 0.6, "epsilon": 5.78, "epsilon_paper": 11.0},
        {"accuracy": 0.8, "epsilon": 6.77, "epsilon_paper": 12.0},
    ]

    out = combine_seeds(latest, {"accuracy", "epsilon", "epsilon_paper"}, {})

    assert out["accuracy"] == pytest.approx(0.7)
    assert out["epsilon"] == 6.77 and out["epsilon_paper"] == 12.0
    assert out["epsilon_std"] == pytest.approx(np.std([5.78, 6.77], ddof=1))


def test_equal_seeds_inf_and_unmeasured_keys() -> None:
    latest = [{"epsilon": math.inf, "accuracy": 0.5}, {"epsilon": math.inf}]

    out = combine_seeds(latest, {"epsilon", "accuracy", "leak_psnr"}, {"leak_psnr": 0.0})

    assert out["epsilon"] == math.inf and out["epsilon_std"] == 0.0
    assert math.isnan(out["accuracy"])  # seed 1 has not measured it yet
    assert out["leak_psnr"] == 0.0  # the spec's fill
    assert "accuracy_std" not in out
