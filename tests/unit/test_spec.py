from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from flcore.errors import ConfigError
from sweeps.spec import load_spec, validate_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "sweeps" / "quickstart.yaml"
CONFIGS = QUICKSTART.parent / "configs"


def _spec(**over: object) -> dict:
    return {
        "name": "s",
        "base": {"rounds": 2},
        "algorithms": ["fedavg", "local"],
        "objectives": {"accuracy": "max", "bytes_up": "min"},
    } | over


def test_quickstart_spec_is_valid_and_small() -> None:
    spec = load_spec(QUICKSTART)
    assert spec.algorithms == ["fedavg", "local", "dp_fedavg", "hyperfl"]
    assert spec.multi_objective
    assert [o.name for o in spec.objectives] == [
        "accuracy",
        "epsilon",
        "leak_psnr_gain_worst_round",
    ]
    assert spec.base.attack is not None and spec.base.attack.iterations <= 500
    assert spec.base.dataset == "fmnist" and spec.num_samples * spec.base.rounds <= 40


def test_objective_forms() -> None:
    a = validate_spec(_spec(objectives={"accuracy": "max", "epsilon": "min"}))
    b = validate_spec(_spec(objectives=["accuracy:max", "epsilon:min"]))
    c = validate_spec(
        _spec(
            objectives=[
                {"name": "accuracy", "direction": "max"},
                {"name": "epsilon", "direction": "min"},
            ]
        )
    )
    assert a.objectives == b.objectives == c.objectives


