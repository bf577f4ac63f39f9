"""Width slicing of a full model, shared by HeteroFL, FjORD and FedRolex.

A width-p client trains a submodel cut out of the full server model: in every width-scaled layer
of C channels it keeps p*C of them (the capacity rule makes p*C a whole number), and every tensor
that reads a kept layer keeps the matching inputs. :attr:`ScalableModel.CHANNEL_AXES` says which
axes of which state tensor are indexed by which layer's channels, and with what block size: the
first fully-connected layer reads conv channel c as the inputs ``c*B .. c*B + B-1`` (B = 7x7 on
Fashion-MNIST). The input image channels and the head's classes are never cut.

- nested (HeteroFL, FjORD): each layer keeps its first p*C channels;
- rolling (FedRolex): each layer keeps a window of p*C consecutive channels (mod C).

Kept channels are always taken in ascending index order. For a wrapping window this is a
consistent permutation of the window's own order (the same permutation in the layer and in every
tensor that reads it), so the submodel computes the same function and SGD trains it the same way.
At width 1 every slice is the identity, which also lets these algorithms run on models that do not
scale (no ``CHANNEL_AXES``) when there is no capacity setting.

The server aggregates by covering (HeteroFL Sec. 3.1, FjORD Sec. 3, FedRolex Sec. 3): each entry
of the full model becomes the weighted mean of the values the round's clients uploaded for it,
over only the clients whose submodel holds it; an entry no client held keeps its value. That is
:class:`flcore.algorithms.cover.CoverMean`, told each client's entries by :func:`submodel_index`
(the outer product of the kept channels over a tensor's cut axes, as :func:`extract` cuts it).

:class:`SlicedWidthAlgorithm` is the server/client skeleton the three algorithms share; each
overrides :meth:`~SlicedWidthAlgorithm.kept_channels` (which channels a client gets) and, where it
trains differently, :meth:`~SlicedWidthAlgorithm.train_submodel`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from flcore.algorithms.base import (
    Algorithm,
    ClientData,
    ClientResult,
    ClientTask,
    VectorJob,
    seeded,
)
from flcore.algorithms.cover import CoverMean, Index
from flcore.models import MODELS
from flcore.models.scalable import scaled

__all__ = [
    "AxesMap",
    "Kept",
    "SlicedWidthAlgorithm",
    "extract",
    "leading_block",
    "nested_channels",
    "nested_widths",
    "padded",
    "rolling_channels",
    "rolling_start",
    "submodel_index",
]

#: state key -> ((axis, channel layer, block size), ...), as ScalableModel.CHANNEL_AXES
AxesMap = Mapping[str, tuple[tuple[int, str, int], ...]]
#: channel layer -> the indices of its kept channels (ascending)
Kept = Mapping[str, torch.Tensor]

_SEED_TAG = 0x5A1C  # the server's initial full model


def nested_widths(width: float, step: float) -> list[float]:
    """The widths nested in ``width``, ascending: ``step, 2 step, ..., width`` (the last exactly
    ``width``, a multiple of ``step``): what FjORD's ordered dropout, and Pa3dFL's
    ``width_draw: upto``, draw a step's width from."""
    k = round(width / step)
    return [width if j == k else j * step for j in range(1, k + 1)]


def nested_channels(full_channels: Mapping[str, int], width: float) -> dict[str, torch.Tensor]:
    """The first ``width x C`` channels of every layer (ordered dropout / HeteroFL's slice)."""
    return {layer: torch.arange(scaled(c, width)) for layer, c in full_channels.items()}


def rolling_start(round: int, channels: int) -> int:
    """FedRolex's window start in a layer of ``channels`` channels at ``round`` (1-based):
    ``(round - 1) mod C``, the paper's ``j mod K`` with rounds counted from j = 0."""
    return (round - 1) % channels


def rolling_channels(
    full_channels: Mapping[str, int], width: float, round: int
) -> dict[str, torch.Tensor]:
    """FedRolex's window: ``width x C`` consecutive channels from :func:`rolling_start`,
    wrapping past C - 1 to 0; returned in ascending order (see the module doc)."""
    out = {}
    for layer, c in full_channels.items():
        k = scaled(c, width)
        out[layer] = torch.sort((rolling_start(round, c) + torch.arange(k)) % c).values
    return out


