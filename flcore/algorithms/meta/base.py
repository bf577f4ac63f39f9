"""What the meta-learning family shares: MAML's inner-loop settings, the meta-model, and the
evaluation every one of them is scored by (LoDMeta, Yang & Kwok, Sec. 5 and Algorithm 3).

``accuracy`` (training clients) and ``unseen_accuracy`` are measured the same way for every
algorithm here, on evaluation rounds, by the engine's server-side hook
(:meth:`MetaAlgorithm.evaluate_server`): each client starts from the parameters the algorithm
gives it (:meth:`MetaAlgorithm.client_start`: the meta-model for LoDMeta and MAML; a personal
model for L2C and FedAlt), takes ``eval_steps`` full-batch SGD steps (K = 5, the issue's
definition; kept apart from ``inner_steps``, which a sweep may search, so that every trial is
scored alike) at ``inner_lr`` on its support set, and is scored on its held-out test records
(flcore.data.fewshot). A walk visits one client a round, so the clients' own rounds report no
accuracy; this evaluates all of them. An algorithm with no model for a new client (L2C, whose
models are all personal) reports no ``unseen_accuracy`` (:attr:`MetaAlgorithm.serves_unseen`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import nn

from flcore.algorithms.aggregate import WeightedMean
from flcore.algorithms.base import Algorithm, AlgorithmParams, ClientData, ClientResult, seeded
from flcore.algorithms.meta.maml import adapted_accuracy, tensors

__all__ = ["LocalStepsParams", "MetaAlgorithm", "MetaParams", "Params", "ServerMeta"]

Params = dict[str, torch.Tensor]


class MetaParams(AlgorithmParams):
    inner_steps: int = Field(5, ge=1, description="K: SGD steps of the inner loop (paper: 5)")
    inner_lr: float = Field(
        0.1,
        gt=0,
        description="alpha: the inner loop's step size (the paper follows MAML and gives none)",
    )
    first_order: bool = Field(
        False,
        description="first-order MAML (no differentiation through the inner steps; the paper's "
        "Sec. 4.1 is second order)",
    )
    eval_steps: int = Field(
        5, ge=1, description="K of the evaluation: SGD steps on the support set (issue: 5)"
    )


class LocalStepsParams(MetaParams):
    """An algorithm of the family without MAML's inner loop (FedAlt, L2C): plain local steps,
    so ``first_order`` has nothing to apply to and is refused."""

    local_steps: int = Field(5, ge=1, description="local SGD steps a round")

    @field_validator("first_order")
    @classmethod
    def _no_first_order(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "no MAML inner loop here (local steps only): first_order does not apply"
            )
        return value


class MetaAlgorithm(Algorithm):
    """Base of the meta-learning family: a network, its initial parameters, the evaluation."""

    needs_fewshot = True
    Params: ClassVar[type[AlgorithmParams]] = MetaParams
    reports = frozenset(
        {"accuracy", "unseen_accuracy", "train_loss", "bytes_up", "bytes_down", "seconds"}
        | {"epsilon", "comm_units"}
    )
    #: per-client scalars averaged into each round's metrics (the engine's ``client_metrics``)
    client_metrics = ("meta_grad_norm",)
    client_evaluation = False  # evaluate_server adapts every client
    #: whether the algorithm has a model for an unseen client (L2C has none: LoDMeta Sec. 5
    #: "can only produce models for the training clients"); without, no unseen_accuracy
    serves_unseen = True
    #: The random walk's family, FedMAML and FedAlt have a surface (flcore.attacks.surface.
    #: MetaStepSurface, AlternatingSurface); the gossip L2C does not yet.
    attackable = False

    # ------------------------------------------------------------------ the network
    def net(self) -> nn.Module:
        """The (stateless) network every parameter dict is evaluated with."""
        if getattr(self, "_net", None) is None:
            self._net = self.model_spec().to(self.device)
        return self._net

    def initial_params(self) -> Params:
        """The seeded initial parameters, the same on every party."""
        model = seeded((self.seed, 0x3E7A), self.model_spec)
        return {k: v.detach().to(self.device) for k, v in model.named_parameters()}

    @staticmethod
    def cpu(params: Mapping[str, torch.Tensor], prefix: str = "") -> Params:
        return {prefix + k: v.detach().to("cpu", copy=True) for k, v in params.items()}

    def take(self, payload: Mapping[str, torch.Tensor], prefix: str = "") -> Params:
        """The tensors of ``payload`` under ``prefix``, on this algorithm's device, unprefixed."""
        n = len(prefix)
        return {k[n:]: v.to(self.device) for k, v in payload.items() if k.startswith(prefix)}

    def draw_clients(self, rng: np.random.Generator, n: int) -> list[int]:
        """A server's round: ``n`` clients uniformly without replacement (all if fewer), sorted;
        ``client_fraction`` and ``full_last_round`` do not apply (FedMAML's and FedAlt's
        ``clients_per_round`` says how many)."""
        n = min(n, self.num_clients)
        return sorted(int(i) for i in rng.choice(self.num_clients, size=n, replace=False))

    def replay_data(self, data: ClientData) -> ClientData:
        """A replayed step of the leakage evaluation trains on the attacked records alone: they
        are the task's support and its query set (its own query records would be records the
        attacker also has to recover)."""
        return replace(data, val=data.train)

    # ------------------------------------------------------------------ evaluation
    def client_start(self, client_id: int, state: Any) -> Params:
        """The parameters training client ``client_id`` adapts from (its private ``state``
        given). Subclasses say."""
        raise NotImplementedError

    def unseen_start(self) -> Params:
        """The parameters an unseen client adapts from: the meta-model by default."""
        return self.client_start(-1, None)

    def evaluate_server(
        self,
        data: Any,
        client_states: Mapping[int, Any],
        device: torch.device,
        *,
        global_test: bool = True,
    ) -> dict[str, float | None]:
        """``accuracy`` over every training client and ``unseen_accuracy`` over every unseen
        client, each adapted on its support set (module docstring): the accuracy itself,
        measured on every evaluation round whatever ``global_test`` says (there is no global
        test set to thin)."""
        p = self.params
        model, info = self.net(), data.info
        steps, lr = p.eval_steps, p.inner_lr  # type: ignore[attr-defined]
        accs = []
        with torch.random.fork_rng(devices=[]):  # evaluation draws nothing, changes nothing
            for cid in range(data.num_clients):
                start = self.client_start(cid, client_states.get(cid))
                support = tensors(data.client_train(cid), info, device)
                test = tensors(data.client_test(cid), info, device)
                accs.append(adapted_accuracy(model, start, support, test, steps=steps, lr=lr))
            unseen = []
            count = getattr(data, "num_unseen", 0) if self.serves_unseen else 0
            start = self.unseen_start() if count else {}
            for j in range(count):
                support = tensors(data.unseen_train(j), info, device)
                test = tensors(data.unseen_test_set(j), info, device)
                unseen.append(adapted_accuracy(model, start, support, test, steps=steps, lr=lr))
        out: dict[str, float | None] = {
            "accuracy": float(np.mean(accs)) if accs else None,
            "unseen_accuracy": float(np.mean(unseen)) if unseen else None,
        }
        if self.graph is not None and self.topology == "walk":  # Theorem 4.3's rate uses it
            out["graph_sigma2"] = self.graph.sigma2  # (a gossip's mixing is not this walk's)
        return out


class ServerMeta(MetaAlgorithm):
    """A server's round (FedMAML, FedAlt): ``clients_per_round`` clients drawn
    (:meth:`MetaAlgorithm.draw_clients`), their uploads averaged with equal weights (every
    few-shot client holds as many records), the mean applied by :meth:`apply`; 2n units of
    communication (LoDMeta Table 1: each client downloads and uploads the model)."""

    _mean: WeightedMean | None = None

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        return self.draw_clients(rng, self.params.clients_per_round)  # type: ignore[attr-defined]

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = WeightedMean()

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        self._mean.add(result.upload, 1.0)

    def end_round(self, round: int) -> None:
        if self._mean is not None and self._mean.count:
            self.apply(self._mean.result())
        self._mean = None

    def apply(self, mean: Mapping[str, torch.Tensor]) -> None:
        """Update the server state from the round's mean upload."""
        raise NotImplementedError

    def comm_units(self, client_ids: list[int]) -> float | None:
        return 2.0 * len(client_ids)