def test_set_reaches_every_key_including_base(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    spec = load_spec(
        path,
        [
            "num_samples=2",
            "base.rounds=1",
            "resources.gpu=0.25",
            "sampler.name=random",
            "ray.address=auto",
            "tracking.experiment=x",
            "base.optimizer.momentum=0.9",
            "seeds=[0, 1, 2]",
        ],
    )
    assert spec.num_samples == 2 and spec.base.rounds == 1 and spec.resources.gpu == 0.25
    assert spec.sampler.name == "random" and spec.ray.address == "auto"
    assert spec.base.optimizer.momentum == 0.9 and spec.seeds == [0, 1, 2]
    assert spec.tracking.experiment == "x"


def test_base_may_be_a_path_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({"rounds": 4, "num_clients": 5}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_spec(base="exp.yaml")))
    spec = load_spec(tmp_path / "s.yaml", ["base.rounds=3"])
    assert spec.base.rounds == 3 and spec.base.num_clients == 5
    assert Path(spec.base.data_root).is_absolute()


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"num_samples": 0}, "num_samples"),
        ({"algorithms": []}, "algorithms"),
        ({"algorithms": ["nope"]}, "algorithms.0"),
        ({"objectives": {"leak_psnr": "min"}}, "objectives.0"),
        ({"objectives": {"accuracy": "sideways"}}, "objectives.0.direction"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"resources": {"gpu": -1}}, "resources.gpu"),
        ({"scheduler": {"name": "asha"}}, "scheduler"),
        ({"scheduler": {"name": "asha", "metric": "zzz", "mode": "max"}}, "scheduler.metric"),
        ({"base": {"lr": 0}}, "base.lr"),
        ({"name": "has space"}, "name"),
        ({"extra": 1}, "extra"),
        ({"sampler": {"name": "nsga2"}, "num_samples": 200}, "sampler.name"),
        ({"sampler": {"name": "tpe", "population_size": 8}}, "sampler.population_size"),
        ({"sampler": {"name": "random", "population_size": 8}}, "sampler.population_size"),
        ({"sampler": {"name": "nsga2", "population_size": 1}}, "sampler.population_size"),
        ({"storage": {"optuna": "redis"}}, "storage.optuna"),
        ({"storage": {"optuna": "redis://localhost/0"}}, "storage.optuna"),
        ({"storage": {"optuna": "sqlite://"}}, "storage.optuna"),
        ({"storage": {"optuna": "postgresql://me:secret@db/optuna"}}, "storage.optuna"),
    ],
)
def test_spec_errors_name_the_key(over: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_spec(_spec(**over))
    assert info.value.key == key, str(info.value)


def test_missing_value_allows_an_objective_some_algorithm_lacks() -> None:
    with pytest.raises(ConfigError, match="local cannot report 'global_accuracy'"):
        validate_spec(_spec(objectives={"global_accuracy": "max"}))
    spec = validate_spec(
        _spec(objectives=[{"name": "global_accuracy", "direction": "max", "missing": 0.0}])
    )
    assert spec.objectives[0].missing == 0.0


def test_asha_on_one_metric() -> None:
    spec = validate_spec(_spec(scheduler={"name": "asha", "metric": "accuracy", "mode": "max"}))
    assert spec.scheduler.metric == "accuracy" and spec.steps == 2


ATTACK = {"name": "ig", "images": 2, "iterations": 10}


def test_leakage_objectives_need_an_attack_and_a_missing_value_for_local() -> None:
    objectives = [{"name": "accuracy", "direction": "max"}, "leak_psnr:min"]
    with pytest.raises(ConfigError, match="cannot report 'leak_psnr'"):
        validate_spec(_spec(algorithms=["fedavg"], objectives=objectives))  # no attack
    spec = validate_spec(
        _spec(algorithms=["fedavg"], objectives=objectives, base={"rounds": 2, "attack": ATTACK})
    )
    assert [o.name for o in spec.objectives] == ["accuracy", "leak_psnr"]
    # local uploads nothing: its leakage is null, so the objective needs a missing value
    with pytest.raises(ConfigError, match="local cannot report 'leak_psnr'"):
        validate_spec(_spec(objectives=objectives, base={"rounds": 2, "attack": ATTACK}))
    ok = [objectives[0], {"name": "leak_psnr", "direction": "min", "missing": 0.0}]
    validate_spec(_spec(objectives=ok, base={"rounds": 2, "attack": ATTACK}))


def test_an_lpips_objective_without_alexnet_weights_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # a hub without the weights
    objectives = ["accuracy:max", "leak_lpips:max"]
    with pytest.raises(ConfigError, match="AlexNet weights"):
        validate_spec(
            _spec(
                algorithms=["fedavg"], objectives=objectives, base={"rounds": 2, "attack": ATTACK}
            )
        )


# --- samplers: NSGA-II with several algorithms, its population, TPE's constant liar -----------


def test_nsga2_with_several_algorithms_is_refused_pointing_to_tpe() -> None:
    with pytest.raises(ConfigError, match="intersection search space.*sampler.name=tpe") as info:
        validate_spec(_spec(sampler={"name": "nsga2", "population_size": 4}, num_samples=20))
    assert info.value.key == "sampler.name"
    one = validate_spec(
        _spec(
            algorithms=["fedavg"], sampler={"name": "nsga2", "population_size": 4}, num_samples=20
        )
    )
    assert one.sampler.population_size == 4


def test_the_refusal_states_what_optunas_nsga2_does_with_our_spaces() -> None:
    """The message's claim, checked on Optuna itself: with two algorithms the space NSGA-II
    evolves is the algorithm choice alone (every hyperparameter is drawn at random)."""
    import optuna

    from search_spaces import define_by_run

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.NSGAIISampler(seed=0, population_size=4)
    study = optuna.create_study(sampler=sampler, directions=["maximize", "minimize"])
    space = define_by_run(["fedavg", "local"])
    study.optimize(lambda t: (space(t), 0.0, 0.0)[1:], n_trials=8)
    algorithms = {t.params["algorithm"] for t in study.trials}
    trial = study.ask()

    evolved = sampler.infer_relative_search_space(study, study._storage.get_trial(trial._trial_id))

    assert algorithms == {"fedavg", "local"}
    assert set(evolved) == {"algorithm"}


def test_nsga2_needs_more_trials_than_its_random_first_generation() -> None:
    with pytest.raises(ConfigError, match="first generation \\(50 trials\\) at random") as info:
        validate_spec(_spec(algorithms=["fedavg"], sampler={"name": "nsga2"}, num_samples=50))
    assert info.value.key == "sampler.population_size"
    with pytest.raises(ConfigError, match="num_samples=8 would never evolve"):
        validate_spec(
            _spec(
                algorithms=["fedavg"],
                sampler={"name": "nsga2", "population_size": 8},
                num_samples=8,
            )
        )
    validate_spec(_spec(algorithms=["fedavg"], sampler={"name": "nsga2"}, num_samples=51))


def test_samplers_get_population_size_and_constant_liar() -> None:
    import optuna

    from sweeps.sweep import _sampler

    nsga = _sampler(
        validate_spec(
            _spec(
                algorithms=["fedavg"],
                sampler={"name": "nsga2", "population_size": 6},
                num_samples=24,
            )
        ),
        0,
    )
    tpe_alone = _sampler(validate_spec(_spec(max_concurrent_trials=1)), 0)
    tpe_together = _sampler(validate_spec(_spec(max_concurrent_trials=3)), 0)

    assert isinstance(nsga, optuna.samplers.NSGAIISampler) and nsga.population_size == 6
    assert isinstance(tpe_alone, optuna.samplers.TPESampler)
    assert tpe_alone._constant_liar is False and tpe_together._constant_liar is True


def test_constant_liar_steers_a_concurrent_ask_away_from_a_running_trial() -> None:
    """What constant_liar buys, on Optuna itself: with a trial still running at the best point,
    the next TPE ask (seeded identically) is drawn elsewhere only when the liar is on."""
    import optuna

    from sweeps.sweep import _sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    asked = {}
    for concurrency in (1, 2):
        spec = validate_spec(
            _spec(algorithms=["fedavg"], max_concurrent_trials=concurrency, sampler={"seed": 3})
        )
        study = optuna.create_study(sampler=_sampler(spec, 0), direction="minimize")
        for x in (0.1, 0.5, 0.9, 0.3, 0.7, 0.2):
            study.enqueue_trial({"x": x})
            study.optimize(lambda t: (t.suggest_float("x", 0, 1) - 0.2) ** 2, n_trials=1)
        running = study.ask()
        running.suggest_float("x", 0, 1)
        nxt = study.ask()
        asked[concurrency] = nxt.suggest_float("x", 0, 1)
    assert asked[1] != asked[2]


def test_storage_optuna_forms() -> None:
    assert validate_spec(_spec()).storage.optuna is None
    assert validate_spec(_spec(storage={"optuna": "journal"})).storage.optuna == "journal"
    rel = validate_spec(_spec(storage={"optuna": "sqlite:///studies/s.db"})).storage.optuna
    assert rel == f"sqlite:///{Path('studies/s.db').resolve()}"
    with pytest.raises(ConfigError, match="driver that is not installed"):
        validate_spec(_spec(storage={"optuna": "mysql+nosuchdriver://db/optuna"}))
    with pytest.raises(ConfigError, match="carries a password"):
        validate_spec(_spec(storage={"optuna": "postgresql://me:secret@db/optuna"}))
    with pytest.raises(ConfigError, match="sqlite, postgresql, mysql URLs, not 'redis'"):
        validate_spec(_spec(storage={"optuna": "redis://localhost/0"}))


def test_population_size_belongs_to_nsga2_alone() -> None:
    for name in ("tpe", "random"):
        with pytest.raises(ConfigError, match=f"is NSGA-II's; sampler '{name}' has no population"):
            validate_spec(_spec(sampler={"name": name, "population_size": 8}))


def test_a_partial_epsilon_objective_is_warned_about(recwarn: pytest.WarningsRecorder) -> None:
    validate_spec(_spec(algorithms=["fedavg", "dp_fedavg"], objectives={"epsilon": "min"}))
    assert not [w for w in recwarn if "partial privacy figure" in str(w.message)]
    # FedHKD's epsilon_knowledge is finite although its model upload is unprotected (its
    # epsilon is inf): a sweep may search it, but is told it is no guarantee
    with pytest.warns(UserWarning, match="'epsilon_knowledge' is a partial privacy figure"):
        validate_spec(
            _spec(
                algorithms=["fedhkd"],
                objectives=[{"name": "epsilon_knowledge", "direction": "min", "missing": 0.0}],
            )
        )


def test_every_algorithm_must_run_on_the_base_before_any_work() -> None:
    """An algorithm the base cannot run is refused at spec time, named, not trial by trial: a
    walk on a base without few-shot clients; judged with a draw of its search space (which
    gives DP-FedAvg its privacy mapping, and the walk its graph)."""
    with pytest.raises(ConfigError, match=r"algorithms\.1: lodmeta cannot run on this base: fewsh"):
        validate_spec(_spec(algorithms=["dp_fedavg", "lodmeta"]))


def test_the_bases_algorithm_params_are_its_own_algorithms() -> None:
    """A ready config as base (Pa3dFL's, with its algorithm_params) and other methods in the
    sweep: their trials start from their own defaults, with a warning naming them; the base
    algorithm's trials keep its params; a walk's trial judges what the spec set."""
    from sweeps.spec import trial_experiment_config

    base = yaml.safe_load((CONFIGS / "pa3dfl" / "fmnist_hetero_pa3dfl.yaml").read_text())
    with pytest.warns(UserWarning) as caught:
        spec = validate_spec(_spec(base=base, algorithms=["pa3dfl", "fjord", "fedavg"]))
    (message,) = [str(w.message) for w in caught if "algorithm_params" in str(w.message)]
    own = ", ".join(sorted(base["algorithm_params"]))
    assert message.startswith(f"base.algorithm_params are pa3dfl's; fedavg does not take {own};")
    assert f"fjord does not take {own}: those trials start from their own defaults" in message
    fjord = trial_experiment_config({"algorithm": "fjord"}, spec.base)
    assert fjord.algorithm_params == {} and fjord.capacity == spec.base.capacity
    pa3dfl = trial_experiment_config({"algorithm": "pa3dfl", "pa3dfl:lr": 0.05}, spec.base)
    assert pa3dfl.algorithm_params == base["algorithm_params"] and pa3dfl.lr == 0.05
    # a family's shared knobs carry over, unwarned: LoDMeta's inner loop for LoDMeta-basic;
    # and a walk's base sets neither client_fraction nor full_last_round: its trials run
    walk = yaml.safe_load((CONFIGS / "lodmeta" / "fmnist_lodmeta.yaml").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = validate_spec(_spec(base=walk, algorithms=["lodmeta", "lodmeta_basic"]))
    basic = trial_experiment_config({"algorithm": "lodmeta_basic"}, spec.base)
    assert basic.algorithm_params == walk["algorithm_params"] and basic.graph is not None
