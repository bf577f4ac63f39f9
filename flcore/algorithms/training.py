"""Local training and evaluation loops shared by every algorithm.

Algorithms differ by hooks, not by copies of this loop: ``loss_fn`` adds terms (FedProx,
FedHKD), ``backward`` replaces the gradient computation (DP-SGD's per-sample clipping),
``params`` chooses what trains (HyperFL's two steps, LG-FedAvg's parts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from flcore.data import ArrayDataset, DatasetInfo, conv_layout, normalize

__all__ = [
    "batches",
    "make_optimizer",
    "train_epochs",
    "evaluate",
    "static_bn",
    "static_bn_layers",
    "LossFn",
    "BackwardFn",
]

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
BackwardFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, LossFn], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default loss: mean cross-entropy of the model's logits."""
    return F.cross_entropy(model(x), y)


def standard_backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn
) -> torch.Tensor:
    """Fill ``.grad`` with the mini-batch gradient; returns the (detached) loss."""
    loss = loss_fn(model, x, y)
    loss.backward()
    return loss.detach()


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Shuffled index batches over ``n`` samples; the last batch may be smaller (as DataLoader)."""
    order = torch.randperm(n, generator=generator)
    yield from order.split(batch_size)


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    name: str,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """The local optimizer; a fresh one each round, as in the papers' code.

    PyTorch's fused kernels are used (one pass over each tensor for decay, momentum and update):
    the same arithmetic, and on CPU about 6x faster than the per-tensor loop over HyperFL's
    15M hypernetwork parameters (BENCHMARKS.md).
    """
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    raise ValueError(f"unknown optimizer {name!r}; known: adam, sgd")


def train_epochs(
    model: nn.Module,
    data: ArrayDataset,
    info: DatasetInfo,
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    batch_size: int,
    generator: torch.Generator,
    loss_fn: LossFn = cross_entropy,
    backward: BackwardFn = standard_backward,
    sampler: Callable[[int, int, torch.Generator], Iterator[torch.Tensor]] = None,  # type: ignore[assignment]
    max_grad_norm: float | None = None,
    device: torch.device | None = None,
) -> float:
    """Train ``model`` for ``epochs`` passes over ``data``; returns the mean training loss.

    ``sampler(n, batch_size, generator)`` yields one epoch of index batches (default: a
    shuffled pass, as a DataLoader); DP-SGD swaps in Poisson sampling and its ``backward``.
    """
    sampler = sampler or batches
    device = device or torch.device("cpu")
    x_all = conv_layout(normalize(data.images, info).to(device), device)
    y_all = data.labels.to(device)
    model.train()
    total, steps = torch.zeros((), device=device), 0
    for _ in range(epochs):
        for idx in sampler(len(y_all), batch_size, generator):
            idx = idx.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = backward(model, x_all[idx], y_all[idx], loss_fn)
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            total += loss
            steps += 1
    return float(total) / max(steps, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ArrayDataset,
    info: DatasetInfo,
    *,
    batch_size: int = 1000,
    device: torch.device | None = None,
) -> tuple[float, float]:
    """Accuracy in [0, 1] and mean cross-entropy of ``model`` on ``data``."""
    device = device or torch.device("cpu")
    model.eval()
    correct, loss_sum, n = 0, 0.0, len(data.labels)
    if n == 0:
        return float("nan"), float("nan")
    for start in range(0, n, batch_size):
        x = conv_layout(normalize(data.images[start : start + batch_size], info).to(device), device)
        y = data.labels[start : start + batch_size].to(device)
        logits = model(x)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    return correct / n, loss_sum / n


def static_bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers that keep no running statistics (static BN)."""
    return [
        m
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.track_running_stats
    ]


@contextmanager
def static_bn(
    model: nn.Module,
    data: ArrayDataset,
    info: DatasetInfo,
    *,
    batch_size: int = 1000,
    device: torch.device | None = None,
) -> Iterator[None]:
    """HeteroFL's static batch normalisation (Diao et al. 2021, Sec. 3.2) for evaluation.

    Inside the context every BatchNorm of ``model`` that keeps no running statistics (it
    trains on each batch's own) holds statistics computed from ``data``: the cumulative mean
    over ``data``'s batches of the batch mean and variance, as ``torch.optim.swa_utils.update_bn``
    computes them (each layer sees the activations of the layers before it normalised with the
    batch's statistics, as in training). An evaluation in eval mode then uses them, so a test
    record's prediction does not depend on the other records of its batch. On exit the layers
    are as they were (no statistics, nothing added to the state dict). A model without such
    layers is left alone.
    """
    layers = static_bn_layers(model)
    n = len(data.labels)
    if not layers or n == 0:
        yield
        return
    if any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for m in model.modules()
    ):
        raise ValueError("static_bn: the model mixes static and tracking BatchNorm layers")
    if n < 2:
        raise ValueError("static batch normalisation needs at least 2 records, got 1")
    from torch.optim.swa_utils import update_bn

    device = device or torch.device("cpu")
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts[-1] -= 1  # no batch of one record (its variance is undefined)
    bounds = [*starts, n]
    for m in layers:
        ref = m.weight if m.weight is not None else next(model.parameters())
        m.track_running_stats = True
        m.running_mean = torch.zeros(m.num_features, device=ref.device, dtype=ref.dtype)
        m.running_var = torch.ones(m.num_features, device=ref.device, dtype=ref.dtype)
        m.num_batches_tracked = torch.tensor(0, dtype=torch.long, device=ref.device)
    was_training = model.training
    try:
        with torch.no_grad():
            update_bn(
                (
                    conv_layout(normalize(data.images[a:b], info).to(device), device)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                ),
                model,
            )
        yield
    finally:
        for m in layers:
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
            m.num_batches_tracked = None
        model.train(was_training)
