"""PPSGD: Bietti, Wei, Dudik, Langford & Wu, "Personalization Improves Privacy-Accuracy
Tradeoffs in Federated Learning", ICML 2022, adapted to ISRL-DP as in HyperFL (Guo et al.,
AAAI 2025, appendix D.1).

The paper's personalized model of client i combines a global part ``w`` and a local part
``theta_i``; we use its additive-offset form on every weight of the network,

    f_i(x) = f(x; w + theta_i).

At a step, with ``g`` the gradient at ``w + theta_i``, the global part moves by ``eta g`` and
the local part by ``alpha eta g``: ``alpha`` (the paper's personalization parameter) is the
ratio of the local to the global step size (``alpha = 0``: FedAvg on ``w`` alone). The server
averages the clients' global parts (``n_i``-weighted, as FedAvg); ``theta_i`` never leaves the
client.

Deviations, stated:
- ISRL-DP instead of the paper's user-level DP (as HyperFL's baselines): each client runs DP-SGD
  (Poisson sampling at ``q = B / n_i``, per-sample clipping, Gaussian noise) and several local
  epochs per round, rather than sending one clipped gradient per round to a noising server.
- Both parts step with the same private gradient (the gradient of ``w + theta_i`` is the same
  with respect to ``w`` and ``theta_i``), so the personal part is post-processing of DP-SGD's
  output: the run is fully ISRL-DP (``dp_guarantee = isrl``) at no extra privacy cost, and the
  accountant composes ``local_epochs x ceil(n_i / B)`` steps per round, as DP-FedAvg's.
- The paper's step (plain SGD) takes the configured optimizer's momentum and weight decay,
  each part with its own buffers, as HyperFL's setup does for every method.
- ``theta_i`` starts at 0, so the first round starts every client at the global model.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from flcore.algorithms.base import (
    ALGORITHMS,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.training import evaluate

__all__ = ["PPSGD"]


class PPSGDParams(AlgorithmParams):
    alpha: float = Field(
        1.0, ge=0, description="local-to-global step-size ratio (the paper's alpha)"
    )


class _AdditiveStep:
    """An optimizer facade over a model holding ``w + theta``: each step gives the model's
    gradient to two optimizers, one over ``w`` (lr) and one over ``theta`` (alpha x lr), then
    writes ``w + theta`` back into the model."""

    def __init__(
        self,
        model: nn.Module,
        w: dict[str, torch.Tensor],
        theta: dict[str, torch.Tensor],
        make: Any,
        alpha: float,
    ) -> None:
        self.named = [(k, p) for k, p in model.named_parameters()]
        self.w = {k: w[k].clone().requires_grad_(True) for k, _ in self.named}
        self.theta = {k: theta[k].clone().requires_grad_(True) for k, _ in self.named}
        self.opt_w = make(self.w.values())
        self.opt_theta = make(self.theta.values(), lr_scale=alpha) if alpha > 0 else None
        self._write()

    @torch.no_grad()
    def _write(self) -> None:
        for k, p in self.named:
            p.copy_(self.w[k] + self.theta[k])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.named:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for k, p in self.named:
            self.w[k].grad = None if p.grad is None else p.grad.clone()
            self.theta[k].grad = None if p.grad is None else p.grad.clone()
        self.opt_w.step()
        if self.opt_theta is not None:
            self.opt_theta.step()
        self._write()


@ALGORITHMS.register("ppsgd")
class PPSGD(FedAvg):
    """A DP-trained global model plus a per-client additive offset kept on the client."""

    name = "ppsgd"
    privacy_mechanisms = frozenset({"dpsgd"})
    requires_privacy = "dpsgd"
    Params = PPSGDParams

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(p) for k, p in self.model.named_parameters()}

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model()
        model.load_state_dict(task.payload)  # buffers (if any) follow the global model
        w = {k: v.detach() for k, v in task.payload.items()}
        step = _AdditiveStep(model, w, task.state, self.local_optimizer, self.params.alpha)
        loss = self.train_local(model, data, generator, optimizer=step)
        metrics = {"train_loss": loss}
        if task.evaluate:  # the personalized model w + theta_i, on the client's test set
            metrics["accuracy"], metrics["test_loss"] = evaluate(
                model, data.test, data.info, device=self.device
            )
        upload = {k: v.detach().to("cpu", copy=True) for k, v in task.payload.items()}
        for k, v in step.w.items():
            upload[k] = v.detach().to("cpu", copy=True)
        theta = {k: v.detach().to("cpu", copy=True) for k, v in step.theta.items()}
        return ClientResult(task.client_id, len(data.train), upload, theta, metrics)
