"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017.

Each sampled client starts from the global model w^t, runs E local epochs of mini-batch SGD on
its own data, and uploads w_i^{t+1}; the server sets

    w^{t+1} = sum_i n_i w_i^{t+1} / sum_i n_i        (over the clients of round t)

Setup follows HyperFL's baseline (Guo et al., AAAI 2025, appendix D.1, and the authors' code):
SGD with momentum 0.5 and weight decay 5e-4, a fresh optimizer every round, batch 50, 5 epochs.
The client uploads its whole model (weights, not deltas); ``accuracy`` is that model on the
client's own test set right after local training, and ``accuracy_before`` the global model it
received on the same test set (the authors' code measures both: their ``acc2`` and ``acc1``).

Privacy is a hook, not a copy: with ``privacy.mechanism: dpsgd`` local training runs DP-SGD
(flcore.privacy.dpsgd) and the server keeps each client's accountant (ISRL-DP); with
``privacy.mechanism: client`` the aggregation becomes clipped-sum-plus-noise
(flcore.privacy.client_level). ``dp_fedavg`` and ``dp_fedavg_client`` are this class with the
mechanism required. Client-level DP also owns client sampling (``sample_clients``): its
accounting holds only for the scheme it draws with (``privacy.client_sampling``).

A ``shared-only`` run (a personal part trained without noise, PPSGD's and CENTAUR's paper
protocol) reports ``epsilon = inf``, its guarantee, and the shared part's spend as
``epsilon_shared`` (``privacy_metrics``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from flcore.algorithms.aggregate import WeightedMean
from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    VectorJob,
    seeded,
)
from flcore.algorithms.training import LossFn
from flcore.errors import ConfigError
from flcore.privacy.client_level import ClientLevelDP
from flcore.privacy.dpsgd import DPSGD
from flcore.privacy.isrl import PerClientAccounting

__all__ = ["FedAvg"]


class FedAvgParams(AlgorithmParams):
    trainable: Literal["all", "head", "adapters"] = Field(
        "all",
        description="what trains and is shared: the whole model, only the classifier head "
        "(a fixed extractor), or adapters + head (adapter fine-tuning of a frozen backbone)",
    )


@ALGORITHMS.register("fedavg")
class FedAvg(Algorithm):
    """Federated averaging of whole models, weighted by client sample counts.

    ``algorithm_params.trainable`` restricts training and sharing to the head (HyperFL Table 2's
    "fixed feature extractor") or to adapters + head ("adapter fine-tuning"); the frozen rest is
    the same seeded (or pretrained) network on the server and every client.
    """

    name = "fedavg"
    privacy_mechanisms = frozenset({"dpsgd", "client"})
    Params = FedAvgParams
    vectorized = True

    def trainable_keys(self, model: nn.Module) -> list[str] | None:
        """State keys that train and travel; None means the whole model."""
        which = getattr(self.params, "trainable", "all")
        if which == "all":
            return None
        keys = list(model.head_keys())
        if which == "adapters":
            adapters = getattr(model, "adapter_keys", lambda: [])()
            if not adapters:
                raise ConfigError(
                    "algorithm_params.trainable",
                    f"'adapters' needs a backbone with adapters (resnet18_adapter, "
                    f"vit_s16_adapter), got model {self.model_spec.name!r}",
                )
            keys = adapters + keys
        return keys

    def shared_state(self) -> dict[str, torch.Tensor]:
        """The server model's tensors that train and travel."""
        state = self.model.state_dict()
        keys = self.trainable_keys(self.model)
        return dict(state) if keys is None else {k: state[k] for k in keys}

    def init_server(self) -> None:
        self.model = seeded((self.seed, 0x1417), self.model_spec).to(self.device)
        self.trainable_keys(self.model)  # a bad ``trainable`` fails before any round
        self._mean: WeightedMean | None = None
        p, t = self.privacy, self.training
        self._record_dp = (
            PerClientAccounting(
                p, epochs=self.dp_epochs(t.epochs, self.params), batch_size=t.batch_size
            )
            if p is not None and p.mechanism == "dpsgd"
            else None
        )
        self._client_dp = (
            ClientLevelDP(p, self.num_clients)
            if p is not None and p.mechanism == "client"
            else None
        )

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        """Client-level DP samples as its scheme says (its accounting depends on it); otherwise
        the default fixed-size draw."""
        client_dp = getattr(self, "_client_dp", None)  # subclasses may skip init_server
        if client_dp is not None:
            return client_dp.sample_clients(rng, fraction, force_all)
        return super().sample_clients(round, rng, fraction, force_all)

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return self.shared_state()

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._round = round
        if self._client_dp is not None:
            self._client_dp.begin(self.shared_state())
        else:
            self._mean = WeightedMean()

    def accumulate(self, result: ClientResult) -> None:
        if self._record_dp is not None:
            self._record_dp.record(result.client_id, result.num_samples)
        if self._client_dp is not None:
            self._client_dp.add(result.upload)
            return
        assert self._mean is not None, "begin_round was not called"
        self._mean.add(result.upload, float(result.num_samples))

    def end_round(self, round: int) -> None:
        if self._client_dp is not None:
            noise = torch.Generator().manual_seed(
                int(np.random.SeedSequence([self.seed, 0xD9, round]).generate_state(1)[0])
            )
            self.model.load_state_dict(self._client_dp.result(noise), strict=False)
            return
        assert self._mean is not None, "begin_round was not called"
        self.model.load_state_dict(self._mean.result(), strict=False)
        self._mean = None

    def privacy_metrics(self) -> dict[str, float]:
        """The mechanism's figures. A ``shared-only`` run has no formal guarantee: its
        ``epsilon`` is inf and the accountant's figure, what the shared part's DP steps spent,
        is ``epsilon_shared``; an algorithm that declares ``epsilon_shared`` reports it in the
        other modes too (there the DP steps are everything, so it equals ``epsilon``)."""
        dp = self._record_dp or self._client_dp
        if dp is None:
            return super().privacy_metrics()
        metrics = dp.metrics()
        shared_only = self.dp_guarantee() == "shared-only"
        if shared_only or "epsilon_shared" in self.reports:
            metrics["epsilon_shared"] = metrics["epsilon"]
        if shared_only:
            metrics["epsilon"] = math.inf
        elif self.dp_guarantee() == "weak-delta":  # a delta that lets a record out: no guarantee
            metrics["epsilon_accountant"] = metrics["epsilon"]
            metrics["epsilon"] = math.inf
        return metrics

    def global_model(self) -> nn.Module | None:
        return self.model

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The broadcast model; its trainable parameters are what the upload moved. A frozen
        part is the seeded (or pretrained) network every party builds."""
        from flcore.attacks.surface import ModelSurface

        model = seeded((self.seed, 0x1417), self.model_spec).to(self.device)
        keys = self.trainable_keys(model)
        params = dict(model.named_parameters())
        shared = [k for k in (keys if keys is not None else params) if k in params]
        fixed = {k: v for k, v in model.state_dict().items() if k not in shared}
        return ModelSurface(
            model, {k: broadcast[k] for k in shared}, fixed=fixed, label_key="head.bias"
        )

    def state_dict(self) -> dict[str, Any]:
        dp = self._record_dp or self._client_dp
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "privacy": dp.state_dict() if dp is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        dp = self._record_dp or self._client_dp
        if dp is not None:
            dp.load_state_dict(state["privacy"])

    # ------------------------------------------------------------------ client side
    def client_model(self) -> nn.Module:
        """The worker's reusable network; its weights are overwritten for each client."""
        if getattr(self, "_client_model", None) is None:
            # seeded as the server's model, so frozen parts are the same network everywhere
            model = seeded((self.seed, 0x1417), self.model_spec).to(self.device)
            keys = self.trainable_keys(model)
            if keys is not None:
                wanted = set(keys)
                for k, p in model.named_parameters():
                    p.requires_grad_(k in wanted)
            self._client_model = model
        return self._client_model

    def train_local(
        self,
        model: nn.Module,
        data: ClientData,
        generator: torch.Generator,
        *,
        optimizer: Any = None,
        epochs: int | None = None,
        private: bool = True,
        round: int | None = None,
        loss_fn: LossFn | None = None,
    ) -> float:
        """``epochs`` (default E) epochs on the client's data, with DP-SGD when the run's
        mechanism is ``dpsgd`` and ``private``. Only parameters with ``requires_grad`` train
        (and are clipped). Hooks for variants: ``optimizer`` replaces the configured one,
        ``loss_fn`` the cross-entropy (under DP-SGD a
        :class:`~flcore.privacy.dpsgd.SplitObjective`)."""
        t = self.training
        opt = optimizer
        if opt is None:
            opt = self.local_optimizer(
                (p for p in model.parameters() if p.requires_grad), round=round
            )
        hooks: dict[str, Any] = {} if loss_fn is None else {"loss_fn": loss_fn}
        if private and self.privacy is not None and self.privacy.mechanism == "dpsgd":
            dp = DPSGD(self.privacy.noise_multiplier, self.privacy.clip, t.batch_size)
            hooks |= {
                "sampler": dp.batches,
                "backward": dp.make_backward(len(data.train), generator),
            }
        return self.run_epochs(model, data, opt, generator, epochs=epochs, **hooks)

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model()
        model.load_state_dict(self.starting_weights(task), strict=False)
        metrics = self.client_eval(task, model, data, before=True)
        metrics["train_loss"] = self.train_local(model, data, generator, round=task.round)
        metrics |= self.client_eval(task, model, data)
        keys = self.trainable_keys(model)
        state = model.state_dict()
        weights = {
            k: state[k].detach().to("cpu", copy=True) for k in (state if keys is None else keys)
        }
        upload, state = self.split_result(weights)
        return ClientResult(task.client_id, len(data.train), upload, state, metrics)

    # ------------------------------------------------------------ vectorized rounds
    def vector_unsupported(self) -> str | None:
        """The vectorized step is SGD's on a network without train/eval differences (the
        base class's checks), one architecture for every client of the run."""
        reason = super().vector_unsupported()
        if reason is not None:
            return reason
        if self.capacity is not None and self.capacity_aware:
            return "its clients train models of several widths"
        return None

    def vector_model(self) -> nn.Module:
        return self.client_model()

    def vector_keys(self, model: nn.Module) -> list[str] | None:
        return self.trainable_keys(model)

    def vector_job(self, task: ClientTask) -> VectorJob:
        return VectorJob(start=self.starting_weights(task), lr=self.training.lr_at(task.round))

    def vector_result(
        self,
        task: ClientTask,
        weights: dict[str, torch.Tensor],
        num_samples: int,
        metrics: dict[str, float],
        kept: dict[str, torch.Tensor] | None = None,
        data: ClientData | None = None,
    ) -> ClientResult:
        """What ``local_update`` returns: the upload and kept state ``split_result`` makes of
        the trained weights; a second training's result (``kept``: Ditto's personal model) is
        the state instead."""
        upload, state = self.split_result(weights)
        return ClientResult(
            task.client_id, num_samples, upload, state if kept is None else kept, metrics
        )

    def starting_weights(self, task: ClientTask) -> dict[str, torch.Tensor]:
        """Where local training starts: the broadcast global model."""
        return task.payload

    def split_result(self, weights: dict[str, torch.Tensor]) -> tuple[dict, object]:
        """(what is uploaded, what the client keeps): the whole model, nothing kept."""
        return weights, None
