"""FLANC: Mei, Guo, Zhou & Patel, "Resource-Adaptive Federated Learning with All-In-One Neural
Composition", NeurIPS 2022, as Pa3dFL describes it (Wang et al., Eq. 3 and Eq. 33, Appendix D.3).

Every layer but the head is composed from a shared neural basis and per-width coefficients
(Pa3dFL Eq. 3). A weight theta of T output and S input channels, each input channel feeding an
``area`` of A weights (k x k for a conv), is

    theta' = theta_u theta_v = [theta_u theta_v,1, ..., theta_u theta_v,ST/R1],
    theta_u in R^{A R1 x R2} (the basis),  theta_v in R^{R2 x S T / R1} (the coefficients),

column (o, g) of theta' being output channel o's weights over input channels g R1 .. (g+1) R1
(Reshape_FLANC). The width-p model has T p outputs and S p inputs, so its coefficients have
S p T p / R1 columns; the basis is the same at every width.

Server and rounds: the server keeps one basis per layer and, for each width level, its own
coefficients, biases and head. A width-p client receives the basis and level p's part, trains
the composed width-p network for E epochs on

    CE + lambda (1/L) sum_l ||theta_u,l^T theta_u,l - I||_F^2        (Pa3dFL Eq. 33)

over the L decomposed layers, and uploads all it received, trained. The basis is averaged over
every client of the round; each level's coefficients, biases and head only over the round's
clients of that width (a level no client of the round has keeps its values).

Choices where the papers are silent, and deviations, stated:
- Which layers: all but the head (Pa3dFL Sec. 3: linear layers are the k = 1 case). The first
  fully-connected layer reads each conv2 channel as a block of 7 x 7 inputs, so it is decomposed
  with A = 49 over conv2's channels (the same as a linear layer whose R1 is 49 times larger).
- R1 = S p_min for a layer whose inputs scale with width (the narrowest width's input channel
  count, so R1 divides S p at every width the capacity rule gives) and R1 = S for the first
  layer (image channels do not scale); R2 = min(A R1, max(min(S, T), A)): Pa3dFL's own rule
  (Eq. 5: max(min(S, T), k^2) for convolutions, R1 for linear layers), capped at A R1 so that the
  basis can have orthonormal columns. For ``pa3dfl_cnn_fmnist`` with p_min = 1/16:
  (R1, R2) = (1, 25), (2, 32), (4, 64), (32, 32). Without a capacity setting p_min = 1/16 (the
  capacity default) and every client has width 1.
- Head: one head per width level (width p reads 128 p features), aggregated like the
  coefficients, as the authors' code aggregates every non-basis tensor per level.
- Biases of decomposed layers are per level, like the coefficients (authors' code).
- Averages are ``n_i``-weighted (as FedAvg here); the authors' code averages uniformly.
- Initialisation: each basis orthogonal (the authors' code); coefficients uniform with the
  variance that makes the composed weights' variance PyTorch's default, 1 / (3 fan_in), given an
  orthonormal basis; biases and head as PyTorch's defaults. Levels are initialised apart.
- The regulariser is Eq. 33's squared Frobenius norm (the authors' code takes its mean, an
  L2 loss, over the R2 x R2 entries).
- No DP mechanism. The hyperparameters of Pa3dFL Table 7 (FMNIST): lr 0.1, lambda 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from flcore.algorithms.aggregate import WeightedMean
from flcore.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmParams,
    ClientData,
    ClientResult,
    ClientTask,
    ModelSpec,
    seeded,
)
from flcore.errors import ConfigError
from flcore.models.scalable import ScalableModel, scaled

__all__ = [
    "FLANC",
    "FlancParams",
    "FactorSpec",
    "FlancDecomposition",
    "ComposedNet",
    "compose",
    "orthogonality",
]

#: p_min when there is no capacity setting (flcore.capacity's default)
DEFAULT_P_MIN = 1 / 16


def compose(basis: torch.Tensor, coef: torch.Tensor, out_ch: int, in_ch: int, r1: int):  # type: ignore[no-untyped-def]
    """Pa3dFL Eq. 3: ``theta' = basis @ coef`` reshaped by channels to ``[out_ch, in_ch * A]``.

    Args:
        basis: ``[A R1, R2]``; row ``c A + a`` is input channel ``c`` (of R1), position ``a``.
        coef: ``[R2, out_ch in_ch / R1]``; column ``o (in_ch / R1) + g`` gives output channel
            ``o``'s weights over input channels ``g R1 .. (g + 1) R1``.

    Returns:
        ``[out_ch, in_ch * A]``, input-channel-major (reshape to a conv's ``[T, S, k, k]``).
    """
    cols = (basis @ coef).t()  # [out_ch * in_ch / R1, R1 * A]
    return cols.reshape(out_ch, in_ch // r1, -1).reshape(out_ch, -1)


def orthogonality(bases: Sequence[torch.Tensor]) -> torch.Tensor:
    """Pa3dFL Eq. 33 without lambda: ``(1/L) sum_l ||U_l^T U_l - I||_F^2``."""
    terms = [
        (u.t() @ u - torch.eye(u.shape[1], dtype=u.dtype, device=u.device)).pow(2).sum()
        for u in bases
    ]
    return torch.stack(terms).mean()


@dataclass(frozen=True)
class FactorSpec:
    """One decomposed layer of a width-scalable model.

    Attributes:
        layer: the layer's state-key prefix in the model (``features.3``).
        out_channels, in_channels: T and S at full width (S counts input channels, not inputs).
        area: weights per (output, input) channel pair: k*k for a conv, the block of inputs each
            input channel feeds for a linear layer.
        in_scaled: whether the input channels scale with width (not for the first layer).
        r1, r2: the decomposition's coefficients.
        weight_shape: the full-width weight's shape (its length says conv or linear).
    """

    layer: str
    out_channels: int
    in_channels: int
    area: int
    in_scaled: bool
    r1: int
    r2: int
    weight_shape: tuple[int, ...]

    @property
    def key(self) -> str:
        """The layer's name inside :class:`ComposedNet` (``features_3``)."""
        return self.layer.replace(".", "_")

    def channels(self, width: float) -> tuple[int, int]:
        """(T_p, S_p) at ``width``."""
        t = scaled(self.out_channels, width)
        s = scaled(self.in_channels, width) if self.in_scaled else self.in_channels
        return t, s

    def basis_shape(self) -> tuple[int, int]:
        return self.area * self.r1, self.r2

    def coef_shape(self, width: float) -> tuple[int, int]:
        t, s = self.channels(width)
        return self.r2, t * s // self.r1

    def weight_shape_at(self, width: float) -> tuple[int, ...]:
        t, s = self.channels(width)
        if len(self.weight_shape) == 4:
            return (t, s, *self.weight_shape[2:])
        return t, s * self.area


class FlancDecomposition:
    """FLANC's decomposition (Pa3dFL Eq. 3) of a width-scalable model's layers.

    Interface: :attr:`factors` lists the decomposed layers (every layer with a weight but the
    head, from the model's ``CHANNEL_AXES``) with their R1 and R2; :meth:`weights` composes the
    state tensors of the width-p model (``features.*`` weights and biases, and the head) from a
    :class:`ComposedNet`'s parameters; :meth:`net` builds that network. R1 and R2 follow the
    rule in the module docstring; pass ``ranks`` ({layer: (R1, R2)}) to choose others.

    Raises:
        ConfigError: (``model``) the model is not width-scalable, or an R1 does not divide the
            input channels of every width of ``p_min``.
    """

    def __init__(
        self,
        spec: ModelSpec,
        p_min: float = DEFAULT_P_MIN,
        ranks: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.spec = spec
        self.p_min = p_min
        with torch.device("meta"):  # shapes only
            full = spec(width=1.0) if _scalable(spec) else spec()
        if not isinstance(full, ScalableModel) or not full.CHANNEL_AXES:
            raise ConfigError(
                "model",
                f"FLANC decomposes a width-scalable model (pa3dfl_cnn_fmnist, "
                f"pa3dfl_cnn_cifar100), got {spec.name!r}",
            )
        state = full.state_dict()
        factors = []
        for key, axes in full.channel_axes().items():
            layer = key.removesuffix(".weight")
            if not key.endswith(".weight") or layer == "head":
                continue
            shape = tuple(state[key].shape)
            by_axis = {axis: block for axis, _, block in axes}
            block = by_axis.get(1, 1)
            in_ch = shape[1] // block
            area = block * math.prod(shape[2:])
            in_scaled = 1 in by_axis
            if ranks is not None and layer in ranks:
                r1, r2 = ranks[layer]
            else:
                c = in_ch * p_min if in_scaled else in_ch
                r1 = round(c)
                if r1 < 1 or abs(c - r1) > 1e-9:
                    raise ConfigError(
                        "capacity.p_min",
                        f"FLANC: p_min {p_min:g} gives layer {layer} ({in_ch} input channels) "
                        "no whole R1",
                    )
                r2 = min(area * r1, max(min(in_ch, shape[0]), area))
            factors.append(FactorSpec(layer, shape[0], in_ch, area, in_scaled, r1, r2, shape))
        self.factors: tuple[FactorSpec, ...] = tuple(factors)

    def check_width(self, width: float) -> None:
        """Raise ValueError if R1 does not divide some layer's input channels at ``width``."""
        for f in self.factors:
            _, s = f.channels(width)
            if s % f.r1:
                raise ValueError(f"width {width:g}: R1 = {f.r1} does not divide {s} ({f.layer})")

    def weights(self, params: Mapping[str, torch.Tensor], width: float) -> dict[str, torch.Tensor]:
        """The width-p model's state tensors composed from :class:`ComposedNet` parameters."""
        out = {}
        for f in self.factors:
            t, s = f.channels(width)
            w = compose(params[f"layers.{f.key}.basis"], params[f"layers.{f.key}.coef"], t, s, f.r1)
            out[f"{f.layer}.weight"] = w.reshape(f.weight_shape_at(width))
            out[f"{f.layer}.bias"] = params[f"layers.{f.key}.bias"]
        out["head.weight"] = params["head.weight"]
        out["head.bias"] = params["head.bias"]
        return out

    def net(self, width: float) -> ComposedNet:
        """A :class:`ComposedNet` at ``width`` (parameters initialised as FLANC's module doc
        says; draws from torch's global RNG: wrap in :func:`seeded`)."""
        self.check_width(width)
        return ComposedNet(self, width)


def _scalable(spec: ModelSpec) -> bool:
    from flcore.models import MODELS

    cls = MODELS.get(spec.name)
    return isinstance(cls, type) and issubclass(cls, ScalableModel)


class _Factor(nn.Module):
    def __init__(self, f: FactorSpec, width: float) -> None:
        super().__init__()
        self.basis = nn.Parameter(torch.empty(f.basis_shape()))
        self.coef = nn.Parameter(torch.empty(f.coef_shape(width)))
        t, s = f.channels(width)
        self.bias = nn.Parameter(torch.empty(t))
        fan_in = s * f.area
        nn.init.orthogonal_(self.basis)
        # composed entries have variance var(coef) * R2 / (A R1) for an orthonormal basis
        bound = math.sqrt(f.area * f.r1 / (f.r2 * fan_in))
        nn.init.uniform_(self.coef, -bound, bound)
        nn.init.uniform_(self.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))


class ComposedNet(nn.Module):
    """The width-p network whose layers are composed from basis and coefficients on every
    forward pass (so FLOPs and memory include the composition).

    Parameters: ``layers.<layer>.basis`` / ``.coef`` / ``.bias`` per decomposed layer
    (``<layer>`` with ``_`` for ``.``: ``features_3``) and ``head.weight``, ``head.bias``.
    """

    def __init__(self, decomposition: FlancDecomposition, width: float) -> None:
        super().__init__()
        self.width = width
        self.decomposition = [decomposition]  # a list: not a submodule
        self.layers = nn.ModuleDict({f.key: _Factor(f, width) for f in decomposition.factors})
        template = decomposition.spec(width=width)
        self.head = template.head  # a real layer; the rest of the template only gives structure
        template.features.to("meta")  # its weights are always replaced by composed ones
        self._template = [template]  # a list: not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = dict(self.named_parameters())
        weights = self.decomposition[0].weights(params, self.width)
        return functional_call(self._template[0], weights, (x,))

    def bases(self) -> list[torch.Tensor]:
        return [m.basis for m in self.layers.values()]  # type: ignore[union-attr]


class FlancParams(AlgorithmParams):
    lam: float = Field(
        1.0,
        ge=0,
        description="lambda of the basis orthogonality regulariser (Pa3dFL Eq. 33; "
        "Table 7, FMNIST: 1.0)",
    )


@ALGORITHMS.register("flanc")
class FLANC(Algorithm):
    """A shared neural basis (averaged by all) with per-width coefficients (averaged per width)."""

    name = "flanc"
    capacity_aware = True
    static_bn_ok = False  # it rebuilds (or gates) the layers; no rule for BatchNorm
    Params = FlancParams

    # ----------------------------------------------------------------- models
    @property
    def decomposition(self) -> FlancDecomposition:
        if getattr(self, "_decomposition", None) is None:
            p_min = self.capacity.p_min if self.capacity is not None else DEFAULT_P_MIN
            self._decomposition = FlancDecomposition(self.model_spec, p_min)
        return self._decomposition

    def levels(self) -> tuple[float, ...]:
        return self.capacity.levels if self.capacity is not None else (1.0,)

    def _net(self, width: float) -> ComposedNet:
        return seeded((self.seed, 0x1417), lambda: self.decomposition.net(width))

    def cost_model(self, client_id: int) -> nn.Module:
        return self._net(self.client_width(client_id)).to(self.device)

    # ----------------------------------------------------------------- server side
    def init_server(self) -> None:
        nets = {w: self._net(w) for w in self.levels()}
        widest = nets[max(nets)].state_dict()
        self.basis = {k: v.clone() for k, v in widest.items() if k.endswith(".basis")}
        self.level = {
            w: {k: v.clone() for k, v in net.state_dict().items() if not k.endswith(".basis")}
            for w, net in nets.items()
        }
        self._basis_mean: WeightedMean | None = None
        self._level_mean: dict[float, WeightedMean] = {}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return {**self.basis, **self.level[self.client_width(client_id)]}

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._basis_mean = WeightedMean()
        self._level_mean = {}

    def accumulate(self, result: ClientResult) -> None:
        assert self._basis_mean is not None, "begin_round was not called"
        n = float(result.num_samples)
        up = result.upload
        self._basis_mean.add({k: v for k, v in up.items() if k.endswith(".basis")}, n)
        mean = self._level_mean.setdefault(self.client_width(result.client_id), WeightedMean())
        mean.add({k: v for k, v in up.items() if not k.endswith(".basis")}, n)

    def end_round(self, round: int) -> None:
        assert self._basis_mean is not None, "begin_round was not called"
        if self._basis_mean.count:
            self.basis = self._basis_mean.result()
        for width, mean in self._level_mean.items():
            self.level[width] = mean.result()
        self._basis_mean, self._level_mean = None, {}

    def global_model(self) -> nn.Module:
        """The widest level's composed network."""
        width = max(self.levels())
        net = self._net(width).to(self.device)
        net.load_state_dict({**self.basis, **self.level[width]})
        return net

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The broadcast basis and level: the client's whole composed network."""
        from flcore.attacks.surface import ModelSurface

        net = self._net(self.client_width(client_id)).to(self.device)
        return ModelSurface(net, broadcast, label_key="head.bias")

    def state_dict(self) -> dict[str, Any]:
        return {
            "basis": {k: v.clone() for k, v in self.basis.items()},
            "level": {w: {k: v.clone() for k, v in d.items()} for w, d in self.level.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.basis = {k: v.clone() for k, v in state["basis"].items()}
        self.level = {w: {k: v.clone() for k, v in d.items()} for w, d in state["level"].items()}

    # ----------------------------------------------------------------- client side
    def _client_net(self, width: float) -> ComposedNet:
        nets = self.__dict__.setdefault("_nets", {})
        if width not in nets:
            nets[width] = self._net(width).to(self.device)
        return nets[width]

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FlancParams)
        net = self._client_net(self.client_width(task.client_id))
        net.load_state_dict(task.payload)
        metrics: dict[str, Any] = self.client_eval(task, net, data, before=True)

        def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            ce = F.cross_entropy(model(x), y)
            return ce + p.lam * orthogonality(net.bases()) if p.lam else ce

        opt = self.local_optimizer(net.parameters(), round=task.round)
        metrics["train_loss"] = self.run_epochs(net, data, opt, generator, loss_fn=loss)
        metrics |= self.client_eval(task, net, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
