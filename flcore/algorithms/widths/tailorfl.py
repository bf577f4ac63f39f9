"""TailorFL: Deng, Chen, Ren, Lyu, Liu, Liu & Zhang, "TailorFL: Dual-Personalized Federated
Learning under System and Data Heterogeneity", ACM SenSys 2022 (a capacity-aware baseline of
Pa3dFL, Wang et al., Table 1; Appendix D's tuning: regulariser coefficient, Table 7).

Each client i trains a submodel of width p_i cut out of the full global model by filter
selection, with its own filters: in every width-scaled layer l (conv1, conv2, fc1, fc2) it keeps
the k_il = p_i C_l filters of highest selection score. What is implemented:

1. Importance layer (the paper's learnable per-filter importance; network-slimming style): a
   vector s_il of one scale per kept filter multiplies layer l's output channels. It trains with
   the weights under the local objective

       L_i = CE(f(x; theta_i, s_i), y) + lambda * ||s_i||_1 / dim(s_i)       (``reg`` = lambda)

   (s_i: all the client's scales, one vector) so unimportant filters' scales shrink towards 0.
   A pruned filter's importance is 0 (pruning a filter is zeroing its scale).
2. Data-directed selection with server-assisted tuning (clients with similar data share more
   identical filters). The server keeps every client's importance vector over all C_l filters
   (zeros where pruned) and, after each round, re-selects each client's filters by

       s^_j = |s_j| / max|s_j|                (per layer, so clients compare on one scale)
       a_ij = max(0, cos(s^_i, s^_j)) / sum_{j' != i} max(0, cos(s^_i, s^_j'))   (j != i)
       score_i = (1 - gamma) s^_i + gamma sum_j a_ij s^_j                     (``tune`` = gamma)
       keep_il = the k_il filters of highest score_il (ties: the lower index)

   A filter that enters a client's structure this way starts from the importance its similar
   clients give it, ``sum_j a_ij s^_j x max|s_i|``; filters that leave it get importance 0.
3. Scaling-based aggregation: every entry of the global model becomes the weighted mean of the
   clients of the round that hold it, with weight n_i / p_i; entries nobody held keep their value
   (:class:`flcore.algorithms.cover.CoverMean`, told each client's filters by
   :func:`flcore.algorithms.widths.slicing.submodel_index`).

Choices where the paper (as far as we could read it: the SenSys text is not openly available,
and there is no official code) or Pa3dFL is silent, stated plainly:

- Table 7 gives TailorFL two numbers ("0.1, 0.2" FMNIST Ideal, "0.05, 0.2" Hetero). Pa3dFL says
  it tunes "the coefficient of the regularization from {0.1, 0.5}", and the first number is the
  one that varies over {0.05, 0.1, 0.5} across Tables 5-7: the first is ``reg`` (lambda), the
  second ``tune`` (gamma, the weight of similar clients in the selection; 0.05 or 0.2 in the
  tables). Defaults: FMNIST Ideal, ``reg: 0.1, tune: 0.2``.
- The L1 norm is divided by the number of scales: with Table 7's lambda = 0.1 a plain sum over
  the FMNIST CNN's 736 scales would add about 74 to a cross-entropy near 2 (network slimming,
  with a plain sum, uses lambda ~ 1e-4); the mean keeps Pa3dFL's {0.1, 0.5} on the loss's scale.
- Similarity between clients' data is measured on their importance vectors (what the server
  holds): the importance layers are trained on each client's data and so are the data-directed
  signal; no label statistics leave the client.
- The first structure of every client is the leading k_il filters of each layer (the all-ones
  initial importance layer, ties broken by index): on a randomly initialised global model, no
  importance score carries information yet. Data direction enters from each client's first
  upload on; clients that have not yet taken part are re-selected by similarity too.
- The importance layer multiplies each output channel of conv and linear layers before the
  pooling / ReLU (a positive scale commutes with both), and is kept by the server with the
  client's structure: it travels down with the submodel and back with the upload (the server
  needs it to select filters), so a client keeps no private state.
- Aggregation weight n_i / p_i, as issue #24 words the paper's "scaling-based aggregation
  (scales parameters with the pruning rate of submodels)".
- The importance scales of every client stay personal (never averaged): they, and each
  client's structure, are its "personalized parameters for local inference".

``accuracy_before`` is the client's submodel as the server sent it (its aggregated filters with
its importance layer), ``accuracy`` the same after local training. There is no single global
model to evaluate (each client infers with its own structure and importances), so
``global_accuracy`` is null. Without a capacity setting every client keeps every filter
(TailorFL then is FedAvg with personal importance layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    seeded,
)
from flcore.algorithms.cover import CoverMean, Index
from flcore.algorithms.widths.slicing import extract, submodel_index
from flcore.models import SplitModel
from flcore.models.scalable import ScalableModel, scaled

__all__ = [
    "TailorFL",
    "TailorFLParams",
    "ImportanceNet",
    "select_filters",
    "tuned_scores",
]


class TailorFLParams(AlgorithmParams):
    reg: float = Field(
        0.1,
        ge=0,
        description="lambda: coefficient of the L1 norm of the importance layer in the local "
        "objective (Pa3dFL Table 7's first TailorFL number: 0.1 Ideal, 0.05 Hetero on FMNIST)",
    )
    tune: float = Field(
        0.2,
        ge=0,
        le=1,
        description="gamma: weight of similar clients' importance in a client's filter "
        "selection, the server-assisted tuning (Table 7's second number, 0.2 on FMNIST)",
    )


# ---------------------------------------------------------------------------- pure math
def select_filters(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (ascending) of the ``k`` highest ``scores``; ties go to the lower index."""
    if not 0 < k <= scores.numel():
        raise ValueError(f"cannot keep {k} of {scores.numel()} filters")
    order = torch.sort(-scores.detach().double(), stable=True).indices[:k]
    return order.sort().values


