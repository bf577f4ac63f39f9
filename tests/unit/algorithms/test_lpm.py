"""HyperFL-LPM and Table 2's baselines on small backbones of the paper's designs, on real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flcore.algorithms import ClientData, ClientTask
from flcore.algorithms.base import seeded
from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_engine
from flcore.models import build_model


def _cfg(data_root: Path, algorithm: str, model: str, **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": algorithm,
        "data_root": str(data_root),
        "model": model,
        "model_params": {"tiny": True, "image_size": 32},
        "num_clients": 3,
        "global_test_per_class": 50,
        "samples_per_client": 48,
        "test_samples_per_client": 48,
        "rounds": 1,
        "local_epochs": 1,
        "batch_size": 16,
        "lr": 0.01,
        "workers": 1,
        "seed": 1,
    } | over
    return validate_config(raw)


def _update(engine, cid: int = 0):  # type: ignore[no-untyped-def]
    alg, data = engine.algorithm, engine.data
    alg.begin_round(1, [cid])
    task = ClientTask(cid, 1, alg.broadcast(1, cid), engine.client_states[cid], True, 1)
    cdata = ClientData(cid, data.client_train(cid), data.client_test(cid), data.info)
    return task, alg.local_update(cdata, task, client_generator(1, 1, cid))


@pytest.mark.parametrize("model", ["resnet18_adapter", "vit_s16_adapter"])
def test_hyperfl_lpm_generates_only_adapters_and_keeps_the_backbone(
    data_root: Path, model: str
) -> None:
    engine = build_engine(_cfg(data_root, "hyperfl_lpm", model))
    alg = engine.algorithm
    net = alg.model_spec()
    adapters = {
        k.removeprefix("features."): v.shape
        for k, v in net.state_dict().items()
        if k in set(net.adapter_keys())
    }
    generated = alg.hnet(alg._embedding0)
    assert {k: v.shape for k, v in generated.items()} == adapters
    _, result = _update(engine)
    assert set(result.upload) == set(alg.hnet.state_dict())
    # the frozen backbone did not move, and is the server's seeded network
    hnet, worker_model = alg._worker_parts()
    reference = seeded((1, 0x1417), alg.model_spec)
    for k, p in worker_model.features.named_parameters():
        if "adapter" not in k:
            assert not p.requires_grad, k
            assert torch.equal(p, reference.features.get_parameter(k)), k
    summary = engine.run()
    assert 0 <= summary["accuracy"] <= 1


def test_hyperfl_lpm_refuses_a_model_without_adapters(data_root: Path) -> None:
    cfg = _cfg(data_root, "hyperfl_lpm", "cnn_fmnist", model_params={})
    with pytest.raises(ConfigError, match="adapters"):
        build_engine(cfg)


@pytest.mark.parametrize(
    ("trainable", "prefixes"), [("head", ("head.",)), ("adapters", ("head.", "features."))]
)
def test_fedavg_shares_only_what_trains(data_root: Path, trainable: str, prefixes) -> None:  # type: ignore[no-untyped-def]
    cfg = _cfg(data_root, "fedavg", "resnet18_adapter", algorithm_params={"trainable": trainable})
    engine = build_engine(cfg)
    task, result = _update(engine)
    net = engine.algorithm.model_spec()
    want = set(net.head_keys()) | (set(net.adapter_keys()) if trainable == "adapters" else set())
    assert set(task.payload) == set(result.upload) == want
    assert all(k.startswith(prefixes) for k in result.upload)
    assert any(not torch.equal(result.upload[k], task.payload[k]) for k in want)
    engine.run()  # aggregation of the partial state


def test_local_keeps_only_what_trains(data_root: Path) -> None:
    cfg = _cfg(data_root, "local", "vit_s16_adapter", algorithm_params={"trainable": "head"})
    engine = build_engine(cfg)
    assert set(engine.client_states[0]) == {"head.weight", "head.bias"}
    engine.run()
    assert set(engine.client_states[2]) == {"head.weight", "head.bias"}


def test_adapter_training_needs_an_adapter_model(data_root: Path) -> None:
    cfg = _cfg(
        data_root,
        "fedavg",
        "cnn_fmnist",
        model_params={},
        algorithm_params={"trainable": "adapters"},
    )
    with pytest.raises(ConfigError, match="algorithm_params.trainable"):
        build_engine(cfg)


def test_pretrained_weights_load_from_a_file_and_bad_input_is_named(tmp_path: Path) -> None:
    from flcore.models.adapters import _narrow_resnet

    torch.manual_seed(3)
    backbone = _narrow_resnet(16)
    path = tmp_path / "backbone.pt"
    torch.save(backbone.state_dict(), path)
    model = build_model(
        "resnet18_adapter", num_classes=10, in_channels=1, tiny=True, pretrained=str(path)
    )
    conv1 = model.features[1]
    assert torch.equal(conv1.weight, backbone.conv1.weight)
    with pytest.raises(ConfigError, match="no weights file"):
        build_model("resnet18_adapter", num_classes=10, in_channels=1, pretrained="/nope.pt")
    with pytest.raises(ConfigError, match="model_params.depth"):
        validate_config({"model": "resnet18_adapter", "model_params": {"depth": 3}})


def test_frozen_batchnorm_stays_in_eval_mode_while_training() -> None:
    model = build_model("resnet18_adapter", num_classes=10, in_channels=3, tiny=True)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    before = bns[0].running_mean.clone()
    model(torch.randn(4, 3, 32, 32))
    assert torch.equal(bns[0].running_mean, before)