def _axis_index(kept: Kept, layer: str, block: int, device: torch.device) -> torch.Tensor:
    idx = kept[layer].to(device)
    if block > 1:  # channel c -> inputs c*block .. c*block + block - 1
        idx = (idx[:, None] * block + torch.arange(block, device=device)).reshape(-1)
    return idx


def extract(
    state: Mapping[str, torch.Tensor], axes: AxesMap, kept: Kept
) -> dict[str, torch.Tensor]:
    """The submodel's tensors: each tensor of ``state`` with every channel-indexed axis cut to
    the kept channels. Differentiable (index_select), and always new tensors: never a view of
    ``state``."""
    out = {}
    for key, value in state.items():
        t = value
        for axis, layer, block in axes.get(key, ()):
            t = t.index_select(axis, _axis_index(kept, layer, block, t.device))
        out[key] = t.clone() if t is value else t
    return out


def padded(t: torch.Tensor, shape: torch.Size, name: str) -> torch.Tensor:
    """``t`` (a width-p tensor) as the leading block of a zero tensor of the full-width
    ``shape``: a width-p network is the full one's sub-network on the first channels of every
    layer (nested slicing; Pa3dFL's decomposed layers alike), so in the full network the padded
    channels compute zeros and get zero gradients (a ReLU or max-pool passes none at 0, and the
    next layer's padded inputs are zero). How the vectorized executor trains clients of several
    widths in one stack."""
    if t.dim() != len(shape) or any(a > b for a, b in zip(t.shape, shape, strict=True)):
        raise ValueError(f"{name} of shape {tuple(t.shape)} is not within {tuple(shape)}")
    if t.shape == shape:
        return t
    out = t.new_zeros(shape)
    out[tuple(slice(0, n) for n in t.shape)] = t
    return out


