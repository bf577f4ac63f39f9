"""LG-FedAvg: Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov & Morency, "Think Locally,
Act Globally: Federated Learning with Local and Global Representations", arXiv 2001.01523, 2020.

Each client keeps its own local representation (the network's ``features``), never shared, and
all clients share one global model on top of it (the classifier ``head``). In a round a sampled
client loads the broadcast head over its own representation, trains both jointly for E local
epochs on its data, keeps the representation and uploads the head; the server averages the
heads, ``n_i``-weighted:

    head^{t+1} = sum_i n_i head_i^{t+1} / sum_i n_i        (over the clients of round t)

Which part is global: the paper's variant, as Pa3dFL uses it (a local representation under a
global head). Public implementations differ on this (some share the lower layers and keep the
upper ones local); this one follows the paper, which is also what makes it capacity-aware: the
width lives in the representation, which never has to be aggregated across widths.

Capacity (Pa3dFL Sec. 6.1 lists LG-FedAvg as capacity-aware): client i's representation has
width p_i and outputs 128 p_i features (``pa3dfl_cnn_fmnist``), so its head reads 128 p_i
inputs. The server keeps the full-width head; a width-p client gets (and uploads) the leading
block of every head tensor, i.e. the first 128 p input columns of ``head.weight`` and all of
``head.bias`` (nested, as HeteroFL nests widths). Each head entry is averaged over the round's
clients that hold it (``n_i``-weighted); an entry no client of the round holds keeps its value
(:class:`flcore.algorithms.cover.CoverMean` over each upload's :func:`leading_index`).

Choices where the paper is silent, stated:
- Initialisation: the global head is the seeded full-width model's head; client i's
  representation is the seeded width-p_i model's ``features`` (the seed words of the FedAvg
  family's initial model, so clients of one width start alike). The authors' code
  (pliang279/LG-FedAvg, ``main_lg.py``) starts every client from a FedAvg-trained model
  (``--load_fed``) and shares its last ``num_layers_keep`` layers (2 or 3 in its README); Pa3dFL
  does not say how its LG-FedAvg started, and under capacity heterogeneity a FedAvg model of
  every width would take a HeteroFL-like run first. Here a client learns its representation
  from its own records from scratch under one shared layer, which leaves LG-FedAvg close to
  Local-only (BENCHMARKS.md: +0.18 / +0.22 points, where Pa3dFL's Table 1 has +3.2): a likely
  cause, not measured.
- Local training: the configured optimizer over representation and head together, E epochs,
  a fresh optimizer each round with the per-round lr decay (Pa3dFL Table 7, FMNIST: lr 0.1).
- ``accuracy`` is the client's model (its representation + the head it trained) after local
  training; ``accuracy_before`` is its representation under the received head. There is no
  global model (``global_accuracy`` is not reported).
- No DP mechanism: the representation is trained on the same records without noise and shapes
  the uploaded head, so DP-SGD on the head alone would bound nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    ClientData,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.cover import CoverMean, Index

__all__ = ["LGFedAvg", "leading_block", "leading_index"]


def leading_index(shape: Sequence[int]) -> Index:
    """The index ``[:shape[0], :shape[1], ...]`` of a narrower model's nested part of a tensor."""
    return tuple(slice(0, n) for n in shape)


def leading_block(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The block ``t[:shape[0], :shape[1], ...]`` (a narrower model's nested part of ``t``)."""
    return t[leading_index(shape)]


@ALGORITHMS.register("lg_fedavg")
class LGFedAvg(Algorithm):
    """Local representations of each client's width under one global (nested) head."""

    name = "lg_fedavg"
    reports = Algorithm.reports - {"global_accuracy"}
    capacity_aware = True

    # ----------------------------------------------------------------- models
    def _width(self, client_id: int) -> float | None:
        """The client's width, or None without a capacity setting (the spec as given)."""
        return None if self.capacity is None else self.client_width(client_id)

    def _initial(self, width: float | None) -> nn.Module:
        """The seeded initial network at ``width`` (None: the model spec as given)."""
        build = self.model_spec if width is None else lambda: self.model_spec(width=width)
        return seeded((self.seed, 0x1417), build)

    def _client_net(self, width: float | None) -> nn.Module:
        """The worker's reusable network at ``width``; weights are overwritten per client."""
        nets = self.__dict__.setdefault("_nets", {})
        if width not in nets:
            nets[width] = self._initial(width).to(self.device)
        return nets[width]

    def cost_model(self, client_id: int) -> nn.Module:
        return self._initial(self._width(client_id)).to(self.device)

    # ----------------------------------------------------------------- server side
    def init_server(self) -> None:
        full = self._initial(None if self.capacity is None else 1.0)
        state = full.state_dict()
        self.head = {k: state[k].clone() for k in full.head_keys()}
        self._mean: CoverMean | None = None

    def init_client_state(self, client_id: int) -> dict[str, torch.Tensor]:
        model = self._initial(self._width(client_id))
        state = model.state_dict()
        return {k: state[k].clone() for k in model.feature_keys()}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        shapes = self._head_shapes(self._width(client_id))
        return {k: leading_block(v, shapes[k]).clone() for k, v in self.head.items()}

    def _head_shapes(self, width: float | None) -> dict[str, torch.Size]:
        cache = self.__dict__.setdefault("_shapes", {})
        if width not in cache:
            with torch.device("meta"):  # shapes only: no memory, no random numbers drawn
                model = self.model_spec() if width is None else self.model_spec(width=width)
            cache[width] = {k: v.shape for k, v in model.state_dict().items()}
        return cache[width]

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = CoverMean(self.head)

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        index = {k: leading_index(v.shape) for k, v in result.upload.items()}
        self._mean.add(result.upload, index, float(result.num_samples))

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        self.head = self._mean.result()
        self._mean = None

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The broadcast head over the client's private representation (an unknown, from its
        public initial value)."""
        from flcore.attacks.surface import ModelSurface

        model = self._initial(self._width(client_id)).to(self.device)
        return ModelSurface(
            model,
            broadcast,
            unknowns=self.init_client_state(client_id),
            label_key="head.bias",
        )

    def state_dict(self) -> dict[str, Any]:
        return {"head": {k: v.clone() for k, v in self.head.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.head = {k: v.clone() for k, v in state["head"].items()}

    # ----------------------------------------------------------------- client side
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self._client_net(self._width(task.client_id))
        model.load_state_dict({**task.payload, **task.state})
        metrics: dict[str, Any] = self.client_eval(task, model, data, before=True)
        opt = self.local_optimizer(model.parameters(), round=task.round)
        metrics["train_loss"] = self.run_epochs(model, data, opt, generator)
        metrics |= self.client_eval(task, model, data)
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        upload = {k: state[k] for k in model.head_keys()}
        private = {k: state[k] for k in model.feature_keys()}
        return ClientResult(task.client_id, len(data.train), upload, private, metrics)
