"""Width-scalable versions of Pa3dFL's CNNs (Wang et al., Appendix D.2, Table 4).

Every hidden channel count C becomes ``C x width``; the input channels and the head's classes stay.
``width`` must give whole channel counts (the capacity width rule gives multiples of ``p_min``,
and flcore.capacity checks ``p_min`` against :attr:`ScalableModel.FULL_CHANNELS`).

Table 4, as built here:

- ``pa3dfl_cnn_fmnist`` (1.73M parameters at width 1): conv 1->32 k5 pad 2, max-pool 2, ReLU;
  conv 32->64 k5 pad 2, max-pool 2, ReLU; fc 3136->512, ReLU; fc 512->128, ReLU; head 128->10.
- ``pa3dfl_cnn_cifar100``: conv 3->64 k5, max-pool 2, ReLU; conv 64->64 k5, max-pool 2, ReLU;
  fc 1600->384, ReLU; fc 384->192, ReLU; head 192->100.

Table 4 lists a ReLU after the last layer too ("(128,10), relu"); logits through a ReLU cannot be
negative, and FLGo's CNNs, which the paper cites for these models, have none: the head here is a
plain linear layer. ``cnn_fmnist`` (HyperFL's CNN) is a different network and is left as it is.

:meth:`ScalableModel.channel_axes` says, for every state tensor, which axes are indexed by which
layer's channels (and with what block size: the first fully-connected layer reads each conv
channel as a block of 7x7 or 5x5 inputs), so the width-slicing algorithms (HeteroFL, FjORD,
FedRolex) can cut any width, or any window of channels, out of the full model.

``pa3dfl_cnn_fmnist_sbn`` and ``pa3dfl_cnn_cifar100_sbn`` are the same networks with HeteroFL's
static batch normalisation (Diao et al. 2021, Sec. 3.2): a ``BatchNorm`` after each hidden layer
(conv1, conv2, fc1, fc2), before its pooling and activation, that keeps no running statistics
(``track_running_stats=False``: training normalises with the batch's own statistics). Its affine
weight and bias are cut with the layer's channels. Evaluation computes the statistics from
training records first (:func:`flcore.algorithms.training.static_bn`). Pa3dFL's Table 4 lists no
normalisation; a HeteroFL baseline built on FLGo (found by code search; its CIFAR CNNs match
Table 4's) puts a non-tracking BatchNorm after every Scaler, which is why these variants exist:
on the BN-free networks HeteroFL's Scaler diverges at Table 7's Hetero learning rate.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from flcore.models.base import MODELS, SplitModel

__all__ = [
    "ScalableModel",
    "ScalableCNNFashionMNIST",
    "ScalableCNNCifar100",
    "ScalableCNNFashionMNISTStaticBN",
    "ScalableCNNCifar100StaticBN",
    "scaled",
]


def scaled(channels: int, width: float) -> int:
    """``channels x width`` as a whole channel count.

    Raises:
        ValueError: the product is not a whole, positive number of channels.
    """
    c = channels * width
    n = round(c)
    if n < 1 or abs(c - n) > 1e-6:
        raise ValueError(
            f"width {width:g} gives {c:g} of {channels} channels: widths must give whole, "
            "nonzero channel counts (use a multiple of the capacity's p_min)"
        )
    return n


class ScalableModel(SplitModel):
    """A :class:`SplitModel` whose hidden channel counts scale with ``width``."""

    #: full-width channel count of each scaled layer (its output channels)
    FULL_CHANNELS: ClassVar[dict[str, int]] = {}
    #: state key -> ((axis, layer whose channels index it, block size), ...)
    CHANNEL_AXES: ClassVar[dict[str, tuple[tuple[int, str, int], ...]]] = {}
    #: BatchNorm without running statistics (HeteroFL's static BN): a single record cannot
    #: pass through it in training mode, so the leakage evaluation refuses such a model
    STATIC_BN: ClassVar[bool] = False

    width: float

    @classmethod
    def channel_axes(cls) -> dict[str, tuple[tuple[int, str, int], ...]]:
        """Per state key, the axes cut by width: (axis, channel layer, block size)."""
        return dict(cls.CHANNEL_AXES)


def _axes(
    conv1: str, conv2: str, fc1: str, fc2: str, block: int, at: tuple[int, ...] = (0, 3, 7, 9)
) -> dict:
    """The channel axes of the four hidden layers at ``features`` indices ``at``."""
    i1, i2, i3, i4 = at
    return {
        f"features.{i1}.weight": ((0, conv1, 1),),
        f"features.{i1}.bias": ((0, conv1, 1),),
        f"features.{i2}.weight": ((0, conv2, 1), (1, conv1, 1)),
        f"features.{i2}.bias": ((0, conv2, 1),),
        f"features.{i3}.weight": ((0, fc1, 1), (1, conv2, block)),
        f"features.{i3}.bias": ((0, fc1, 1),),
        f"features.{i4}.weight": ((0, fc2, 1), (1, fc1, 1)),
        f"features.{i4}.bias": ((0, fc2, 1),),
        "head.weight": ((1, fc2, 1),),
    }


#: features indices of the hidden layers and of their BatchNorms in the static-BN variants
_SBN_LAYERS = (0, 4, 9, 12)
_SBN_NORMS = (1, 5, 10, 13)


def _sbn_axes(names: tuple[str, str, str, str], block: int) -> dict:
    axes = _axes(*names, block, at=_SBN_LAYERS)
    for layer, i in zip(names, _SBN_NORMS, strict=True):
        axes[f"features.{i}.weight"] = ((0, layer, 1),)
        axes[f"features.{i}.bias"] = ((0, layer, 1),)
    return axes


def _sbn_features(
    in_channels: int, channels: tuple[int, int, int, int], kernel: int, pad: int, side: int
) -> nn.Sequential:
    """Table 4's CNN body with a non-tracking BatchNorm after each hidden layer."""
    c1, c2, h1, h2 = channels

    def bn(kind: type[nn.Module], c: int) -> nn.Module:
        return kind(c, momentum=None, track_running_stats=False)

    return nn.Sequential(
        nn.Conv2d(in_channels, c1, kernel_size=kernel, padding=pad),  # 0
        bn(nn.BatchNorm2d, c1),  # 1
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Conv2d(c1, c2, kernel_size=kernel, padding=pad),  # 4
        bn(nn.BatchNorm2d, c2),  # 5
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c2 * side * side, h1),  # 9
        bn(nn.BatchNorm1d, h1),  # 10
        nn.ReLU(),
        nn.Linear(h1, h2),  # 12
        bn(nn.BatchNorm1d, h2),  # 13
        nn.ReLU(),
    )