def leading_block(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The leading ``shape`` block of ``t``, a new tensor (undoes :func:`padded`)."""
    if t.shape == shape:
        return t
    return t[tuple(slice(0, n) for n in shape)].clone()


def submodel_index(
    state: Mapping[str, torch.Tensor], axes: AxesMap, kept: Kept
) -> dict[str, Index]:
    """Per tensor of ``state``, the index of the entries the submodel cut with ``kept`` holds,
    in the order :func:`extract` gives them: the outer product of the kept inputs over the cut
    axes (every entry of the other axes). What :meth:`CoverMean.add` takes."""
    out: dict[str, Index] = {}
    for key, t in state.items():
        cut = {axis: (layer, block) for axis, layer, block in axes.get(key, ())}
        if not cut:
            out[key] = (Ellipsis,)
            continue
        last = max(cut)
        index = []
        for axis in range(last + 1):
            if axis in cut:
                idx = _axis_index(kept, *cut[axis], t.device)
            else:
                idx = torch.arange(t.shape[axis], device=t.device)
            shape = [1] * (last + 1)
            shape[axis] = -1
            index.append(idx.reshape(shape))
        out[key] = tuple(index)
    return out


class SlicedWidthAlgorithm(Algorithm):
    """The shared skeleton: a full-width server model, a per-client submodel broadcast, the
    trained submodel uploaded, covering aggregation.

    Subclasses choose the channels (:meth:`kept_channels`), the aggregation weight
    (:attr:`weighted`) and, if training differs from plain cross-entropy SGD,
    :meth:`train_submodel`.
    """

    capacity_aware = True
    #: aggregate by sample count (True) or plainly, one vote per covering client (False)
    weighted: ClassVar[bool] = False

    # ------------------------------------------------------------------ shared helpers
    def build(self, width: float) -> nn.Module:
        """A fresh network at ``width`` (a model that does not scale is built only at 1)."""
        spec = self.model_spec
        fn = spec if width == 1.0 else (lambda: spec(width=width))
        return seeded((self.seed, _SEED_TAG), fn).to(self.device)

    def full_channels(self) -> dict[str, int]:
        """The full model's channel count per width-scaled layer (none: a model that does not
        scale, width 1 only)."""
        return dict(getattr(MODELS.get(self.model_spec.name), "FULL_CHANNELS", {}))

    def axes(self) -> AxesMap:
        """Which axes of which state tensor each channel layer indexes."""
        return dict(getattr(MODELS.get(self.model_spec.name), "CHANNEL_AXES", {}))

    def kept_channels(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        """The channels of each layer client ``client_id`` holds in ``round``. Default: nested."""
        return nested_channels(self.full_channels(), self.client_width(client_id))

    # ------------------------------------------------------------------ server side
    def init_server(self) -> None:
        self.model = self.build(1.0)
        self._mean: CoverMean | None = None
        self._round = 0

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        return extract(state, self.axes(), self.kept_channels(round, client_id))

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._round = round
        self._mean = CoverMean(self.model.state_dict())

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        kept = self.kept_channels(self._round, result.client_id)
        index = submodel_index(self.model.state_dict(), self.axes(), kept)
        weight = float(result.num_samples) if self.weighted else 1.0
        self._mean.add(result.upload, index, weight)

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        if self._mean.count:
            self.model.load_state_dict(self._mean.result())
        self._mean = None

    def global_model(self) -> nn.Module | None:
        return self.model

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The client's submodel at the broadcast weights: the upload is that network trained."""
        from flcore.attacks.surface import ModelSurface

        model = self.surface_model(client_id)
        return ModelSurface(model, dict(broadcast), label_key="head.bias")

    def surface_model(self, client_id: int) -> nn.Module:
        """The network the attack surface differentiates (the client's width)."""
        return self.build(self.client_width(client_id))

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])

    # ------------------------------------------------------------------ vectorized rounds
    #: where the network's parameters sit in :meth:`vector_model` ("net." inside an objective)
    _vector_prefix: ClassVar[str] = ""

    def vector_model(self) -> nn.Module:
        """The full-width network: every client trains its submodel zero-padded into it
        (:func:`padded`), whose extra channels compute zeros and get zero gradients; a
        subclass that declares ``vectorized`` with the default training (E epochs of
        cross-entropy SGD: FedRolex) needs nothing more. The submodel's kept channels are its
        own tensors' order, whichever channels of the full model they came from."""
        return self.build(1.0)

    def vector_job(self, task: ClientTask) -> VectorJob:
        """The client's epochs on its submodel, padded to full width."""
        shapes = {k: v.shape for k, v in self.client_model(1.0).state_dict().items()}
        pre = self._vector_prefix
        return VectorJob(
            start={
                f"{pre}{k}": padded(v, shapes[k], f"{self.name}: {k}")
                for k, v in task.payload.items()
            },
            lr=self.training.lr_at(task.round),
        )

    def vector_result(
        self,
        task: ClientTask,
        weights: dict[str, torch.Tensor],
        num_samples: int,
        metrics: dict[str, float],
        kept: dict[str, torch.Tensor] | None = None,
        data: ClientData | None = None,
    ) -> ClientResult:
        """What ``local_update`` returns: the trained submodel, cut from the padded tensors, as
        the upload; given the client's ``data`` (an algorithm with its own objective, which
        evaluates its clients itself), the received and trained submodels' metrics."""
        model = self.client_model(self.client_width(task.client_id))
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        pre = self._vector_prefix
        trained = {k: leading_block(weights[f"{pre}{k}"], shapes[k]) for k in shapes}
        if task.evaluate and data is not None:
            model.load_state_dict(task.payload)
            metrics |= self.client_eval(task, model, data, before=True)
            model.load_state_dict(trained)
            metrics |= self.client_eval(task, model, data)
        return ClientResult(task.client_id, num_samples, trained, None, metrics)

    # ------------------------------------------------------------------ client side
    def client_model(self, width: float) -> nn.Module:
        """The worker's reusable network of ``width``; its weights are overwritten per client."""
        cache = self.__dict__.setdefault("_client_models", {})
        if width not in cache:
            cache[width] = self.build(width)
        return cache[width]

    def train_submodel(
        self, model: nn.Module, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> float:
        """Local training of the received submodel; returns the mean training loss.
        Default: E epochs of cross-entropy SGD."""
        opt = self.local_optimizer(model.parameters(), round=task.round)
        return self.run_epochs(model, data, opt, generator)

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        model = self.client_model(self.client_width(task.client_id))
        model.load_state_dict(task.payload)
        metrics = self.client_eval(task, model, data, before=True)
        metrics["train_loss"] = self.train_submodel(model, data, task, generator)
        metrics |= self.client_eval(task, model, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
