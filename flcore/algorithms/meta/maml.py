"""MAML's two loops as functions of a parameter dict (torch.func), shared by the meta family.

Finn, Abbeel & Levine, "Model-Agnostic Meta-Learning for Fast Adaptation of Deep Networks", ICML
2017; as LoDMeta writes it (Algorithm 2, lines 4-9): from the meta-parameter w, K steps of SGD at
step size alpha on the support set give ``u_K(w)``; the meta-gradient is the gradient in w of
the query loss at ``u_K(w)``. Second order differentiates through the K steps (the inner
gradients keep their graph); first order (FOMAML, Nichol et al. 2018) treats them as
constants, so the meta-gradient is the query gradient at ``u_K``.

The model is called with :func:`torch.func.functional_call`, so one network serves every
client and the parameters it holds are never written.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from flcore.data import ArrayDataset, DatasetInfo, normalize

__all__ = ["adapt", "adapted_accuracy", "meta_gradient", "tensors"]

Params = dict[str, torch.Tensor]


def tensors(
    data: ArrayDataset, info: DatasetInfo, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole (small) set as normalised images and labels on ``device``."""
    return normalize(data.images, info).to(device), data.labels.to(device)


def _loss(
    model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    return F.cross_entropy(functional_call(model, dict(params), (x,)), y)


def adapt(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    create_graph: bool,
) -> Params:
    """``steps`` full-batch SGD steps at ``lr`` on ``(x, y)`` from ``params``. With
    ``create_graph`` the result stays differentiable in ``params`` through the inner gradients
    (second order); without, each inner gradient is a constant."""
    u = dict(params)
    for _ in range(steps):
        grads = torch.autograd.grad(
            _loss(model, u, x, y), list(u.values()), create_graph=create_graph
        )
        u = {k: p - lr * g for (k, p), g in zip(u.items(), grads, strict=True)}
    return u


def meta_gradient(
    model: nn.Module,
    w: Mapping[str, torch.Tensor],
    support: tuple[torch.Tensor, torch.Tensor],
    query: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    lr: float,
    first_order: bool,
) -> tuple[Params, float]:
    """The meta-gradient at ``w`` (detached, one tensor per parameter) and the query loss at
    ``u_K(w)``."""
    leaf = {k: v.detach().requires_grad_(True) for k, v in w.items()}
    u = adapt(model, leaf, *support, steps=steps, lr=lr, create_graph=not first_order)
    loss = _loss(model, u, *query)
    grads = torch.autograd.grad(loss, list(leaf.values()))
    return {k: g.detach() for k, g in zip(leaf, grads, strict=True)}, float(loss.detach())


def adapted_accuracy(
    model: nn.Module,
    w: Mapping[str, torch.Tensor],
    support: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    lr: float,
) -> float:
    """Algorithm 3: adapt ``w`` with ``steps`` SGD steps on the support set, then the accuracy
    on ``test`` (one batch: CONV4's batch statistics are the test batch's, as in MAML)."""
    leaf = {k: v.detach().requires_grad_(True) for k, v in w.items()}
    u = adapt(model, leaf, *support, steps=steps, lr=lr, create_graph=False)
    with torch.no_grad():
        x, y = test
        pred = functional_call(model, {k: v.detach() for k, v in u.items()}, (x,)).argmax(1)
    return float((pred == y).float().mean())
