from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flcore.config import apply_overrides, flatten, load_config, parse_overrides, validate_config
from flcore.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "sweeps" / "configs"


def test_defaults_are_hyperfl_fmnist_setup() -> None:
    cfg = validate_config({})
    assert (cfg.algorithm, cfg.dataset, cfg.num_clients, cfg.samples_per_client) == (
        "fedavg",
        "fmnist",
        20,
        600,
    )
    assert (cfg.local_epochs, cfg.batch_size, cfg.lr, cfg.rounds) == (5, 50, 0.01, 200)
    assert (cfg.optimizer.momentum, cfg.optimizer.weight_decay) == (0.5, 5e-4)
    assert cfg.partition.name == "dominant" and cfg.partition.s == 20


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(SHIPPED).as_posix() for p in SHIPPED.rglob("*.yaml"))
)
def test_shipped_configs_validate(path: str) -> None:
    cfg = load_config(SHIPPED / path)
    assert cfg.dataset in ("fmnist", "cifar10", "cifar100", "svhn", "emnist")
    if path.startswith("lpm/"):
        assert cfg.batch_size == 16 and cfg.model_params == {"pretrained": True}


def test_shipped_fedavg_config_is_the_paper_setup() -> None:
    cfg = load_config(SHIPPED / "fedavg_fmnist.yaml")
    assert (cfg.num_clients, cfg.samples_per_client, cfg.local_epochs, cfg.batch_size) == (
        20,
        600,
        5,
        50,
    )
    assert (cfg.lr, cfg.optimizer.momentum, cfg.optimizer.weight_decay, cfg.rounds) == (
        0.01,
        0.5,
        5e-4,
        200,
    )
    assert (cfg.partition.name, cfg.partition.s) == ("dominant", 20)
    assert load_config(SHIPPED / "local_fmnist.yaml").algorithm == "local"


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"lr": 0}, "lr"),
        ({"lr": -0.1}, "lr"),
        ({"rounds": 0}, "rounds"),
        ({"client_fraction": 0}, "client_fraction"),
        ({"client_fraction": 1.5}, "client_fraction"),
        ({"rounds": "many"}, "rounds"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"unknown_key": 1}, "unknown_key"),
        ({"optimizer": {"momentum": 1.2}}, "optimizer.momentum"),
        ({"optimizer": {"nesterov": True}}, "optimizer.nesterov"),
        ({"partition": {"s": 120}}, "partition.s"),
        ({"partition": {"name": "zipf"}}, "partition.name"),
        ({"algorithm": "fedavgg"}, "algorithm"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"model": "resnet1000"}, "model"),
        ({"device": "tpu"}, "device"),
        ({"algorithm_params": {"mu": 0.1}}, "algorithm_params.mu"),
        ({"partition": {"name": "pathological", "k": 11}}, "partition.k"),
    ],
)
def test_each_config_error_names_its_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    assert info.value.key == key
    assert str(info.value).startswith(key)


def test_unknown_algorithm_error_lists_known() -> None:
    with pytest.raises(ConfigError, match="known: .*fedavg.*local"):
        validate_config({"algorithm": "nope"})


def test_overrides_reach_nested_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"rounds": 3, "optimizer": {"momentum": 0.5}}))
    cfg = load_config(
        path, ["optimizer.momentum=0.9", "rounds=7", "partition.name=iid", "experiment=x"]
    )
    assert cfg.optimizer.momentum == 0.9 and cfg.rounds == 7
    assert cfg.partition.name == "iid" and cfg.experiment == "x"


def test_override_parsing_errors() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["rounds"])
    with pytest.raises(ConfigError, match="not a mapping"):
        apply_overrides({"rounds": 3}, {"rounds.x": 1})


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="is a folder, not a config file"):
        load_config(tmp_path)
    empty = tmp_path / "empty.yaml"
    for text in ("", "# nothing but a comment\n"):  # not "every default": a full run
        empty.write_text(text)
        with pytest.raises(ConfigError, match="the file is empty"):
            load_config(empty)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_flatten_uses_dots_without_prefix() -> None:
    flat = flatten(validate_config({}).model_dump())
    assert flat["optimizer.momentum"] == 0.5
    assert flat["algorithm"] == "fedavg"
    assert "partition.name" in flat


@pytest.mark.parametrize(
    "path", sorted(p.name for p in (SHIPPED / "fedhkd").glob("*.yaml")) or ["<none>"]
)
def test_shipped_fedhkd_configs_are_the_papers_protocol(path: str) -> None:
    # FedHKD Sec. 5 / Appendix A.2: 10 clients split 75/25, Dirichlet, Adam 1e-3 halved every
    # 10 rounds, batch 64, 5 local epochs, 50 rounds, every client every round; Table 1: 10, 20
    # and 50 clients hold 10%, 20% and 50% of the training set, 1% of it a client
    cfg = load_config(SHIPPED / "fedhkd" / path)
    train = {"fmnist": 60_000, "cifar10": 50_000, "cifar100": 50_000, "svhn": 73_257}[cfg.dataset]
    assert (cfg.num_clients, cfg.partition.name) == (10, "dirichlet")
    assert cfg.samples_per_client == train // 100
    if cfg.algorithm == "fedmd":  # the public set: one client's local train set
        assert cfg.public_samples == int(0.75 * cfg.samples_per_client)
    assert cfg.client_split is not None
    assert (cfg.client_split.train, cfg.client_split.test) == (0.75, 0.25)
    assert (cfg.optimizer.name, cfg.lr, cfg.lr_decay, cfg.lr_decay_every) == ("adam", 1e-3, 0.5, 10)
    assert (cfg.batch_size, cfg.local_epochs, cfg.rounds, cfg.client_fraction) == (64, 5, 50, 1.0)
    latent = {"fmnist": 32, "svhn": 32, "cifar10": 64, "cifar100": 64}[cfg.dataset]
    assert cfg.model_params == {"latent_dim": latent}
    assert path.split("_", 1)[1] == f"{cfg.algorithm}.yaml"
