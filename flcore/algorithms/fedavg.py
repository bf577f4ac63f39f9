"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017.

Each sampled client starts from the global model w^t, runs E local epochs of mini-batch SGD on
its own data, and uploads w_i^{t+1}; the server sets

    w^{t+1} = sum_i n_i w_i^{t+1} / sum_i n_i        (over the clients of round t)

Setup follows HyperFL's baseline (Guo et al., AAAI 2025, appendix D.1, and the authors' code):
SGD with momentum 0.5 and weight decay 5e-4, a fresh optimizer every round, batch 50, 5 epochs.
The client uploads its whole model (weights, not deltas); ``accuracy`` is that model on the
client's own test set right after local training, as in the authors' evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from flcore.algorithms.aggregate import WeightedMean
from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientData,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.training import evaluate, make_optimizer, train_epochs

__all__ = ["FedAvg"]


@ALGORITHMS.register("fedavg")
class FedAvg(Algorithm):
    """Federated averaging of whole models, weighted by client sample counts."""

    name = "fedavg"

    def init_server(self) -> None:
        self.model = seeded((self.seed, 0x1417), self.model_spec).to(self.device)
        self._mean: WeightedMean | None = None

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return dict(self.model.state_dict())

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = WeightedMean()

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        self._mean.add(result.upload, float(result.num_samples))

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        self.model.load_state_dict(self._mean.result())
        self._mean = None

    def global_model(self) -> nn.Module | None:
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])

    # ------------------------------------------------------------------ client side
    def client_model(self) -> nn.Module:
        """The worker's reusable network; its weights are overwritten for each client."""
        if getattr(self, "_client_model", None) is None:
            self._client_model = self.model_spec().to(self.device)
        return self._client_model

    def train_local(self, model: nn.Module, data: ClientData, generator: torch.Generator) -> float:
        """E epochs of the configured optimizer on the client's data (a hook for variants)."""
        t = self.training
        opt = make_optimizer(
            model.parameters(),
            name=t.optimizer,
            lr=t.lr,
            momentum=t.momentum,
            weight_decay=t.weight_decay,
        )
        return train_epochs(
            model,
            data.train,
            data.info,
            opt,
            epochs=t.epochs,
            batch_size=t.batch_size,
            generator=generator,
            device=self.device,
        )

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model()
        model.load_state_dict(task.payload)
        loss = self.train_local(model, data, generator)
        metrics = {"train_loss": loss}
        if task.evaluate:
            metrics["accuracy"], metrics["test_loss"] = evaluate(
                model, data.test, data.info, device=self.device
            )
        upload = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
