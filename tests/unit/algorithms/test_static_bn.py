"""HeteroFL's static batch normalisation: the ``*_sbn`` CNNs, ``training.static_bn`` and the
evaluation paths that use it (a client's own records; every client's records for the global
model), on real Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import flcore.algorithms.widths.heterofl  # noqa: F401  (registers)
from flcore.algorithms import ClientData, ClientTask
from flcore.algorithms.training import evaluate, static_bn, static_bn_layers
from flcore.config import validate_config
from flcore.data import ArrayDataset, conv_layout, normalize
from flcore.errors import ConfigError
from flcore.executor import client_generator, resolve_executor
from flcore.experiment import build_data, build_engine
from flcore.models import MODELS
from flcore.models.scalable import ScalableCNNFashionMNIST


def _cfg(data_root: Path, ratios: list[float], **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": "heterofl",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "pa3dfl_cnn_fmnist_sbn",
        "capacity": {"name": "fixed", "ratios": ratios},
        "num_clients": len(ratios),
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.05,
        "eval_every": 1,
        "workers": 1,
        "seed": 3,
    } | over
    return validate_config(raw)


@pytest.mark.parametrize("name", ["pa3dfl_cnn_fmnist_sbn", "pa3dfl_cnn_cifar100_sbn"])
def test_sbn_cnn_is_table_4_with_a_batchnorm_after_each_hidden_layer(name: str) -> None:
    in_ch = 1 if "fmnist" in name else 3
    full = MODELS.create(name, num_classes=10, in_channels=in_ch)
    plain = MODELS.create(name.removesuffix("_sbn"), num_classes=10, in_channels=in_ch)
    norms = static_bn_layers(full)
    assert [m.num_features for m in norms] == list(type(full).FULL_CHANNELS.values())
    assert next(full.buffers(), None) is None  # no running statistics in the state
    assert type(full).STATIC_BN and not type(plain).STATIC_BN
    # the same layers as Table 4's CNN plus each BatchNorm's affine weight and bias
    extra = sum(2 * m.num_features for m in norms)
    n_full = sum(p.numel() for p in full.parameters())
    assert n_full == sum(p.numel() for p in plain.parameters()) + extra
    # every width-scaled tensor is named in CHANNEL_AXES, and a width-1/4 model is the cut
    quarter = MODELS.create(name, num_classes=10, in_channels=in_ch, width=0.25)
    axes = type(full).CHANNEL_AXES
    for key, value in full.state_dict().items():
        small = quarter.state_dict()[key]
        cut = {axis for axis, _, _ in axes.get(key, ())}
        for axis in range(value.dim()):
            assert (small.shape[axis] < value.shape[axis]) == (axis in cut), (key, axis)


def _data(data_root: Path) -> tuple[ArrayDataset, ArrayDataset, object]:
    fed = build_data(_cfg(data_root, [1.0, 1.0], samples_per_client=400))
    return fed.client_train(0), fed.client_test(0), fed.info


def test_static_bn_statistics_are_the_training_records_and_leave_nothing_behind(
    data_root: Path,
) -> None:
    train, test, info = _data(data_root)
    torch.manual_seed(0)
    model = MODELS.create("pa3dfl_cnn_fmnist_sbn", num_classes=10, in_channels=1)
    keys = set(model.state_dict())
    x = conv_layout(normalize(train.images, info), torch.device("cpu"))  # as static_bn's
    first = model.features[0](x).detach()  # the first BatchNorm's input: conv1's output
    with static_bn(model, train, info, batch_size=1000):  # one batch: the exact statistics
        bn = model.features[1]
        # float32 sums over 313,600 values per channel: agree to 1e-3
        want_mean, want_var = first.double().mean((0, 2, 3)), first.double().var((0, 2, 3))
        assert torch.allclose(bn.running_mean.double(), want_mean, atol=1e-3)
        assert torch.allclose(bn.running_var.double(), want_var, rtol=1e-3)
        # a test record's prediction no longer depends on the rest of its batch
        model.eval()
        xt = normalize(test.images[:50], info)
        alone = torch.cat([model(xt[i : i + 1]) for i in range(5)])
        assert torch.allclose(model(xt)[:5], alone, atol=1e-5)
    assert set(model.state_dict()) == keys and next(model.buffers(), None) is None
    assert all(not m.track_running_stats for m in static_bn_layers(model))
    model.eval()  # without statistics, eval mode normalises with the batch again
    assert not torch.allclose(model(xt)[:5], alone, atol=1e-3)


def test_static_bn_never_makes_a_batch_of_one_and_refuses_what_it_cannot_do(
    data_root: Path,
) -> None:
    train, _, info = _data(data_root)
    model = MODELS.create("pa3dfl_cnn_fmnist_sbn", num_classes=10, in_channels=1)
    n = len(train.labels)
    with static_bn(model, train, info, batch_size=n - 1):  # would leave 1 record alone
        assert int(model.features[10].num_batches_tracked) == 2
    one = ArrayDataset(train.images[:1], train.labels[:1])
    with pytest.raises(ValueError, match="at least 2 records"), static_bn(model, one, info):
        pass
    mixed = nn.Sequential(model, nn.BatchNorm1d(10))
    with (
        pytest.raises(ValueError, match="mixes static and tracking"),
        static_bn(mixed, train, info),
    ):
        pass
    plain = ScalableCNNFashionMNIST()
    with static_bn(plain, one, info):  # no static BN: nothing to compute, nothing refused
        pass


def test_clients_are_evaluated_with_their_own_statistics_and_the_server_with_everyone_s(
    data_root: Path,
) -> None:
    engine = build_engine(_cfg(data_root, [1.0, 0.25]))
    alg, fed = engine.algorithm, engine.data
    data = ClientData(1, fed.client_train(1), fed.client_test(1), fed.info)
    task = ClientTask(1, 1, alg.broadcast(1, 1), None, True, 3)
    model = alg.client_model(0.5)
    model.load_state_dict(task.payload)
    got = alg.client_eval(task, model, data, before=True)["accuracy_before"]
    with static_bn(model, data.train, data.info):
        assert got == evaluate(model, data.test, data.info)[0]
    other = fed.client_train(0)
    with static_bn(model, other, data.info):
        assert evaluate(model, data.test, data.info)[0] != got or torch.equal(
            other.labels, data.train.labels
        )
    everyone = fed.clients_train_set()
    assert len(everyone.labels) == sum(len(fed.client_train(i).labels) for i in range(2))
    server = alg.evaluate_server(fed, {}, torch.device("cpu"))["global_accuracy"]
    full = alg.global_model()
    with static_bn(full, everyone, fed.info):
        assert server == evaluate(full, fed.global_test_set(), fed.info)[0]


def test_heterofl_with_static_bn_learns_and_is_refused_by_the_vectorized_executor(
    data_root: Path,
) -> None:
    """Three rounds at Table 7's Hetero lr 0.1 with widths down to 1/16: the global model
    (statistics from every client's records) learns and keeps learning (seeds 3, 4: 0.75 /
    0.74 after round 1, 0.81 / 0.79 after round 3; the BN-free CNN: 0.46 / 0.36, 0.66 / 0.50)."""
    over = {
        "partition": {"name": "iid"},
        "samples_per_client": 300,
        "local_epochs": 2,
        "client_fraction": 1.0,
        "lr": 0.1,
    }
    engine = build_engine(_cfg(data_root, [1.0, 0.25, 0.0625, 1.0], **over))
    accs = [r.metrics["global_accuracy"] for r in engine.iter_rounds()]
    assert len(accs) == 3 and accs[0] > 0.6 and accs[-1] > accs[0] and accs[-1] > 0.7, accs
    reason = engine.algorithm.vector_unsupported()
    assert reason is not None and "static BatchNorm" in reason
    with pytest.raises(ConfigError, match="static BatchNorm"):
        resolve_executor("vectorized", engine.algorithm, "cpu")


def test_heterofl_trains_every_client_with_batch_statistics(data_root: Path) -> None:
    """Training normalises each batch with its own statistics: a client's update is the same
    whatever its evaluation computed before it (evaluation leaves training bitwise alone)."""
    engine = build_engine(_cfg(data_root, [1.0, 0.25]))
    alg, fed = engine.algorithm, engine.data
    data = ClientData(1, fed.client_train(1), fed.client_test(1), fed.info)
    quiet = ClientTask(1, 1, alg.broadcast(1, 1), None, False, 3)
    loud = ClientTask(1, 1, alg.broadcast(1, 1), None, True, 3)
    a = alg.local_update(data, quiet, client_generator(3, 1, 1))
    b = alg.local_update(data, loud, client_generator(3, 1, 1))
    assert "accuracy_before" in b.metrics and "accuracy" in b.metrics
    for k, v in a.upload.items():
        assert torch.equal(v, b.upload[k]), k


def test_an_attack_on_a_static_bn_model_is_refused_before_any_work(data_root: Path) -> None:
    attack = {"name": "ig", "rounds": [1], "clients": [0], "images": 2, "iterations": 2}
    with pytest.raises(ConfigError, match="static BN"):
        _cfg(data_root, [1.0, 0.25], attack=attack)
    _cfg(data_root, [1.0, 0.25], attack=attack, model="pa3dfl_cnn_fmnist")  # without BN: fine


@pytest.mark.parametrize("algorithm", ["flanc", "pfedgate", "pa3dfl"])
def test_algorithms_that_rebuild_the_layers_refuse_a_static_bn_model(
    data_root: Path, algorithm: str
) -> None:
    import flcore.algorithms.widths.flanc  # noqa: F401  (registers)
    import flcore.algorithms.widths.pa3dfl  # noqa: F401
    import flcore.algorithms.widths.pfedgate  # noqa: F401

    with pytest.raises(ConfigError, match="no rule for BatchNorm"):
        _cfg(data_root, [1.0, 0.25], algorithm=algorithm)
    _cfg(data_root, [1.0, 0.25], algorithm=algorithm, model="pa3dfl_cnn_fmnist")  # without BN
