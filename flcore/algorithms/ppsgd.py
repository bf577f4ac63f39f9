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
- By default both parts step with the same private gradient (the gradient of ``w + theta_i``
  is the same with respect to ``w`` and ``theta_i``), so the personal part is post-processing of
  DP-SGD's output: the run is fully ISRL-DP (``dp_guarantee = isrl``) at no extra privacy cost,
  and the accountant composes ``local_epochs x ceil(n_i / B)`` steps per round, as DP-FedAvg's.
  The price: ``theta_i`` is never averaged, so it keeps ``alpha`` times every noised step
  (at sigma 10.6 its noise grows to the scale of the weights over a 200-round run).
- ``personal_dp: false`` is the paper's own local step: ``theta_i`` moves with the clean
  gradient of the same mini-batch ("local learning is perfectly private" under the paper's
  joint DP with a trusted server). Under ISRL-DP that makes the upload's sensitivity unbounded
  (``theta_i`` carries every record into the next private gradient), so such a run is tagged
  ``dp_guarantee = shared-only``: it reports ``epsilon = inf`` (there is no formal guarantee)
  and what the global part's DP-SGD steps spent as ``epsilon_shared`` (in the default mode
  ``epsilon_shared`` equals ``epsilon``: the private steps are everything). HyperFL's
  authors' code also trains its PPSGD's personal part without noise, so this is the privacy
  setting their Table 1 figure comes from; its structure differs, though: there the personal
  part is the classifier head alone (a clean step at lr 0.1) and the shared part the feature
  extractor alone (DP-SGD; the head is never uploaded), both stepped on every mini-batch: a
  FedRep-like split rather than Bietti et al.'s offset over the whole network, which we keep.
- The paper's step (plain SGD) takes the configured optimizer's momentum and weight decay,
  each part with its own buffers, as HyperFL's setup does for every method.
- ``theta_i`` starts at 0, so the first round starts every client at the global model.
"""

from __future__ import annotations

import functools
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
from flcore.privacy.dpsgd import DPSGD

__all__ = ["PPSGD"]


class PPSGDParams(AlgorithmParams):
    alpha: float = Field(
        1.0, ge=0, description="local-to-global step-size ratio (the paper's alpha)"
    )
    personal_dp: bool = Field(
        True,
        description="theta_i steps with the private gradient (false: the clean gradient, as "
        "in the paper; dp_guarantee = shared-only)",
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
        #: when set (by a backward hook), theta steps with these gradients instead of .grad
        self.theta_grads: dict[str, torch.Tensor] | None = None
        self.named = [(k, p) for k, p in model.named_parameters()]
        # on the model's device: the client's theta is kept on the CPU between rounds
        self.w = {k: w[k].to(p.device).clone().requires_grad_(True) for k, p in self.named}
        self.theta = {k: theta[k].to(p.device).clone().requires_grad_(True) for k, p in self.named}
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
            g = p.grad if self.theta_grads is None else self.theta_grads.get(k)
            self.theta[k].grad = None if g is None else g.clone()
        self.opt_w.step()
        if self.opt_theta is not None:
            self.opt_theta.step()
        self._write()


@ALGORITHMS.register("ppsgd")
class PPSGD(FedAvg):
    """A DP-trained global model plus a per-client additive offset kept on the client."""

    name = "ppsgd"
    reports = FedAvg.reports | {"epsilon_shared"}
    privacy_mechanisms = frozenset({"dpsgd"})
    requires_privacy = "dpsgd"
    Params = PPSGDParams

    def dp_guarantee(self) -> str:
        if self.privacy is not None and not self.params.personal_dp:
            return "shared-only"
        return super().dp_guarantee()

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(p) for k, p in self.model.named_parameters()}

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The client's network is ``w + theta_i``: ``w`` is broadcast, ``theta_i`` is private
        (an unknown offset starting from its public initial value, 0)."""
        from flcore.attacks.surface import ModelSurface

        model = self.model_spec().to(self.device)
        params = dict(model.named_parameters())
        start = {k: v for k, v in broadcast.items() if k in params}
        return ModelSurface(
            model,
            start,
            unknowns=self.init_client_state(client_id),
            offset=True,
            label_key="head.bias",
        )

    def _clean_then_private(self, step: _AdditiveStep, n: int, generator: torch.Generator):  # type: ignore[no-untyped-def]
        """DP-SGD's hooks, with the backward pass first taking the mini-batch's clean gradient
        for ``theta_i`` (the paper's local step). It is the same estimator as DP-SGD's without
        clipping and noise: the batch's summed gradient over the expected batch size ``q n``."""
        assert self.privacy is not None
        dp = DPSGD(self.privacy.noise_multiplier, self.privacy.clip, self.training.batch_size)
        private = dp.make_backward(n, generator)
        expected = dp.sample_rate(n) * n

        def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn):  # type: ignore[no-untyped-def]
            step.theta_grads = None
            if len(y):
                model.zero_grad(set_to_none=True)
                (loss_fn(model, x, y) * (len(y) / expected)).backward()
                step.theta_grads = {k: p.grad for k, p in model.named_parameters()}
                model.zero_grad(set_to_none=True)
            return private(model, x, y, loss_fn)

        return {"sampler": dp.batches, "backward": backward}

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model()
        model.load_state_dict(task.payload)  # buffers (if any) follow the global model
        w = {k: v.detach() for k, v in task.payload.items()}
        p = self.params
        assert isinstance(p, PPSGDParams)
        make = functools.partial(self.local_optimizer, round=task.round)
        step = _AdditiveStep(model, w, task.state, make, p.alpha)
        # the personalized model w + theta_i, before and after training
        metrics = self.client_eval(task, model, data, before=True)
        if p.personal_dp:
            loss = self.train_local(model, data, generator, optimizer=step)
        else:
            hooks = self._clean_then_private(step, len(data.train), generator)
            loss = self.run_epochs(model, data, step, generator, **hooks)
        metrics["train_loss"] = loss
        metrics |= self.client_eval(task, model, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in task.payload.items()}
        for k, v in step.w.items():
            upload[k] = v.detach().to("cpu", copy=True)
        theta = {k: v.detach().to("cpu", copy=True) for k, v in step.theta.items()}
        return ClientResult(task.client_id, len(data.train), upload, theta, metrics)
