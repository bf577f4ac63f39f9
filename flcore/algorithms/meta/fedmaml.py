"""Federated MAML, LoDMeta's centralized baseline "MAML" (Yang & Kwok, Sec. 5.1): Fallah,
Mokhtari & Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach" (Per-FedAvg), NeurIPS 2020; Finn et al., ICML 2017.

Each round the server draws ``clients_per_round`` clients (n = 4 by default, MAML's meta-batch
of tasks; n = 1 is the paper's "MAML (1 client)"), sends them w, and each returns its MAML
meta-gradient at w (flcore.algorithms.meta.maml: K inner SGD steps on its support set, the query
loss). The server averages them and takes the Adam-style step the walk algorithms take
(``m = theta m + (1 - theta) g``, ``v = beta v + (1 - beta) g^2``,
``w <- w - eta m / sqrt(v + lambda)``, LoDMeta Appendix C's hyperparameters). The server holds
one (m, v) that every round updates, so FedMAML with n = 1 is LoDMeta-basic (Algorithm 1, whose
m and v travel with w) with clients drawn uniformly instead of walked to, not LoDMeta (whose m
and v are each client's own).

Choices, stated: a client runs one local meta-step and uploads its meta-gradient (Per-FedAvg
with tau = 1 local step); the server's Adam-style step is a deviation from Per-FedAvg, whose
server averages the clients' models (with tau = 1 and an SGD outer step the two coincide),
taken so that the comparison with the walks differs in the topology only (LoDMeta Appendix C:
the baselines "follow MAML"); the server's draw is uniform without replacement and ignores
``client_fraction`` and ``full_last_round`` (the algorithm's ``clients_per_round`` says how many);
communication is 2n units a round (Table 1: each client downloads and uploads the model).

Attacks: the server sees each drawn client's meta-gradient as it is (no privacy mechanism
applies: the paper runs MAML without one), so its surface
(flcore.attacks.surface.MetaStepSurface, rule ``gradient``) is the meta-gradient of candidate
records; with ``attack.known: rest`` the attacker knows the client's other support records and
its query set, as for the walk's variants.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientResult, ClientTask
from flcore.algorithms.meta.base import Params, ServerMeta
from flcore.algorithms.meta.lodmeta import WalkParams, grad_norm, step_surface
from flcore.algorithms.meta.maml import meta_gradient, tensors

__all__ = ["FedMAML", "FedMAMLParams"]


class FedMAMLParams(WalkParams):
    clients_per_round: int = Field(4, ge=1, description="n: clients (tasks) a round (paper: 4)")


@ALGORITHMS.register("fedmaml")
class FedMAML(ServerMeta):
    """Server-side MAML over clients' tasks (module docstring)."""

    name = "fedmaml"
    Params = FedMAMLParams
    attackable = True
    attack_knows_rest = True  # one meta-gradient of the client's whole task

    def init_server(self) -> None:
        self.w = self.initial_params()
        self.m = {k: torch.zeros_like(v) for k, v in self.w.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.w.items()}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return self.cpu(self.w, "w.")

    def apply(self, mean: Mapping[str, torch.Tensor]) -> None:
        """The Adam-style step on the mean meta-gradient."""
        p = self.params
        assert isinstance(p, FedMAMLParams)
        g = self.take(mean, "g.")
        self.m = {k: p.theta * self.m[k] + (1 - p.theta) * g[k] for k in g}
        self.v = {k: p.beta * self.v[k] + (1 - p.beta) * g[k].pow(2) for k in g}
        eta = self.training.lr
        self.w = {k: self.w[k] - eta * self.m[k] / torch.sqrt(self.v[k] + p.lam) for k in g}

    def client_start(self, client_id: int, state: Any) -> Params:
        return self.w

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The meta-gradient the client uploads, as the server reads it (module docstring)."""
        start = {f"g.{k[2:]}": v for k, v in broadcast.items() if k.startswith("w.")}
        return step_surface(self, start, "gradient", clip=None)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.cpu(self.w), "m": self.cpu(self.m), "v": self.cpu(self.v)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.w, self.m, self.v = (self.take(state[k]) for k in ("w", "m", "v"))

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FedMAMLParams) and data.val is not None
        g, loss = meta_gradient(
            self.net(),
            self.take(task.payload, "w."),
            tensors(data.train, data.info, self.device),
            tensors(data.val, data.info, self.device),
            steps=p.inner_steps,
            lr=p.inner_lr,
            first_order=p.first_order,
        )
        metrics = {"train_loss": loss, "meta_grad_norm": grad_norm(g)}
        n = len(data.train) + len(data.val)
        return ClientResult(task.client_id, n, self.cpu(g, "g."), None, metrics)
