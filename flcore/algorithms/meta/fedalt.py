"""FedAlt: Pillutla, Malik, Mohamed, Rabbat, Sanjabi & Xiao, "Federated Learning with Partial
Model Personalization", ICML 2022 (LoDMeta's paper attributes it to Marfoq et al.).

The model is split into a shared part u (the feature extractor, every client's) and a personal
part v_i (the head, client i's own, never uploaded). Each round the server sends u to
``clients_per_round`` clients; each first updates its v_i with u fixed, then u with its new
v_i fixed (the alternating update, Algorithm 1 of the paper), and uploads u; the server averages
the uploads (equal weights: every few-shot client holds as many records).

Choices, stated (the paper's experiments are not few-shot):
- Local data is the client's support and query records together (its training records);
  ``local_steps`` full-batch SGD steps at ``inner_lr`` on v_i, then as many on u.
- v_i starts from the seeded initial head; an unseen client starts from the shared u and that
  same initial head and adapts like every client (flcore.algorithms.meta.base).
- Sampling and communication as FedMAML's (n clients a round, 2n units, Table 1).
- ``lr`` (the walks' and MAML's meta step eta) and ``inner_steps`` have no role here (the local
  steps are ``local_steps`` at ``inner_lr``); ``first_order: true`` is refused.

Attacks: the server sees the new u; its surface (flcore.attacks.surface.AlternatingSurface)
simulates the whole local update of candidate records, the client's head an unknown at its
public initial value (exact on the client's first round), with ``attack.known: rest`` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch.func import functional_call

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientResult, ClientTask
from flcore.algorithms.meta.base import LocalStepsParams, Params, ServerMeta
from flcore.algorithms.meta.maml import tensors

__all__ = ["FedAlt", "FedAltParams"]


class FedAltParams(LocalStepsParams):
    clients_per_round: int = Field(4, ge=1, description="clients a round (as MAML's 4)")
    local_steps: int = Field(5, ge=1, description="SGD steps on v_i, then on u, a round")


def sgd_steps(
    net: torch.nn.Module,
    params: Params,
    train: set[str],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
) -> tuple[Params, float]:
    """``steps`` full-batch SGD steps on the parameters named in ``train`` (the rest fixed);
    returns the parameters and the first step's loss."""
    out = dict(params)
    first = float("nan")
    for i in range(steps):
        live = {k: v.detach().requires_grad_(k in train) for k, v in out.items()}
        loss = F.cross_entropy(functional_call(net, live, (x,)), y)
        keys = [k for k in live if k in train]
        grads = torch.autograd.grad(loss, [live[k] for k in keys])
        out = {k: v.detach() for k, v in live.items()}
        for k, g in zip(keys, grads, strict=True):
            out[k] = out[k] - lr * g
        if i == 0:
            first = float(loss.detach())
    return out, first


@ALGORITHMS.register("fedalt")
class FedAlt(ServerMeta):
    """Shared extractor averaged by the server, personal heads kept by the clients."""

    name = "fedalt"
    Params = FedAltParams
    client_metrics = ()
    attackable = True
    attack_knows_rest = True  # full-batch steps on the client's whole set: order-free

    def _split(self) -> tuple[Params, Params]:
        init = self.initial_params()
        shared = {k: v for k, v in init.items() if k.startswith("features.")}
        head = {k: v for k, v in init.items() if not k.startswith("features.")}
        return shared, head

    def init_server(self) -> None:
        self.u, _ = self._split()

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return self.cpu(self.u, "u.")

    def apply(self, mean: Mapping[str, torch.Tensor]) -> None:
        self.u = self.take(mean, "u.")

    def client_start(self, client_id: int, state: Any) -> Params:
        head = self.take(state) if state is not None else self._split()[1]
        return self.u | head

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The client's local update as the server can simulate it (module docstring)."""
        from flcore.algorithms.base import seeded
        from flcore.attacks.surface import AlternatingSurface

        p = self.params
        assert isinstance(p, FedAltParams)
        model = seeded((self.seed, 0x3E7A), self.model_spec).to(self.device)
        return AlternatingSurface(
            model,
            {k: v.to(self.device) for k, v in broadcast.items() if k.startswith("u.")},
            head=self._split()[1],
            steps=p.local_steps,
            lr=p.inner_lr,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"u": self.cpu(self.u)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.u = self.take(state["u"])

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FedAltParams) and data.val is not None
        head = self.take(task.state) if task.state is not None else self._split()[1]
        start = self.take(task.payload, "u.") | head
        sx, sy = tensors(data.train, data.info, self.device)
        qx, qy = tensors(data.val, data.info, self.device)
        x, y = torch.cat([sx, qx]), torch.cat([sy, qy])
        shared = {k for k in start if k.startswith("features.")}
        personal = set(start) - shared
        net = self.net()
        mid, loss = sgd_steps(net, start, personal, x, y, steps=p.local_steps, lr=p.inner_lr)
        end, _ = sgd_steps(net, mid, shared, x, y, steps=p.local_steps, lr=p.inner_lr)
        upload = self.cpu({k: end[k] for k in shared}, "u.")
        head = self.cpu({k: end[k] for k in personal})
        return ClientResult(task.client_id, len(x), upload, head, {"train_loss": loss})
