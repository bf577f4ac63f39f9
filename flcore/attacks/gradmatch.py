"""Gradient matching, the optimisation shared by DLG, IG and the tailored attack's second stage.

Independent reconstructions (one per attacked upload) are optimised together: the images and
the unknown private tensors carry a leading reconstruction axis, the surface's gradient is
``torch.func.vmap``-ed over it, and the losses are summed. The problems stay independent
(Adam's and the sign's updates are per coordinate), so batching changes the speed, not the
answer. Small convolutions run without oneDNN here: on 28x28 records its kernels are 5-7x
slower than PyTorch's own for the double backward (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.func import vmap

from flcore.attacks.surface import GradientSurface
from flcore.data import DatasetInfo

__all__ = [
    "Problem",
    "without_onednn",
    "cosine_distance",
    "l2_distance",
    "total_variation",
    "idlg_labels",
    "pixel_box",
    "to_unit",
]

TensorDict = dict[str, torch.Tensor]
Distance = Callable[[TensorDict, TensorDict], torch.Tensor]


@contextlib.contextmanager
def without_onednn() -> Iterator[None]:
    """PyTorch's own convolution kernels for the block (see the module doc)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


def cosine_distance(pred: TensorDict, target: TensorDict) -> torch.Tensor:
    """``1 - <pred, target> / (|pred| |target|)`` over all tensors jointly (Geiping et al.
    2020's matching loss)."""
    dot = sum((pred[k] * target[k]).sum() for k in target)
    pn = sum(pred[k].pow(2).sum() for k in target)
    tn = sum(target[k].pow(2).sum() for k in target)
    return 1 - dot / (pn.sqrt() * tn.sqrt() + 1e-12)


def l2_distance(pred: TensorDict, target: TensorDict) -> torch.Tensor:
    """Squared L2 distance over all tensors jointly (Zhu et al. 2019)."""
    return sum((pred[k] - target[k]).pow(2).sum() for k in target)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels, per leading index of ``[n, b, C, H, W]``."""
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    return dx + dy


def pixel_box(info: DatasetInfo, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds of valid pixels ``[0, 1]`` in normalised space, shaped ``[C, 1, 1]``."""
    mean = torch.tensor(info.mean, device=device).view(-1, 1, 1)
    std = torch.tensor(info.std, device=device).view(-1, 1, 1)
    return (0 - mean) / std, (1 - mean) / std


def to_unit(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """De-normalise to ``[0, 1]`` images (clamped: a pixel outside the range is not an image)."""
    mean = torch.tensor(info.mean, device=x.device).view(-1, 1, 1)
    std = torch.tensor(info.std, device=x.device).view(-1, 1, 1)
    return (x * std + mean).clamp(0, 1)


def idlg_labels(surface: GradientSurface, target: TensorDict) -> torch.Tensor | None:
    """iDLG (Zhao et al. 2020): with one record, the classifier bias's gradient is
    ``softmax - onehot``, negative only at the true class. None when the bias is not uploaded."""
    if surface.label_key is None:
        return None
    return target[surface.label_key].argmin().view(1)


@dataclass
class Problem:
    """``n`` independent reconstructions of ``b`` records each against one surface."""

    surface: GradientSurface
    targets: Sequence[TensorDict]  # one target gradient per reconstruction
    labels: torch.Tensor  # [n, b]
    shape: tuple[int, int, int]
    info: DatasetInfo
    device: torch.device
    seed: int = 0

    def __post_init__(self) -> None:
        # stacked over reconstructions, in whatever form the surface matches fastest
        self.prepared = self.surface.prepare_targets(
            [{k: v.to(self.device) for k, v in t.items()} for t in self.targets]
        )

    def initial(self) -> tuple[torch.Tensor, TensorDict]:
        """Random images (``N(0, 1)`` in normalised space, as Geiping et al.) and the unknowns at
        their public initial values, one copy per reconstruction, as leaf tensors."""
        n, b = self.labels.shape
        g = torch.Generator().manual_seed(self.seed)
        x = torch.randn((n, b, *self.shape), generator=g).to(self.device).requires_grad_(True)
        unknowns = {
            k: v.to(self.device).expand(n, *v.shape).clone().requires_grad_(True)
            for k, v in self.surface.unknowns.items()
        }
        return x, unknowns

    def loss(
        self, x: torch.Tensor, unknowns: TensorDict, distance: Distance, tv: float
    ) -> torch.Tensor:
        """The summed matching loss of all reconstructions (plus ``tv`` x total variation)."""
        match = self.surface.match

        def one(u: TensorDict, xi: torch.Tensor, yi: torch.Tensor, ti: TensorDict) -> torch.Tensor:
            return match(u, xi, yi, ti, distance)

        total = vmap(one)(unknowns, x, self.labels, self.prepared)
        if tv:
            total = total + tv * total_variation(x)
        return total.sum()
