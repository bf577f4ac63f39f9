"""Ditto: Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021.

Every client k keeps a personal model v_k beside the global model w. In round t a sampled client,
as in the paper's Algorithm 1,

1. trains the global model as FedAvg does: E local epochs of SGD on F_k from w^t, giving w_k^t,
   which it uploads (the server averages them, ``n_k``-weighted, into w^{t+1});
2. trains its personal model on the personal objective

       h_k(v; w^t) = F_k(v) + (lambda / 2) ||v - w^t||^2,

   whose gradient is grad F_k(v) + lambda (v - w^t), anchored at the received w^t (not at the
   w_k^t of step 1), from last round's v_k.

Choices where the paper is silent, and deviations, stated:
- Order and epochs: the global step first, then the personal step, as Algorithm 1 lists them;
  the personal step runs E epochs too (the paper's "s local iterations"; Pa3dFL trains every
  method E = 5 epochs), with the same configured optimizer (SGD, momentum, weight decay, the
  per-round lr decay) and lr; the proximal term is added to the loss (a ``loss_fn`` hook).
- v_k starts as the server's seeded initial model w^0 (the authors' code initialises the
  personal models from the same initial weights); it is the client's private state, kept by
  the engine, never uploaded.
- ``accuracy`` is v_k after this round's personal step on the client's own test set and
  ``accuracy_before`` v_k at the start of the round (the personal model is what Ditto deploys);
  ``global_accuracy`` is w on the global test set.
- Capacity-unaware: under a capacity setting both models have the narrowest client's width
  (Pa3dFL Sec. 6.1: "model sizes are limited by the lowest capacity").
- ``privacy.mechanism: dpsgd``: the global step runs DP-SGD and is what the accountant counts;
  the personal step reads the records without noise, but nothing it computes reaches the upload
  (w_k^t does not depend on v_k) nor leaves the client, so the upload keeps FedAvg's ISRL-DP
  guarantee. Pa3dFL's Table 7 (FMNIST): lr 0.05, lambda 1.0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from flcore.algorithms.base import (
    ALGORITHMS,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    VectorJob,
    seeded,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.training import LossFn

__all__ = ["Ditto", "DittoParams", "proximal_loss"]


class DittoParams(AlgorithmParams):
    lam: float = Field(
        1.0,
        ge=0,
        description="lambda of the personal objective F_k(v) + lambda/2 ||v - w||^2 "
        "(Pa3dFL Table 7, FMNIST: 1.0)",
    )


def proximal_loss(anchor: dict[str, torch.Tensor], lam: float) -> LossFn:
    """Cross-entropy plus ``lam / 2 * ||theta - anchor||^2`` over the parameters named in
    ``anchor`` (Ditto's personal objective h_k); the anchor is a constant."""
    fixed = {k: v.detach() for k, v in anchor.items()}

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(model(x), y)
        if lam == 0:
            return ce
        sq = sum((p - fixed[k]).pow(2).sum() for k, p in model.named_parameters() if k in fixed)
        return ce + 0.5 * lam * sq

    return loss


@ALGORITHMS.register("ditto")
class Ditto(FedAvg):
    """FedAvg on the global model plus a proximally regularised personal model per client."""

    name = "ditto"
    privacy_mechanisms = frozenset({"dpsgd"})
    Params = DittoParams
    vectorized = True

    def vector_job(self, task: ClientTask) -> VectorJob:
        """The global model's FedAvg training, then the personal model's from the client's
        state, anchored at the received w^t and never noised (it is not released)."""
        lr = self.training.lr_at(task.round)
        personal = VectorJob(
            start=task.state,
            lr=lr,
            prox_mu=self.params.lam,  # type: ignore[attr-defined]
            anchor=task.payload,
            private=False,
        )
        return VectorJob(start=task.payload, lr=lr, then=personal)

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        init = seeded((self.seed, 0x1417), self.model_spec).state_dict()  # w^0
        return {k: v.clone() for k, v in init.items()}

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, DittoParams)
        model = self.client_model()
        # 1. the global model: FedAvg's local solver from w^t; its result is the upload
        model.load_state_dict(task.payload)
        loss = self.train_local(model, data, generator, round=task.round)
        state = model.state_dict()
        upload = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        # 2. the personal model v_k, anchored at the received w^t
        model.load_state_dict(task.state)
        metrics: dict[str, Any] = self.client_eval(task, model, data, before=True)
        opt = self.local_optimizer(model.parameters(), round=task.round)
        anchor = {k: v.to(self.device) for k, v in task.payload.items()}
        self.run_epochs(model, data, opt, generator, loss_fn=proximal_loss(anchor, p.lam))
        metrics["train_loss"] = loss  # the global step's, as FedAvg reports it
        metrics |= self.client_eval(task, model, data)
        personal = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, personal, metrics)
