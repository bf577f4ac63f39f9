"""Local-only training: each client trains its own model and never communicates.

The lower bound every personalised FL method is compared against (HyperFL Table 1, "Local-only").
As in the HyperFL authors' code, every client starts from the same initial model, trains E local
epochs on the rounds it is sampled in, and keeps its weights between rounds. Nothing is uploaded
or downloaded, so its bytes are 0, there is no global model, and nothing leaves the client for an
attack to see (its DP epsilon is 0).

Under a capacity setting it is capacity-aware (Pa3dFL Sec. 6.1 lists LocalOnly among the
"capacity-aware + personalization" methods): client i trains its own width p_i, starting from the
seeded network built at that width (the same seed words as the full model, so every client of one
width starts alike). Without a capacity setting every client starts from the seeded full model,
exactly as before. The vectorized executor trains the clients of every width in one stack, each
model zero-padded into the full-width network (flcore.algorithms.widths.slicing.padded) and cut
back after; equal to the loop within 1e-9 in float64 (tests/unit/test_vectorized.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientData,
    ClientResult,
    ClientTask,
    VectorJob,
    seeded,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.widths.slicing import leading_block, padded

__all__ = ["LocalOnly"]


@ALGORITHMS.register("local")
class LocalOnly(FedAvg):
    """Clients train alone; the engine keeps each client's weights as its private state."""

    name = "local"
    uploads = False
    reports = FedAvg.reports - {"global_accuracy"}
    privacy_mechanisms = frozenset()  # nothing leaves the client: there is nothing to protect
    capacity_aware = True
    vectorized = True

    def _initial(self, width: float | None) -> dict[str, torch.Tensor]:
        """The seeded initial weights at ``width`` (None: the model spec as given)."""
        build = self.model_spec if width is None else lambda: self.model_spec(width=width)
        model = seeded((self.seed, 0x1417), build)
        keys = self.trainable_keys(model)  # the client keeps only what trains
        state = model.state_dict()
        return {k: state[k].clone() for k in (state if keys is None else keys)}

    def init_server(self) -> None:
        if self.capacity is None:
            self._init = {None: self._initial(None)}
        else:
            self._init = {w: self._initial(w) for w in self.capacity.levels}

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        width = None if self.capacity is None else self.client_width(client_id)
        return {k: v.clone() for k, v in self._init[width].items()}

    def client_model(self) -> torch.nn.Module:
        """The worker's reusable network at the width of the client being served."""
        width = getattr(self, "_width", None)
        if width is None:
            return super().client_model()
        models = self.__dict__.setdefault("_width_models", {})
        if width not in models:
            model = seeded((self.seed, 0x1417), lambda: self.model_spec(width=width))
            keys = self.trainable_keys(model)
            if keys is not None:  # as FedAvg's client model: only what trains has gradients
                wanted = set(keys)
                for k, p in model.named_parameters():
                    p.requires_grad_(k in wanted)
            models[width] = model.to(self.device)
        return models[width]

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        self._width = None if self.capacity is None else self.client_width(task.client_id)
        return super().local_update(data, task, generator)

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

    # ------------------------------------------------------------ vectorized rounds
    # Under a capacity setting every client's width-p_i model is zero-padded into the
    # full-width network (flcore.algorithms.widths.slicing.padded: the width-p network is the
    # full one on its first channels) and cut back after training.
    def vector_unsupported(self) -> str | None:
        if self.capacity is None:
            return super().vector_unsupported()
        reason = Algorithm.vector_unsupported(self)
        if reason is not None:
            return reason
        if self.trainable_keys(self.vector_model()) is not None:
            return "it trains a part of models of several widths"
        return None

    def vector_model(self) -> torch.nn.Module:
        if self.capacity is None:
            return super().vector_model()
        return seeded((self.seed, 0x1417), lambda: self.model_spec(width=1.0)).to(self.device)

    def _shapes(self, width: float) -> dict[str, torch.Size]:
        with torch.device("meta"):
            return {k: v.shape for k, v in self.model_spec(width=width).state_dict().items()}

    def vector_job(self, task: ClientTask) -> VectorJob:
        job = super().vector_job(task)
        if self.capacity is None:
            return job
        full = self._shapes(1.0)
        start = {k: padded(v, full[k], f"local: {k}") for k, v in job.start.items()}
        return dataclasses.replace(job, start=start)

    def vector_result(
        self,
        task: ClientTask,
        weights: dict[str, torch.Tensor],
        num_samples: int,
        metrics: dict[str, float],
        kept: dict[str, torch.Tensor] | None = None,
        data: ClientData | None = None,
    ) -> ClientResult:
        if self.capacity is not None:
            shapes = self._shapes(self.client_width(task.client_id))
            weights = {k: leading_block(v, shapes[k]) for k, v in weights.items()}
        return super().vector_result(task, weights, num_samples, metrics, kept, data)