def _normalised(vectors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for layer, v in vectors.items():
        a = v.detach().double().abs()
        top = float(a.max()) if a.numel() else 0.0
        out[layer] = a / top if top > 0 else a
    return out


def tuned_scores(
    importance: list[Mapping[str, torch.Tensor]], tune: float
) -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """The server-assisted selection scores of every client (module doc, step 2).

    Args:
        importance: per client, per layer, its importance of every filter (0 where pruned).
        tune: gamma, the weight of similar clients.

    Returns:
        (scores, peers): per client and layer, ``(1 - gamma) s^_i + gamma sum_j a_ij s^_j`` and
        the peers' part ``sum_j a_ij s^_j`` alone (a client with no similar peer keeps its
        own scores and has zero peers' part).
    """
    norm = [_normalised(v) for v in importance]
    layers = list(importance[0]) if importance else []
    flat = torch.stack([torch.cat([n[layer] for layer in layers]) for n in norm])
    unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    sim = (unit @ unit.T).clamp_min(0.0)
    sim.fill_diagonal_(0.0)
    totals = sim.sum(dim=1)
    scores, peers = [], []
    for i, own in enumerate(norm):
        if totals[i] <= 0:
            scores.append(dict(own))
            peers.append({layer: torch.zeros_like(own[layer]) for layer in layers})
            continue
        a = sim[i] / totals[i]
        mix = {layer: sum(a[j] * norm[j][layer] for j in range(len(norm))) for layer in layers}
        peers.append(mix)
        scores.append({layer: (1 - tune) * own[layer] + tune * mix[layer] for layer in layers})
    return scores, peers


# ---------------------------------------------------------------------------- the network
class _ChannelScale:
    """Forward hook: multiply a layer's output channels by its importance scales (read from
    the owner's ParameterDict at call time, so ``functional_call`` can substitute them)."""

    def __init__(self, scales: nn.ParameterDict, layer: str) -> None:
        self.scales = scales
        self.layer = layer

    def __call__(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        s = self.scales[self.layer]
        return output * s.view(1, -1, *([1] * (output.dim() - 2)))


class ImportanceNet(nn.Module):
    """A (sub)network with an importance layer after each width-scaled layer.

    Its state keys are the base model's (``features.*``, ``head.*``) plus ``importance.<layer>``.
    """

    def __init__(self, base: SplitModel, layers: Mapping[str, str]) -> None:
        super().__init__()
        self.features = base.features
        self.head = base.head
        modules = dict(self.named_modules())
        self.importance = nn.ParameterDict(
            {
                layer: nn.Parameter(torch.ones(modules[path].weight.shape[0]))
                for layer, path in layers.items()
            }
        )
        for layer, path in layers.items():
            modules[path].register_forward_hook(_ChannelScale(self.importance, layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def channel_layers(model: nn.Module) -> dict[str, tuple[str, int]]:
    """Width-scaled layer -> (module path, full channel count).

    A width-scalable model says it (``CHANNEL_AXES``); for any other model (only used without
    a capacity setting, where nothing is pruned) every conv / linear layer of ``features``.
    """
    if isinstance(model, ScalableModel):
        out = {}
        for key, axes in model.channel_axes().items():
            for axis, layer, _ in axes:
                if axis == 0 and key.endswith(".weight"):
                    out[layer] = (key.rsplit(".", 1)[0], model.FULL_CHANNELS[layer])
        return out
    return {
        f"features_{path.replace('.', '_')}": (f"features.{path}", int(m.weight.shape[0]))
        for path, m in model.features.named_modules()  # type: ignore[union-attr]
        if isinstance(m, nn.Conv2d | nn.Linear)
    }


def _axes_of(model: nn.Module, layers: Mapping[str, tuple[str, int]]) -> dict[str, tuple]:
    """Per state key, the ((axis, layer, block), ...) its filters index."""
    if isinstance(model, ScalableModel):
        return model.channel_axes()
    axes: dict[str, tuple] = {}
    for layer, (path, _) in layers.items():
        axes[f"{path}.weight"] = ((0, layer, 1),)
        axes[f"{path}.bias"] = ((0, layer, 1),)
    return axes


# ---------------------------------------------------------------------------- algorithm
@ALGORITHMS.register("tailorfl")
class TailorFL(Algorithm):
    """Importance-selected personal submodels, similarity-tuned, aggregated with n_i / p_i."""

    name = "tailorfl"
    capacity_aware = True
    Params = TailorFLParams
    reports = Algorithm.reports - {"global_accuracy"}

    # ------------------------------------------------------------------ structure
    def _structure(self) -> tuple[dict[str, tuple[str, int]], dict[str, tuple]]:
        if getattr(self, "_layers", None) is None:
            probe = self.model_spec()
            self._layers = channel_layers(probe)
            self._axes = _axes_of(probe, self._layers)
        return self._layers, self._axes

    def kept(self, client_id: int) -> dict[str, int]:
        """k_il = p_i C_l of every width-scaled layer."""
        layers, _ = self._structure()
        width = self.client_width(client_id)
        return {layer: scaled(c, width) for layer, (_, c) in layers.items()}

    def _build(self, width: float) -> ImportanceNet:
        """A fresh network of ``width`` with its importance layer (all ones)."""
        layers, _ = self._structure()
        kw = {"width": width} if self.capacity is not None else {}
        base = seeded((self.seed, 0x7A1), lambda: self.model_spec(**kw))
        paths = {layer: path for layer, (path, _) in layers.items()}
        return ImportanceNet(base, paths).to(self.device)

    def _net(self, width: float) -> ImportanceNet:
        """The worker's reusable network of ``width`` (weights overwritten per client)."""
        nets = self.__dict__.setdefault("_nets", {})
        if width not in nets:
            nets[width] = self._build(width)
        return nets[width]

    def cost_model(self, client_id: int) -> nn.Module:
        """The client's submodel with its importance layer."""
        return self._build(self.client_width(client_id))

    # ------------------------------------------------------------------ server side
    def init_server(self) -> None:
        self.model = seeded((self.seed, 0x7A1), self.model_spec).to(self.device)
        layers, _ = self._structure()
        ones = {layer: torch.ones(c) for layer, (_, c) in layers.items()}
        self.importance = [dict(ones) for _ in range(self.num_clients)]
        self.keep: list[dict[str, torch.Tensor]] = []
        for cid in range(self.num_clients):
            k = self.kept(cid)
            self.keep.append({layer: select_filters(ones[layer], k[layer]) for layer in layers})
            self.importance[cid] = {
                layer: self._zero_pruned(ones[layer], self.keep[cid][layer]) for layer in layers
            }
        self._mean: CoverMean | None = None
        self._pending: dict[int, dict[str, torch.Tensor]] = {}

    @staticmethod
    def _zero_pruned(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(values)
        out[keep] = values[keep]
        return out

    def _client_index(self, client_id: int) -> dict[str, Index]:
        _, axes = self._structure()
        return submodel_index(self.model.state_dict(), axes, self.keep[client_id])

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        _, axes = self._structure()
        sub = extract(self.model.state_dict(), axes, self.keep[client_id])
        for layer, keep in self.keep[client_id].items():
            sub[f"importance.{layer}"] = self.importance[client_id][layer][keep].clone()
        return sub

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = CoverMean(self.model.state_dict())
        self._pending = {}

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        cid = result.client_id
        weights = {k: v for k, v in result.upload.items() if not k.startswith("importance.")}
        weight = result.num_samples / self.client_width(cid)
        self._mean.add(weights, self._client_index(cid), weight)
        self._pending[cid] = {
            k.split(".", 1)[1]: v.detach().cpu()
            for k, v in result.upload.items()
            if k.startswith("importance.")
        }

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        if self._mean.count:
            self.model.load_state_dict(self._mean.result())
        for cid, values in self._pending.items():
            for layer, v in values.items():
                self.importance[cid][layer][self.keep[cid][layer]] = v.to(torch.float32)
        self._retune()
        self._mean, self._pending = None, {}

    def _retune(self) -> None:
        """Re-select every client's filters by its own and similar clients' importance."""
        scores, peers = tuned_scores(self.importance, float(self.params.tune))  # type: ignore[attr-defined]
        for cid in range(self.num_clients):
            k = self.kept(cid)
            for layer, old in self.keep[cid].items():
                new = select_filters(scores[cid][layer], k[layer])
                values = self.importance[cid][layer]
                top = float(values.abs().max())
                entering = new[~torch.isin(new, old)]
                fresh = values.clone()
                fresh[entering] = (peers[cid][layer][entering] * top).to(values.dtype)
                self.importance[cid][layer] = self._zero_pruned(fresh, new)
                self.keep[cid][layer] = new

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The client's submodel as broadcast: its filters and its importance layer (the
        server sent both and the client uploads both trained), exactly simulated."""
        from flcore.attacks.surface import ModelSurface

        net = self._build(self.client_width(client_id))
        return ModelSurface(net, broadcast, label_key="head.bias")

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "importance": [{k: v.clone() for k, v in c.items()} for c in self.importance],
            "keep": [{k: v.clone() for k, v in c.items()} for c in self.keep],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.importance = [{k: v.clone() for k, v in c.items()} for c in state["importance"]]
        self.keep = [{k: v.clone() for k, v in c.items()} for c in state["keep"]]

    # ------------------------------------------------------------------ client side
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        net = self._net(self.client_width(task.client_id))
        self._client_model = net  # the contract checks the upload does not alias it
        net.load_state_dict(task.payload)
        reg = float(self.params.reg)  # type: ignore[attr-defined]

        def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            ce = F.cross_entropy(model(x), y)
            scales = torch.cat(list(model.importance.values()))  # type: ignore[union-attr]
            return ce + reg * scales.abs().mean()

        metrics = self.client_eval(task, net, data, before=True)
        opt = self.local_optimizer(net.parameters(), round=task.round)
        metrics["train_loss"] = self.run_epochs(net, data, opt, generator, loss_fn=loss_fn)
        metrics |= self.client_eval(task, net, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