@MODELS.register("pa3dfl_cnn_fmnist")
class ScalableCNNFashionMNIST(ScalableModel):
    """Pa3dFL's Fashion-MNIST CNN (Table 4) at ``width``; 28x28 inputs."""

    FULL_CHANNELS: ClassVar[dict[str, int]] = {"conv1": 32, "conv2": 64, "fc1": 512, "fc2": 128}
    CHANNEL_AXES: ClassVar[dict[str, tuple[tuple[int, str, int], ...]]] = _axes(
        "conv1", "conv2", "fc1", "fc2", 7 * 7
    )

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: float = 1.0) -> None:
        super().__init__()
        self.width = width
        c1, c2, h1, h2 = (scaled(c, width) for c in self.FULL_CHANNELS.values())
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5, padding=2),  # 0
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(c1, c2, kernel_size=5, padding=2),  # 3
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(c2 * 7 * 7, h1),  # 7
            nn.ReLU(),
            nn.Linear(h1, h2),  # 9
            nn.ReLU(),
        )
        self.head = nn.Linear(h2, num_classes)


@MODELS.register("pa3dfl_cnn_cifar100")
class ScalableCNNCifar100(ScalableModel):
    """Pa3dFL's CIFAR-100 CNN (Table 4) at ``width``; 32x32 inputs."""

    FULL_CHANNELS: ClassVar[dict[str, int]] = {"conv1": 64, "conv2": 64, "fc1": 384, "fc2": 192}
    CHANNEL_AXES: ClassVar[dict[str, tuple[tuple[int, str, int], ...]]] = _axes(
        "conv1", "conv2", "fc1", "fc2", 5 * 5
    )

    def __init__(self, num_classes: int = 100, in_channels: int = 3, width: float = 1.0) -> None:
        super().__init__()
        self.width = width
        c1, c2, h1, h2 = (scaled(c, width) for c in self.FULL_CHANNELS.values())
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5),  # 0
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(c1, c2, kernel_size=5),  # 3
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(c2 * 5 * 5, h1),  # 7
            nn.ReLU(),
            nn.Linear(h1, h2),  # 9
            nn.ReLU(),
        )
        self.head = nn.Linear(h2, num_classes)


class _StaticBNCNN(ScalableModel):
    """Table 4's CNN (``PAD``, ``SIDE``: conv padding, feature-map side before fc1) with a
    static BatchNorm after each hidden layer."""

    STATIC_BN = True
    PAD: ClassVar[int] = 0
    SIDE: ClassVar[int] = 0

    def __init__(self, num_classes: int, in_channels: int, width: float = 1.0) -> None:
        super().__init__()
        self.width = width
        c1, c2, h1, h2 = (scaled(c, width) for c in self.FULL_CHANNELS.values())
        self.features = _sbn_features(in_channels, (c1, c2, h1, h2), 5, self.PAD, self.SIDE)
        self.head = nn.Linear(h2, num_classes)


@MODELS.register("pa3dfl_cnn_fmnist_sbn")
class ScalableCNNFashionMNISTStaticBN(_StaticBNCNN):
    """:class:`ScalableCNNFashionMNIST` with static BatchNorm after each hidden layer."""

    FULL_CHANNELS = ScalableCNNFashionMNIST.FULL_CHANNELS
    CHANNEL_AXES: ClassVar[dict[str, tuple[tuple[int, str, int], ...]]] = _sbn_axes(
        ("conv1", "conv2", "fc1", "fc2"), 7 * 7
    )
    PAD, SIDE = 2, 7

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: float = 1.0) -> None:
        super().__init__(num_classes, in_channels, width)


@MODELS.register("pa3dfl_cnn_cifar100_sbn")
class ScalableCNNCifar100StaticBN(_StaticBNCNN):
    """:class:`ScalableCNNCifar100` with static BatchNorm after each hidden layer."""

    FULL_CHANNELS = ScalableCNNCifar100.FULL_CHANNELS
    CHANNEL_AXES: ClassVar[dict[str, tuple[tuple[int, str, int], ...]]] = _sbn_axes(
        ("conv1", "conv2", "fc1", "fc2"), 5 * 5
    )
    PAD, SIDE = 0, 5

    def __init__(self, num_classes: int = 100, in_channels: int = 3, width: float = 1.0) -> None:
        super().__init__(num_classes, in_channels, width)
