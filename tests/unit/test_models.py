from __future__ import annotations

import torch

from flcore.models import MODELS, build_model


def test_fmnist_cnn_matches_the_paper_architecture() -> None:
    m = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {
        "features.0.weight": (16, 1, 5, 5),
        "features.0.bias": (16,),
        "features.3.weight": (32, 16, 5, 5),
        "features.3.bias": (32,),
        "features.7.weight": (128, 800),
        "features.7.bias": (128,),
        "head.weight": (10, 128),
        "head.bias": (10,),
    }
    x = torch.zeros(3, 1, 28, 28)
    assert m(x).shape == (3, 10) and m.represent(x).shape == (3, 128)
    assert m.head_keys() == ["head.weight", "head.bias"]


def test_cifar_cnn_matches_the_paper_architecture() -> None:
    m = build_model("cnn_cifar", num_classes=10, in_channels=3)
    assert m.state_dict()["features.10.weight"].shape == (128, 576)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_emnist_head_and_width() -> None:
    m = build_model("cnn_fmnist", num_classes=62, in_channels=1, width=0.5)
    assert m(torch.zeros(1, 1, 28, 28)).shape == (1, 62)
    assert m.state_dict()["features.0.weight"].shape[0] == 8
    assert set(MODELS.names()) >= {"cnn_fmnist", "cnn_cifar"}
