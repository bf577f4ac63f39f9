"""CENTAUR: Shen, Ye, Kang, Hassani & Shokri, "Share Your Representation Only: Guaranteed
Improvement of the Privacy-Utility Tradeoff in Federated Learning", ICLR 2023, adapted to
ISRL-DP as in HyperFL (Guo et al., AAAI 2025, appendix D.1).

Each client's model is the shared representation ``phi`` (the network's ``features``) followed
by its own classifier head ``h_i`` (``head``), which never leaves the client. In every round a
sampled client

1. starts from the server's ``phi`` and its own ``h_i``;
2. updates its head with ``phi`` frozen (``head_epochs`` epochs at ``head_lr``, default 0.1 as
   in HyperFL's authors' code: the paper's local classifier update);
3. updates ``phi`` with its head frozen (``local_epochs`` epochs: the local representation
   update) and uploads the new ``phi``.

The server averages the representations (``n_i``-weighted); only ``phi`` is sent and received.

Deviations, stated:
- ISRL-DP instead of the paper's user-level DP (as HyperFL's baselines): the representation
  update is DP-SGD at the client (Poisson sampling, per-sample clipping to ``privacy.clip``,
  Gaussian noise) rather than a clipped update noised by the server.
- Under ISRL-DP everything a client computes from its records that shapes its upload must be
  DP: the head (step 2) shapes the representation gradient (step 3), so by default the head is
  trained with DP-SGD too and the accountant composes ``(head_epochs + local_epochs) x
  ceil(n_i / B)`` steps per round (``dp_guarantee = isrl``; the noise is calibrated for those
  steps). ``personal_dp: false`` trains the head without noise, as the paper does: the upload's
  sensitivity is then unbounded, the run is tagged ``dp_guarantee = shared-only`` and reports
  ``epsilon = inf`` (no formal guarantee), with what the representation steps spent as
  ``epsilon_shared`` (by default ``epsilon_shared`` equals ``epsilon``).
- No private initialization phase: the paper's initialization targets its linear
  representation analysis; every client starts from the seeded initial network, as in the other
  deep baselines.
- ``accuracy`` is the personalized model (``phi`` after local training, then ``h_i``) on the
  client's own test set, as for every method here; ``accuracy_before`` is the received ``phi``
  with last round's ``h_i``. There is no global classifier, so ``global_accuracy`` is null.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from flcore.algorithms.base import (
    ALGORITHMS,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.fedavg import FedAvg

__all__ = ["Centaur"]


class CentaurParams(AlgorithmParams):
    head_epochs: int = Field(1, ge=0, description="epochs of local head training per round")
    head_lr: float = Field(0.1, gt=0, description="learning rate of the head epochs")
    personal_dp: bool = Field(
        True, description="train the head with DP-SGD too (false: dp_guarantee = shared-only)"
    )


@ALGORITHMS.register("centaur")
class Centaur(FedAvg):
    """A DP-trained shared representation with personal classifier heads."""

    name = "centaur"
    reports = (FedAvg.reports - {"global_accuracy"}) | {"epsilon_shared"}
    privacy_mechanisms = frozenset({"dpsgd"})
    requires_privacy = "dpsgd"
    Params = CentaurParams

    @classmethod
    def dp_epochs(cls, local_epochs: int, params: AlgorithmParams) -> int:
        assert isinstance(params, CentaurParams)
        return local_epochs + (params.head_epochs if params.personal_dp else 0)

    def dp_guarantee(self) -> str:
        if self.privacy is not None and not self.params.personal_dp:
            return "shared-only"
        return super().dp_guarantee()

    def init_server(self) -> None:
        super().init_server()
        self._features = self.model.feature_keys()

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        init = seeded((self.seed, 0x1417), self.model_spec).state_dict()  # the server's init
        return {k: init[k].clone() for k in self.model.head_keys()}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        state = self.model.state_dict()
        return {k: state[k] for k in self._features}

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        self.model.load_state_dict(self._mean.result(), strict=False)
        self._mean = None

    def global_model(self) -> None:
        return None  # a representation without a classifier

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The broadcast representation; the head is private (an unknown from its public
        initial value)."""
        from flcore.attacks.surface import ModelSurface

        model = self.model_spec().to(self.device)
        return ModelSurface(model, broadcast, unknowns=self.init_client_state(client_id))

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model()
        model.load_state_dict({**task.payload, **task.state})
        before = self.client_eval(task, model, data, before=True)
        p = self.params
        assert isinstance(p, CentaurParams)
        loss = float("nan")
        try:
            if p.head_epochs:  # 2. the head, representation frozen
                model.features.requires_grad_(False)
                head_opt = self.local_optimizer(model.head.parameters(), lr=p.head_lr)
                loss = self.train_local(
                    model,
                    data,
                    generator,
                    optimizer=head_opt,
                    epochs=p.head_epochs,
                    private=p.personal_dp,
                )
                model.features.requires_grad_(True)
            model.head.requires_grad_(False)  # 3. the representation, head frozen
            loss = self.train_local(model, data, generator, round=task.round)
        finally:
            model.requires_grad_(True)
        metrics: dict[str, Any] = {"train_loss": loss, **before}
        metrics |= self.client_eval(task, model, data)
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        upload = {k: v for k, v in state.items() if k.startswith("features.")}
        head = {k: v for k, v in state.items() if k.startswith("head.")}
        return ClientResult(task.client_id, len(data.train), upload, head, metrics)
