"""L2C: Li, Shen, Yin & Tao, "Learning to Collaborate in Decentralized Learning of Personalized
Models", CVPR 2022; LoDMeta's decentralized gossip baseline (Yang & Kwok, Sec. 5.1).

Every client keeps its own model and, every round, talks to its graph neighbours (gossip: every
client is active each round). Client i mixes its neighbours' latest models with its own,
``w_i = sum_j alpha_ij w_j`` over ``j in N(i) + {i}``, ``alpha_i = softmax(beta_i)``; it learns
``beta_i`` by a gradient step on its validation loss at the mixed model (the paper's
"learning to collaborate"); after ``prune_after`` rounds it keeps only its ``top_k`` neighbours
by weight (the paper's sparsification at T_0). It then trains the mixed model locally and sends
the result to its neighbours.

Choices, stated:
- The few-shot client's support set is its training data and its query set its validation data
  (the set the mixing weights are learnt on); ``local_steps`` full-batch SGD steps at
  ``inner_lr``; one step on beta a round at ``mix_lr``; beta starts at 0 (uniform mixing).
- A round mixes the models the neighbours sent the round before, then trains (the paper's two
  phases, shifted by half a round so one engine round is one exchange). Round 1 mixes nothing:
  every client starts from the same seeded model.
- An unseen client starts from the mean of the training clients' models (L2C has no global
  model; the paper does not say what a new client uses).
- Communication: Table 1 of LoDMeta counts 3 units a round for L2C; ``comm_units`` reports that
  figure, while ``bytes_down`` is what really moves (every client receives every neighbour's
  model; ``bytes_up`` counts each model once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientResult, ClientTask
from flcore.algorithms.meta.base import MetaAlgorithm, MetaParams, Params
from flcore.algorithms.meta.fedalt import sgd_steps
from flcore.algorithms.meta.maml import tensors

__all__ = ["L2C", "L2CParams", "mix"]


class L2CParams(MetaParams):
    local_steps: int = Field(5, ge=1, description="SGD steps on the mixed model a round")
    mix_lr: float = Field(0.1, gt=0, description="step size of the mixing logits beta")
    prune_after: int = Field(100, ge=1, description="T_0: rounds before keeping the top k")
    top_k: int = Field(2, ge=1, description="neighbours kept after T_0")


def mix(models: list[Params], weights: torch.Tensor) -> Params:
    """``sum_j weights_j models_j``, differentiable in ``weights``."""
    return {k: sum(w * m[k] for w, m in zip(weights, models, strict=True)) for k in models[0]}


@ALGORITHMS.register("l2c")
class L2C(MetaAlgorithm):
    """Gossip with learnt mixing weights (module docstring)."""

    name = "l2c"
    Params = L2CParams
    topology = "gossip"
    client_metrics = ()

    def init_server(self) -> None:
        init = self.initial_params()
        self.models: list[Params] = [dict(init) for _ in range(self.num_clients)]
        self._next: dict[int, Params] = {}

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        return list(range(self.num_clients))

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        """Each neighbour's latest model (``n<j>.`` prefixes); the client keeps its own."""
        assert self.graph is not None
        out: dict[str, torch.Tensor] = {}
        if round > 1:
            for j in self.graph.neighbours[client_id]:
                out |= self.cpu(self.models[j], f"n{j}.")
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._next = {}

    def accumulate(self, result: ClientResult) -> None:
        self._next[result.client_id] = self.take(result.upload, "w.")

    def end_round(self, round: int) -> None:
        for cid, model in self._next.items():
            self.models[cid] = model
        self._next = {}

    def comm_units(self, client_ids: list[int]) -> float | None:
        return 3.0

    def client_start(self, client_id: int, state: Any) -> Params:
        if client_id < 0:  # an unseen client: the training clients' mean model
            return {k: torch.stack([m[k] for m in self.models]).mean(0) for k in self.models[0]}
        return self.models[client_id]

    def state_dict(self) -> dict[str, Any]:
        return {"models": [self.cpu(m) for m in self.models]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.models = [self.take(m) for m in state["models"]]

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, L2CParams) and self.graph is not None and data.val is not None
        cid = task.client_id
        own = self.take(task.state["model"]) if task.state else self.initial_params()
        neighbours = [j for j in self.graph.neighbours[cid] if f"n{j}." in _prefixes(task.payload)]
        state = task.state or {"beta": torch.zeros(len(self.graph.neighbours[cid]) + 1)}
        beta = state["beta"].clone()
        keep = state.get("keep")
        net = self.net()
        vx, vy = tensors(data.val, data.info, self.device)
        start = own
        if neighbours:
            order = [cid, *self.graph.neighbours[cid]]
            models = [own] + [self.take(task.payload, f"n{j}.") for j in neighbours]
            mask = torch.ones(len(order), dtype=torch.bool)
            if keep is not None:
                mask = torch.tensor([j in keep for j in order])
            logits = beta.clone().requires_grad_(True)
            weights = torch.softmax(logits.masked_fill(~mask, -torch.inf), 0)
            mixed = mix(models, weights.to(self.device))
            loss = F.cross_entropy(functional_call(net, mixed, (vx,)), vy)
            (grad,) = torch.autograd.grad(loss, logits)
            beta = (beta - p.mix_lr * grad.nan_to_num(0.0)).detach()
            weights = torch.softmax(beta.masked_fill(~mask, -torch.inf), 0)
            start = {k: v.detach() for k, v in mix(models, weights.to(self.device)).items()}
            if keep is None and task.round > p.prune_after:
                top = torch.topk(weights[1:], min(p.top_k, len(neighbours))).indices
                keep = [cid, *(order[1 + int(i)] for i in top)]
        sx, sy = tensors(data.train, data.info, self.device)
        trained, loss0 = sgd_steps(
            net, start, set(start), sx, sy, steps=p.local_steps, lr=p.inner_lr
        )
        state = {"beta": beta, "keep": keep, "model": self.cpu(trained)}
        n = len(data.train) + len(data.val)
        return ClientResult(cid, n, self.cpu(trained, "w."), state, {"train_loss": loss0})


def _prefixes(payload: Mapping[str, torch.Tensor]) -> set[str]:
    return {k.split(".", 1)[0] + "." for k in payload}
