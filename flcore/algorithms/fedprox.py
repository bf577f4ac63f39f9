"""FedProx: Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020.

FedAvg with a proximal local objective. A sampled client k starts from the global model w^t and
approximately minimises

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2,      grad h_k = grad F_k(w) + mu (w - w^t),

by E local epochs of the configured optimizer; the server averages the results as FedAvg does,
``w^{t+1} = sum_k n_k w_k^{t+1} / sum_k n_k``.

How, and the choices where the paper is silent, stated:
- The term is added as its gradient: right before every optimizer step, ``mu (w - w^t)`` is
  added to each trainable parameter's mini-batch gradient (an optimizer step pre-hook). That is
  the gradient of the loss above, so SGD, momentum, weight decay and Adam see exactly what a
  loss term would give them; doing it at the step (not in the loss) lets it compose with DP-SGD,
  whose backward computes per-sample cross-entropy gradients only. With a gradient-norm clip the
  clip would act before the term is added (FedAvg's local training clips nothing).
- ``mu = 0.5`` by default: FedHKD's setting (Chen & Vikalo, ICLR 2023, App. A.1, mu_prox).
- w^t is the broadcast the client starts the round from; the term covers the parameters that
  train (with ``trainable: head``, the head only), not buffers.
- Every client runs all E epochs: FedProx's tolerance of partial work (gamma-inexact solutions,
  stragglers) is not simulated; FedHKD runs FedProx so.
- ``train_loss`` is the mean cross-entropy, as FedAvg reports it (the proximal value is not in
  it), so it is comparable across the FedAvg variants.
- DP-SGD (``privacy.mechanism: dpsgd``): the proximal gradient depends on w and w^t only, never
  on a record, so adding it to the privatised gradient is post-processing: the upload keeps
  FedAvg's ISRL-DP guarantee and accounting. Client-level DP acts at aggregation and is
  FedAvg's unchanged.
- Attack surface: FedAvg's (the cross-entropy gradient at the broadcast). At w = w^t the
  proximal gradient is zero, so a one-step simulation is exact; over several steps the term
  pulls the upload back toward w^t, a shrinkage the pseudo-gradient does not model (as it does
  not model momentum).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from pydantic import Field
from torch import nn

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientTask, VectorJob
from flcore.algorithms.fedavg import FedAvg, FedAvgParams

__all__ = ["FedProx", "FedProxParams", "proximal_step_hook"]

StepPreHook = Callable[[torch.optim.Optimizer, Any, Any], None]


class FedProxParams(FedAvgParams):
    mu: float = Field(
        0.5,
        ge=0,
        description="mu of the proximal term (mu/2)||w - w^t||^2 (FedHKD App. A.1: 0.5)",
    )


def proximal_step_hook(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], mu: float
) -> StepPreHook:
    """An optimizer step pre-hook adding ``mu * (p - anchor)`` to each ``p.grad``, for
    ``(p, anchor)`` in ``pairs``: the gradient of ``(mu / 2) ||p - anchor||^2``."""

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            for p, anchor in pairs:
                step = (p - anchor).mul_(mu)
                if p.grad is None:
                    p.grad = step
                else:
                    p.grad.add_(step)

    return hook


@ALGORITHMS.register("fedprox")
class FedProx(FedAvg):
    """FedAvg whose local objective carries the proximal term (mu/2)||w - w^t||^2."""

    name = "fedprox"
    privacy_mechanisms = frozenset({"dpsgd", "client"})
    Params = FedProxParams
    vectorized = True

    def vector_job(self, task: ClientTask) -> VectorJob:
        return replace(super().vector_job(task), prox_mu=self.params.mu)  # type: ignore[attr-defined]

    def train_local(
        self,
        model: nn.Module,
        data: ClientData,
        generator: torch.Generator,
        *,
        optimizer: Any = None,
        epochs: int | None = None,
        private: bool = True,
        round: int | None = None,
    ) -> float:
        """FedAvg's local training with the proximal gradient added at every step, anchored
        at the weights ``model`` holds on entry (the broadcast w^t)."""
        mu = self.params.mu  # type: ignore[attr-defined]
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = optimizer or self.local_optimizer(trainable, round=round)
        pairs = [(p, p.detach().clone()) for p in trainable]
        handle = opt.register_step_pre_hook(proximal_step_hook(pairs, mu))
        try:
            return super().train_local(
                model, data, generator, optimizer=opt, epochs=epochs, private=private
            )
        finally:
            handle.remove()
