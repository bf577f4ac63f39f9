"""The CNNs of HyperFL's main configuration (Guo et al., AAAI 2025, appendix D.1).

Both follow the authors' public code (which follows FedPAC, Xu et al. 2023): LeakyReLU after every
conv and after the hidden fully-connected layer, max-pool 2x2 after each conv, and a 128-unit
representation read by a linear head. ``width`` scales every hidden channel count (1.0 is the
paper's network) so capacity-heterogeneous methods (Pa3dFL) can build narrower clients.
"""

from __future__ import annotations

from torch import nn

from flcore.models.base import MODELS, SplitModel

__all__ = ["CNNFashionMNIST", "CNNCifar"]


def _w(channels: int, width: float) -> int:
    return max(1, round(channels * width))


@MODELS.register("cnn_fmnist")
class CNNFashionMNIST(SplitModel):
    """28x28 inputs: conv 1->16 k5, conv 16->32 k5 pad 1, fc 800->128, fc 128->K."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, h = _w(16, width), _w(32, width), _w(128, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * 5 * 5, h),
            nn.LeakyReLU(),
        )
        self.head = nn.Linear(h, num_classes)


@MODELS.register("cnn_cifar")
class CNNCifar(SplitModel):
    """32x32 inputs: conv 3->16 k5, conv 16->32 k5 pad 1, conv 32->64 k3 pad 1, fc 576->128,
    fc 128->K."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: float = 1.0) -> None:
        super().__init__()
        c1, c2, c3, h = _w(16, width), _w(32, width), _w(64, width), _w(128, width)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, kernel_size=3, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c3 * 3 * 3, h),
            nn.LeakyReLU(),
        )
        self.head = nn.Linear(h, num_classes)
