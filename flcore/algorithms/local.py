"""Local-only training: each client trains its own model and never communicates.

The lower bound every personalised FL method is compared against (HyperFL Table 1, "Local-only").
As in the HyperFL authors' code, every client starts from the same initial model, trains E local
epochs on the rounds it is sampled in, and keeps its weights between rounds. Nothing is uploaded
or downloaded, so its bytes are 0, there is no global model, and nothing leaves the client for an
attack to see (its DP epsilon is 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.fedavg import FedAvg

__all__ = ["LocalOnly"]


@ALGORITHMS.register("local")
class LocalOnly(FedAvg):
    """Clients train alone; the engine keeps each client's weights as its private state."""

    name = "local"
    uploads = False
    reports = FedAvg.reports - {"global_accuracy"}
    privacy_mechanisms = frozenset()  # nothing leaves the client: there is nothing to protect

    def init_server(self) -> None:
        model = seeded((self.seed, 0x1417), self.model_spec)
        keys = self.trainable_keys(model)  # the client keeps only what trains
        state = model.state_dict()
        self._init = {k: state[k].clone() for k in (state if keys is None else keys)}

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._init.items()}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return {}

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        pass

    def accumulate(self, result: ClientResult) -> None:
        pass

    def end_round(self, round: int) -> None:
        pass

    def global_model(self) -> None:
        return None

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> None:
        return None  # nothing leaves the client: nothing to attack

    def privacy_metrics(self) -> dict[str, float]:
        return Algorithm.privacy_metrics(self)  # epsilon 0: nothing is released

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def starting_weights(self, task: ClientTask) -> dict[str, torch.Tensor]:
        return task.state  # the client's own model, kept by the engine between rounds

    def split_result(self, weights: dict[str, torch.Tensor]) -> tuple[dict, object]:
        return {}, weights  # nothing is uploaded; the client keeps its model
