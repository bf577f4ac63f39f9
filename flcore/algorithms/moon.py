"""MOON: Li, He & Song, "Model-Contrastive Federated Learning", CVPR 2021.

FedAvg whose local objective adds a model-contrastive term. Client i, training w from the
global model w^t, with z = R_w(x), z_glob = R_{w^t}(x) and z_prev = R_{w_i^{prev}}(x) the
representations of a record under the model being trained, the received global model and the
client's own previous local model (the paper's local objective):

    l_con = -log(e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}))
    loss  = CE(head(z), y) + mu * l_con,          sim = cosine similarity,

averaged over the mini-batch; the server averages the uploaded models as FedAvg does.

Choices where the paper is silent, and deviations, stated:
- z is ``model.represent(x)``, the output of the model's ``features``: MOON's "projection head"
  output. With FedHKD's networks (``fedhkd_*``) that is the projected latent, as in FedHKD's
  code: one Linear layer and a BatchNorm without learned scale, to 32 or 64 dimensions, where
  MOON's code projects with Linear-ReLU-Linear to 256 (cosines on batch-standardised features
  behave otherwise); with ``cnn_fmnist`` it is the 128-unit hidden layer the head reads. The
  classifier reads the same z (MOON's networks put the projection head before the classifier).
- ``mu = 1``, ``tau = 0.5``: FedHKD's settings (App. A.1). One previous model (MOON's
  default buffer of 1).
- The previous model is the client's local model after its last participation: private client
  state, kept by the engine (so it survives checkpoints) and never uploaded. A client with no
  previous model (its first participation) uses the received global model as the negative:
  both logits are then equal for every z, so the term is the constant log 2 with zero gradient
  and that round is plain cross-entropy. MOON's code has no negative in the first round (its
  pool of previous models is empty: a cross-entropy over one logit, 0); the gradient is the
  same.
- The global and previous models run in eval mode (no batch-statistics update, no dropout) and
  without gradient, as in MOON's code; the trained model runs in train mode.
- ``train_loss`` is the mean cross-entropy, as FedAvg reports it (the contrastive term's value
  is left out), so it is comparable across the FedAvg variants.
- Privacy: client-level DP acts at aggregation and composes with any local objective, so it is
  FedAvg's unchanged. DP-SGD is not offered: its per-sample gradients are of the
  cross-entropy only and would silently drop the contrastive term.
- Attack surface: FedAvg's (the cross-entropy gradient at the broadcast). The contrastive
  term's gradient needs z_prev, the client's private previous model, which the simulation may
  not hold; in a client's first participation that term's gradient is zero, so a one-step
  simulation is then exact.
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
    seeded,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.training import LossFn

__all__ = ["Moon", "MoonParams", "model_contrastive_loss", "moon_loss"]


class MoonParams(AlgorithmParams):
    mu: float = Field(
        1.0,
        ge=0,
        description="weight mu of the model-contrastive term (FedHKD App. A.1: 1)",
    )
    tau: float = Field(
        0.5,
        gt=0,
        description="temperature tau of the model-contrastive term (FedHKD App. A.1: 0.5)",
    )


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float
) -> torch.Tensor:
    """MOON's l_con averaged over the batch: a two-way cross-entropy whose positive logit is
    ``cos(z, z_glob) / tau`` and whose negative one is ``cos(z, z_prev) / tau``."""
    pos = F.cosine_similarity(z, z_glob, dim=-1)
    neg = F.cosine_similarity(z, z_prev, dim=-1)
    logits = torch.stack([pos, neg], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


def moon_loss(glob: nn.Module, prev: nn.Module, mu: float, tau: float) -> LossFn:
    """The ``loss_fn`` hook: CE + mu * l_con; its value is the cross-entropy alone (the term
    enters the gradient only, see the module doc)."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = model.represent(x)  # type: ignore[operator]
        ce = F.cross_entropy(model.head(z), y)  # type: ignore[operator]
        with torch.no_grad():
            z_glob, z_prev = glob.represent(x), prev.represent(x)  # type: ignore[operator]
        term = mu * model_contrastive_loss(z, z_glob, z_prev, tau)
        return ce + (term - term.detach())  # value: CE; gradient: CE's + the term's

    return loss


@ALGORITHMS.register("moon")
class Moon(FedAvg):
    """FedAvg with MOON's model-contrastive term on the representation."""

    name = "moon"
    privacy_mechanisms = frozenset({"client"})
    Params = MoonParams

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        """No previous local model yet (see the module doc for what the first round uses)."""
        return {}

    def reference_models(self) -> tuple[nn.Module, nn.Module]:
        """The worker's two frozen networks (global, previous), reused across clients."""
        if getattr(self, "_reference", None) is None:
            nets = []
            for _ in range(2):
                net = seeded((self.seed, 0x1417), self.model_spec).to(self.device)
                net.requires_grad_(False)
                nets.append(net.eval())
            self._reference = (nets[0], nets[1])
        return self._reference

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, MoonParams)
        glob, prev = self.reference_models()
        glob.load_state_dict(task.payload)
        prev.load_state_dict(task.state or task.payload)
        model = self.client_model()
        model.load_state_dict(task.payload)
        metrics: dict[str, Any] = self.client_eval(task, model, data, before=True)
        opt = self.local_optimizer(model.parameters(), round=task.round)
        metrics["train_loss"] = self.run_epochs(
            model, data, opt, generator, loss_fn=moon_loss(glob, prev, p.mu, p.tau)
        )
        metrics |= self.client_eval(task, model, data)
        state = model.state_dict()
        upload = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        kept = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        return ClientResult(task.client_id, len(data.train), upload, kept, metrics)
