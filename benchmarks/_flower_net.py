"""The CNN of the Flower comparison (HyperFL's FMNIST network written plainly), shared by
flower_baseline.py, which runs in Flower's own venv, and worker_env.py: torch only."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Net"]


class Net(nn.Module):
    """conv 1->16 k5, conv 16->32 k5 p1, fc 800->128->10, LeakyReLU, max-pool after each conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=5)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=5, padding=1)
        self.fc1 = nn.Linear(800, 128)
        self.fc2 = nn.Linear(128, 10)
        self.act = nn.LeakyReLU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.conv1(x)))
        x = self.pool(self.act(self.conv2(x)))
        return self.fc2(self.act(self.fc1(torch.flatten(x, 1))))
