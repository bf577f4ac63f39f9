"""FedHKD's networks on real Fashion-MNIST images: shapes, the normalised latent, the split."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flcore.data import DatasetSplits, normalize
from flcore.errors import ConfigError
from flcore.models import MODELS, SplitModel, build_model


def _gray(fmnist: DatasetSplits, n: int) -> torch.Tensor:
    return normalize(fmnist.test.images[:n], fmnist.info)


def _color32(fmnist: DatasetSplits, n: int) -> torch.Tensor:
    """Real FMNIST images padded to 32 x 32 and repeated to three channels, scaled to [0, 1]."""
    x = F.pad(fmnist.test.images[:n].float() / 255.0, (2, 2, 2, 2))
    return x.repeat(1, 3, 1, 1)


def test_fedhkd_cnn_represents_fmnist_as_a_standardised_32d_latent(fmnist: DatasetSplits) -> None:
    torch.manual_seed(0)
    model = build_model("fedhkd_cnn", num_classes=10, in_channels=1)
    x = _gray(fmnist, 64)

    model.train()
    h = model.represent(x)
    logits = model(x)

    assert h.shape == (64, 32) and logits.shape == (64, 10)
    # BatchNorm without scale or shift: in training h is v standardised by the batch's statistics
    v = model.features.project(model.features.backbone(x))
    eps = model.features.norm.eps
    expected = (v - v.mean(0)) / torch.sqrt(v.var(0, unbiased=False) + eps)
    assert torch.allclose(h, expected, atol=1e-4)
    assert torch.allclose(h.mean(0), torch.zeros(32), atol=1e-5)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["features.backbone.0.weight"] == (16, 1, 5, 5)
    assert shapes["features.backbone.3.weight"] == (32, 16, 5, 5)
    assert shapes["features.backbone.7.weight"] == (128, 800)
    assert shapes["features.project.weight"] == (32, 128)
    assert shapes["features.norm.running_var"] == (32,) and "features.norm.weight" not in shapes
    assert shapes["head.weight"] == (10, 32)
    model.eval()
    assert torch.allclose(model(x), model.head(model.represent(x)))


def test_fedhkd_cnn_takes_three_channel_32px_images(fmnist: DatasetSplits) -> None:
    model = build_model("fedhkd_cnn", num_classes=10, in_channels=3, latent_dim=16).eval()

    h = model.represent(_color32(fmnist, 8))

    assert h.shape == (8, 16) and model(_color32(fmnist, 8)).shape == (8, 10)
    assert model.state_dict()["features.backbone.7.weight"].shape == (128, 32 * 6 * 6)


@pytest.mark.parametrize(
    ("name", "latent", "stem"),
    [("fedhkd_shufflenet", 32, "conv1.0"), ("fedhkd_resnet18", 64, "conv1")],
)
def test_torchvision_backbones_run_on_32px_images(
    name: str, latent: int, stem: str, fmnist: DatasetSplits
) -> None:
    model = build_model(name, num_classes=10, in_channels=3)
    x = _color32(fmnist, 4)

    model.train()
    h_train = model.represent(x)
    model.eval()
    with torch.no_grad():
        h, logits = model.represent(x), model(x)

    assert h_train.shape == h.shape == (4, latent) and logits.shape == (4, 10)
    backbone = model.features.backbone
    conv = backbone.get_submodule(stem)
    assert conv.stride == (1, 1) and conv.in_channels == 3
    assert isinstance(backbone.maxpool, nn.Identity) and isinstance(backbone.fc, nn.Identity)
    assert model.head.in_features == latent and not model.features.norm.affine


@pytest.mark.parametrize(
    ("name", "in_channels"),
    [("fedhkd_cnn", 1), ("fedhkd_shufflenet", 3), ("fedhkd_resnet18", 3)],
)
def test_head_and_feature_keys_partition_the_state_dict(name: str, in_channels: int) -> None:
    model = build_model(name, num_classes=10, in_channels=in_channels)

    head, features = set(model.head_keys()), set(model.feature_keys())

    assert isinstance(model, SplitModel) and name in MODELS.names()
    assert head == {"head.weight", "head.bias"} and not head & features
    assert head | features == set(model.state_dict())


def test_a_one_sample_training_batch_uses_the_running_statistics(fmnist: DatasetSplits) -> None:
    model = build_model("fedhkd_cnn", num_classes=10, in_channels=1)
    x = _gray(fmnist, 33)
    model.train()
    model.represent(x[:32])  # moves the running estimates away from (0, 1)
    norm = model.features.norm
    mean, var = norm.running_mean.clone(), norm.running_var.clone()

    h_one = model.represent(x[32:])

    assert torch.equal(norm.running_mean, mean) and torch.equal(norm.running_var, var)
    model.eval()
    assert torch.allclose(h_one, model.represent(x[32:]), atol=1e-6)


def test_gradients_reach_the_backbone_through_the_normalised_latent(
    fmnist: DatasetSplits,
) -> None:
    model = build_model("fedhkd_cnn", num_classes=10, in_channels=1).train()

    F.cross_entropy(model(_gray(fmnist, 32)), fmnist.test.labels[:32]).backward()

    grads = [model.features.backbone[0].weight.grad, model.features.project.weight.grad]
    assert all(g is not None and float(g.abs().sum()) > 0 for g in grads)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"latent_dim": 0}, "model_params.latent_dim"),
        ({"image_size": 8}, "model_params.image_size"),
    ],
)
def test_bad_sizes_are_rejected_by_key(kwargs: dict[str, int], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build_model("fedhkd_cnn", num_classes=10, in_channels=1, **kwargs)
