from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flcore.errors import ConfigError
from sweeps.spec import load_spec, validate_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "sweeps" / "quickstart.yaml"


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
    assert [o.name for o in spec.objectives] == ["accuracy", "epsilon", "leak_psnr"]
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
            "sampler.name=nsga2",
            "ray.address=auto",
            "tracking.experiment=x",
            "base.optimizer.momentum=0.9",
            "seeds=[0, 1, 2]",
        ],
    )
    assert spec.num_samples == 2 and spec.base.rounds == 1 and spec.resources.gpu == 0.25
    assert spec.sampler.name == "nsga2" and spec.ray.address == "auto"
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
