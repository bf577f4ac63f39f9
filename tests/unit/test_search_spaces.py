from __future__ import annotations

import optuna
import pytest

from flcore.algorithms import ALGORITHMS
from flcore.config import validate_config
from search_spaces import SPACES, define_by_run, overrides_for


def test_every_registered_algorithm_has_a_space() -> None:
    assert set(ALGORITHMS.names()) <= set(SPACES.names())


@pytest.mark.parametrize("algorithm", ["fedavg", "local"])
def test_space_yields_valid_config_overrides(algorithm: str) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        assert define_by_run([algorithm])(trial) == {"algorithm": algorithm}
        over = overrides_for(algorithm, trial.params)
        assert over and all(":" not in k for k in over)
        cfg = validate_config(
            {
                "algorithm": algorithm,
                **{k: v for k, v in over.items() if "." not in k},
                "optimizer": {"momentum": over["optimizer.momentum"]},
            }
        )
        assert 1e-3 <= cfg.lr <= 1e-1 and 1 <= cfg.local_epochs <= 5


def test_algorithm_is_a_categorical_with_conditional_spaces() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        assert define_by_run(["fedavg", "local"])(trial) is None
        alg = trial.params["algorithm"]
        seen.add(alg)
        other = "local" if alg == "fedavg" else "fedavg"
        assert not any(k.startswith(f"{other}:") for k in trial.params)
        study.tell(trial, 0.5)
    assert seen == {"fedavg", "local"}


def test_spaces_do_no_computation() -> None:
    # A space only suggests: with fixed values it returns at once and changes nothing.
    fixed = optuna.trial.FixedTrial(
        {
            "fedavg:lr": 0.01,
            "fedavg:local_epochs": 5,
            "fedavg:optimizer.momentum": 0.5,
            "fedavg:client_fraction": 1.0,
        }
    )
    assert SPACES.get("fedavg")(fixed, "fedavg") is None
    assert overrides_for("fedavg", fixed.params) == {
        "lr": 0.01,
        "local_epochs": 5,
        "optimizer.momentum": 0.5,
        "client_fraction": 1.0,
    }


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_every_space_samples_configs_that_validate(algorithm: str) -> None:
    """Whatever a space suggests is a config the algorithm accepts (DP keys included)."""
    from flcore.config import apply_overrides

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(10):
        trial = study.ask()
        define_by_run([algorithm])(trial)
        over = overrides_for(algorithm, trial.params)
        base = {"algorithm": algorithm}
        cls = ALGORITHMS.get(algorithm)
        if cls.requires_public:
            base["public_samples"] = 100  # FedMD's public set: part of its sweep's base config
        if cls.needs_fewshot:  # the meta family's tasks (and graph): its sweep's base config
            base |= {"model": "conv4", "fewshot": {"n_way": 5, "k_shot": 5}}
            base |= {"graph": {"name": "regular", "degree": 3}} if cls.topology != "server" else {}
        cfg = validate_config(apply_overrides(base, over))
        if ALGORITHMS.get(algorithm).requires_privacy:
            p = cfg.privacy
            assert p is not None and p.target_epsilon is not None
            assert 0.5 <= p.target_epsilon <= 32 and p.delta in (1e-6, 1e-5)
        study.tell(trial, 0.5)
