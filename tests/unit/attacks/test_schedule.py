"""One threat model and one round schedule for every algorithm of a sweep: symbolic attacked
rounds, their validation at the edge, the defaults of runs and sweeps, label knowledge, and the
leakage objectives an algorithm that uploads nothing can report (declared, not filled in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flcore.algorithms import LocalTraining, ModelSpec
from flcore.config import AttackConfig, validate_config
from flcore.data import DATASET_INFO
from flcore.errors import ConfigError
from flcore.executor import AlgorithmFactory
from flcore.experiment import attack_probe
from sweeps.spec import load_spec, validate_spec

QUICKSTART = Path(__file__).resolve().parents[3] / "sweeps" / "quickstart.yaml"
SCHEDULE = ["first", "middle", "last"]


@pytest.mark.parametrize(
    ("rounds", "entries", "resolved"),
    [
        (200, SCHEDULE, (1, 100, 200)),
        (3, SCHEDULE, (1, 2, 3)),
        (4, SCHEDULE, (1, 2, 4)),
        (1, SCHEDULE, (1,)),  # one round: every name is round 1, attacked once
        (10, [7, "last", 7, "first"], (1, 7, 10)),
        (10, None, (10,)),  # fedsweep run's default: the last round
    ],
)
def test_symbolic_rounds_resolve_against_the_runs_rounds(
    rounds: int, entries: list[Any] | None, resolved: tuple[int, ...]
) -> None:
    cfg = validate_config({"rounds": rounds, "attack": {"rounds": entries}})
    assert cfg.attack is not None and cfg.attack.resolved_rounds(rounds) == resolved
    # and the engine's probe attacks exactly those rounds
    info = DATASET_INFO["fmnist"]
    factory = AlgorithmFactory(
        "fedavg",
        {
            "model_spec": ModelSpec(info.model, info.num_classes, info.in_channels),
            "training": LocalTraining(epochs=1, batch_size=50, lr=0.01),
            "num_clients": 20,
        },
    )
    assert attack_probe(cfg, factory).settings.rounds == resolved


@pytest.mark.parametrize(
    "rounds", [["junk"], [0], [-1], [True], [2.5], ["3"], [], "last", [11], [2, "mid"]]
)
def test_bad_attack_rounds_are_refused_naming_the_key(rounds: Any) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"rounds": 10, "attack": {"rounds": rounds}})
    assert err.value.key == "attack.rounds"


def _spec(**over: Any) -> dict[str, Any]:
    return {
        "name": "s",
        "base": {"rounds": 6, "attack": {"name": "ig", "images": 1, "iterations": 5}},
        "algorithms": ["fedavg", "local"],
        "objectives": ["accuracy:max", "leak_psnr_gain_worst_round:min"],
    } | over


def test_a_sweep_attacks_first_middle_and_last_by_default_and_runs_the_last() -> None:
    spec = validate_spec(_spec())
    assert spec.base.attack is not None and spec.base.attack.rounds == SCHEDULE
    # resolved per trial: a searched rounds of 6 attacks 1, 3 and 6
    assert spec.base.attack.resolved_rounds(6) == (1, 3, 6)
    base = _spec()["base"]
    explicit = validate_spec(_spec(base=base | {"attack": base["attack"] | {"rounds": [2]}}))
    assert explicit.base.attack is not None and explicit.base.attack.rounds == [2]
    run = validate_config(base)  # fedsweep run keeps the last round
    assert run.attack is not None and run.attack.resolved_rounds(run.rounds) == (6,)


def test_labels_are_given_by_default_and_auto_is_refused_across_algorithms() -> None:
    assert AttackConfig().labels == "given"
    base = _spec()["base"]
    auto = base | {"attack": base["attack"] | {"labels": "auto"}}
    with pytest.raises(ConfigError) as err:
        validate_spec(_spec(base=auto, algorithms=["fedavg", "hyperfl"]))
    assert err.value.key == "base.attack.labels"
    validate_spec(_spec(base=auto, algorithms=["fedavg"]))  # one algorithm: one threat model


def test_local_reports_its_declared_calibrated_leakage_but_not_raw_leakage() -> None:
    for name in ("leak_psnr_gain_worst_round", "leak_identified_worst_round", "leak_psnr_gain"):
        spec = validate_spec(_spec(objectives=["accuracy:max", f"{name}:min"]))
        assert spec.objectives[1].missing is None
    for name in ("leak_psnr", "leak_psnr_max", "leak_psnr_baseline"):
        with pytest.raises(ConfigError, match=f"local cannot report '{name}'"):
            validate_spec(_spec(objectives=["accuracy:max", f"{name}:min"]))


def test_the_quickstarts_leakage_objective_is_the_calibrated_worst_round_one() -> None:
    spec = load_spec(QUICKSTART)
    leak = [o for o in spec.objectives if o.name.startswith("leak_")]
    assert [(o.name, o.direction, o.missing) for o in leak] == [
        ("leak_psnr_gain_worst_round", "min", None)
    ]
    assert spec.base.attack is not None
    assert spec.base.attack.rounds == SCHEDULE and spec.base.attack.labels == "given"
