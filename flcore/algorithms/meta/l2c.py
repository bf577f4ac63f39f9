"""L2C: Li, Zhou, Tian & Tao, "Learning to Collaborate in Decentralized Learning of Personalized
Models", CVPR 2022; LoDMeta's decentralized gossip baseline (Yang & Kwok, Sec. 5.1).

Every client keeps its own model and, every round, talks to its graph neighbours (gossip: every
client is active each round). Client i mixes its neighbours' latest models with its own,
``w_i = sum_j alpha_ij w_j`` over ``j in N(i) + {i}``, ``alpha_i = softmax(beta_i)``; it learns
``beta_i`` by a gradient step on its validation loss at the mixed model (the paper's
"learning to collaborate"); from round ``prune_after`` (T_0) on it keeps only its ``top_k``
neighbours by weight (the paper's sparsification at T_0), and tells them so: from the next
round only the neighbours it keeps send it their model. It then trains the mixed model locally
and sends the result to the neighbours that keep it.

Choices, stated:
- The few-shot client's support set is its training data and its query set its validation data
  (the set the mixing weights are learnt on); ``local_steps`` full-batch SGD steps at
  ``inner_lr``; one step on beta a round at ``mix_lr``; beta starts at 0 (uniform mixing).
  ``lr`` (the walks' and MAML's meta step eta), ``inner_steps`` and ``first_order`` have no
  role here (``first_order: true`` is refused).
- A round mixes the models the neighbours sent the round before, then trains (the paper's two
  phases, shifted by half a round so one engine round is one exchange). Round 1 mixes nothing:
  every client starts from the same seeded model.
- What is scored: client i's personal model, the paper's ``theta_i = sum_j alpha_ij psi_j``,
  the mix of the latest locally trained models ``psi_j`` with its latest weights (what it would
  start the next round from), adapted on its support set as every algorithm of the family is
  (flcore.algorithms.meta.base).
- No ``unseen_accuracy``: L2C has no model for a client that did not train (LoDMeta Sec. 5:
  "L2C ... can only produce models for the training clients"), so none is made up.
- Communication: Table 1 of LoDMeta counts 3 units a round for L2C; ``comm_units`` reports that
  figure (per client and round, where MAML's 2n counts a whole round: every L2C client takes
  part each round, so a round moves about 3 x clients models), while ``bytes_down`` is what
  really moves (every model a client receives from the neighbours it keeps) and ``bytes_up``
  counts each client's model once, with its kept list (a few ids) once it prunes.
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
from flcore.algorithms.meta.base import LocalStepsParams, MetaAlgorithm, Params
from flcore.algorithms.meta.fedalt import sgd_steps
from flcore.algorithms.meta.maml import tensors

__all__ = ["L2C", "L2CParams", "mix"]


class L2CParams(LocalStepsParams):
    local_steps: int = Field(5, ge=1, description="SGD steps on the mixed model a round")
    mix_lr: float = Field(0.1, gt=0, description="step size of the mixing logits beta")
    prune_after: int = Field(
        100, ge=1, description="T_0: the round that chooses the top k (used from the next)"
    )
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
    serves_unseen = False
    reports = MetaAlgorithm.reports - {"unseen_accuracy"}

    def init_server(self) -> None:
        init = self.initial_params()
        self.models: list[Params] = [dict(init) for _ in range(self.num_clients)]
        #: the neighbours each client keeps once it pruned (it told them: protocol, not data)
        self.keep: dict[int, list[int]] = {}
        self._next: dict[int, Params] = {}

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        return list(range(self.num_clients))

    def senders(self, client_id: int) -> list[int]:
        """The neighbours whose models ``client_id`` receives: all, or those it keeps."""
        assert self.graph is not None
        keep = self.keep.get(client_id)
        return [j for j in self.graph.neighbours[client_id] if keep is None or j in keep]

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        """The latest model of each neighbour the client receives from (``n<j>.`` prefixes);
        the client keeps its own."""
        out: dict[str, torch.Tensor] = {}
        if round > 1:
            for j in self.senders(client_id):
                out |= self.cpu(self.models[j], f"n{j}.")
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._next = {}

    def accumulate(self, result: ClientResult) -> None:
        self._next[result.client_id] = self.take(result.upload, "w.")
        if "keep" in result.upload:
            self.keep[result.client_id] = [int(j) for j in result.upload["keep"]]

    def end_round(self, round: int) -> None:
        for cid, model in self._next.items():
            self.models[cid] = model
        self._next = {}

    def comm_units(self, client_ids: list[int]) -> float | None:
        return 3.0

    def client_start(self, client_id: int, state: Any) -> Params:
        """Client ``client_id``'s personal model theta_i: the latest models of itself and the
        neighbours it keeps, mixed with its latest weights (module docstring); its own model
        before it ever mixed."""
        assert client_id >= 0, "l2c has no model for an unseen client"
        if not state or "beta" not in state:
            return self.models[client_id]
        assert self.graph is not None
        order = [client_id, *self.graph.neighbours[client_id]]
        weights = _weights(state["beta"], order, state.get("keep"))
        return mix([self.models[j] for j in order], weights.to(self.device))

    def state_dict(self) -> dict[str, Any]:
        return {"models": [self.cpu(m) for m in self.models], "keep": dict(self.keep)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.models = [self.take(m) for m in state["models"]]
        self.keep = {int(k): list(v) for k, v in state.get("keep", {}).items()}

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, L2CParams) and self.graph is not None and data.val is not None
        cid = task.client_id
        own = self.take(task.state["model"]) if task.state else self.initial_params()
        received = _prefixes(task.payload)
        order = [cid, *self.graph.neighbours[cid]]
        state = task.state or {"beta": torch.zeros(len(order))}
        beta = state["beta"].clone()
        keep = state.get("keep")
        net = self.net()
        vx, vy = tensors(data.val, data.info, self.device)
        start = own
        if len(received) > 0:
            # a neighbour that sent nothing (pruned) is masked out: its weight is 0
            models = [own] + [
                self.take(task.payload, f"n{j}.") if f"n{j}." in received else own
                for j in order[1:]
            ]
            present = [True] + [f"n{j}." in received for j in order[1:]]
            logits = beta.clone().requires_grad_(True)
            weights = _weights(logits, order, keep, present)
            mixed = mix(models, weights.to(self.device))
            loss = F.cross_entropy(functional_call(net, mixed, (vx,)), vy)
            (grad,) = torch.autograd.grad(loss, logits)
            beta = (beta - p.mix_lr * grad.nan_to_num(0.0)).detach()
            weights = _weights(beta, order, keep, present)
            start = {k: v.detach() for k, v in mix(models, weights.to(self.device)).items()}
        upload: dict[str, torch.Tensor] = {}
        if keep is None and received and task.round >= p.prune_after:  # T_0: keep the top k
            top = torch.topk(beta[1:], min(p.top_k, len(order) - 1)).indices
            keep = [cid, *(order[1 + int(i)] for i in top)]
            upload["keep"] = torch.tensor(keep[1:], dtype=torch.int64)  # tell the server
        sx, sy = tensors(data.train, data.info, self.device)
        trained, loss0 = sgd_steps(
            net, start, set(start), sx, sy, steps=p.local_steps, lr=p.inner_lr
        )
        state = {"beta": beta, "keep": keep, "model": self.cpu(trained)}
        n = len(data.train) + len(data.val)
        upload |= self.cpu(trained, "w.")
        return ClientResult(cid, n, upload, state, {"train_loss": loss0})


def _weights(
    beta: torch.Tensor,
    order: list[int],
    keep: list[int] | None,
    present: list[bool] | None = None,
) -> torch.Tensor:
    """``softmax(beta)`` over ``order`` (the client, then its neighbours), with the neighbours
    it does not keep, or whose model it did not receive, at weight 0."""
    mask = torch.tensor([keep is None or j in keep for j in order])
    if present is not None:
        mask &= torch.tensor(present)
    return torch.softmax(beta.masked_fill(~mask, -torch.inf), 0)


def _prefixes(payload: Mapping[str, torch.Tensor]) -> set[str]:
    return {k.split(".", 1)[0] + "." for k in payload}
