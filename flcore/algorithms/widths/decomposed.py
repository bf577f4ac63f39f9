"""Channel-aware decomposed layers: each weight is recovered as theta = Reshape(U V).

Pa3dFL (Wang, Wang, Peng, Wang & Wang, "Selective Knowledge Sharing for Personalized Federated
Learning Under Capacity Heterogeneity", arXiv 2405.20589, 2024), Sec. 3.1, Eqs. 4-5, 10. A conv
weight ``theta`` of ``T`` output channels, ``S`` input channels and kernel ``k`` (a linear layer is
the ``k = 1`` case) is

    theta' = U V,   U = [u_1; ...; u_R1] (k^2 R1 x R2),   V = [v_1, ..., v_J] (R2 x J S),

with ``u_i`` of shape ``k^2 x R2``, ``v_j`` of shape ``R2 x S``, ``J = T / R1`` and output channel
``o_ij = u_i v_j`` (``k^2 x S``: one filter). Eq. 5 sets ``R1 = T p_min`` and ``R2 = max(min(S, T),
k^2)`` for a conv, ``R2 = R1`` for a linear layer; so ``J = 1 / p_min`` in every layer.

Storage and channel order (the paper leaves Reshape_PadFL open):

- ``U`` is stored as ``[R1, k^2, R2]`` (row block ``i`` is ``u_i``; ``U.reshape(-1, R2)`` is the
  paper's ``k^2 R1 x R2`` matrix), ``V`` as ``[J, R2, S]`` (``V[j]`` is ``v_j``).
- The recovered weight's output channel ``c = j R1 + i`` is ``u_i v_j``, and ``u_i v_j``'s
  ``(a, s)`` entry is kernel position ``a`` (row-major ``ky k + kx``) of input channel ``s``.
  Pruning to width ``p`` keeps ``v_j`` for ``j < p J`` (Eq. 10), i.e. exactly the first ``p T``
  output channels, and each ``v_j``'s first ``p S`` inputs; so the width-p network is the
  sub-network of the full recovered one on its first ``p T`` channels of every layer, the next
  layer's input pruning keeps exactly those channels, and a linear layer after a flatten keeps
  the first ``p C`` channel blocks of ``h w`` inputs each (the prefix of its inputs).
- Biases are not decomposed: each layer has a bias of ``T`` values, personal (Pa3dFL generates it
  with the layer's ``V``) and pruned with its channels (the first ``p T``).

FLANC's decomposition (Pa3dFL Eq. 3, ``scheme="flanc"``: the ablation of Pa3dFL's Table 3) is
the other scheme: ``theta' = U V`` with a basis ``U`` of ``A R1 x R2`` (``A`` the weights each
input channel feeds: ``k^2``, or ``k^2`` times the block of inputs a channel of a flattened
feature map gives a linear layer) and coefficients ``V`` of ``R2 x T S / R1``, the column of
output channel ``o`` and input group ``g`` giving ``o``'s weights over input channels
``g R1 .. (g + 1) R1``; so ``U`` is shared by every output channel. ``R1`` and ``R2`` are
:mod:`flcore.algorithms.widths.flanc`'s (``R1 = S p_min``, ``S`` for the first layer;
``R2 = min(A R1, max(min(S, T), A))``), in input channels. Stored as ``U [R1, A, R2]`` and
``V [T, R2, S / R1]``, pruning to width ``p`` keeps ``V[:p T, :, :p S / R1]``: Pa3dFL Sec. 3.1's
"reducing the columns of theta_v to S p T p / R1", again the sub-network on the first channels.

:class:`DecomposedNet` turns any :class:`~flcore.models.SplitModel` whose ``features`` is a
``Sequential`` of ``Conv2d`` (groups 1) / ``Linear`` layers and parameter-free modules into its
decomposed form at one width; the head is not decomposed (Pa3dFL keeps a fixed global head and a
generated local head, both plain linear layers).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LayerPlan",
    "ranks",
    "flanc_ranks",
    "layer_plans",
    "recover",
    "recover_flanc",
    "recover_weight",
    "DecomposedConv2d",
    "DecomposedLinear",
    "DecomposedNet",
    "orthogonality_penalty",
]

_EPS = 1e-6


def _whole(x: float, what: str) -> int:
    n = round(x)
    if n < 1 or abs(x - n) > _EPS:
        raise ValueError(f"{what} is {x:g}: it must be a whole, positive number")
    return n


def ranks(kind: Literal["conv", "linear"], T: int, S: int, k: int, p_min: float) -> tuple[int, int]:
    """(R1, R2) of Eq. 5: ``R1 = T p_min``; ``R2 = max(min(S, T), k^2)`` (conv) or ``R1``.

    Raises:
        ValueError: ``T p_min`` is not a whole number of channels.
    """
    r1 = _whole(T * p_min, f"R1 = T p_min = {T} x {p_min:g}")
    r2 = max(min(S, T), k * k) if kind == "conv" else r1
    return r1, r2


@dataclass(frozen=True)
class LayerPlan:
    """One decomposed layer: its position in ``features`` and its full and pruned sizes."""

    index: int
    kind: Literal["conv", "linear"]
    T: int  # full output channels
    S: int  # full inputs (channels, or features for a linear layer)
    k: int
    R1: int
    R2: int
    T_p: int  # output channels at this width
    S_p: int  # inputs at this width
    scheme: Literal["channel", "flanc"] = "channel"
    block: int = 1  # inputs per input channel beyond the kernel (a flattened map's h w)

    @property
    def J(self) -> int:
        """Number of ``v_j`` blocks at full width (``T / R1``; channel scheme)."""
        return self.T // self.R1

    @property
    def J_p(self) -> int:
        """Number of ``v_j`` blocks kept at this width (Eq. 10; channel scheme)."""
        return self.T_p // self.R1

    @property
    def A(self) -> int:
        """Weights each input channel feeds in one output channel (``k^2 block``)."""
        return self.k * self.k * self.block

    def u_shape(self) -> tuple[int, int, int]:
        """``U``'s stored shape (the same at every width)."""
        if self.scheme == "flanc":
            return self.R1, self.A, self.R2
        return self.R1, self.k * self.k, self.R2

    def v_rows(self, pruned: bool = True) -> tuple[int, int]:
        """``V`` as rows: (rows, values a row) at this width (``pruned``) or at full width;
        the width-p rows are the first rows' first values (a decoder's prefix)."""
        t, s = (self.T_p, self.S_p) if pruned else (self.T, self.S)
        if self.scheme == "flanc":
            return t * self.R2, s // (self.block * self.R1)
        return t // self.R1 * self.R2, s

    def v_shape(self) -> tuple[int, int, int]:
        """``V``'s stored shape at this width."""
        rows, row_len = self.v_rows()
        if self.scheme == "flanc":
            return self.T_p, self.R2, row_len
        return self.J_p, self.R2, row_len

    def v_cols(self) -> int:
        """Columns of ``V`` as the paper's ``R2 x (...)`` matrix at full width: ``J S``
        (channel scheme), ``T S / R1`` in input channels (FLANC)."""
        rows, row_len = self.v_rows(pruned=False)
        return rows * row_len // self.R2

    @property
    def key(self) -> str:
        return f"features.{self.index}"


def _weighted(features: nn.Module) -> list[tuple[int, nn.Module]]:
    if not isinstance(features, nn.Sequential):
        raise ValueError("decomposition needs a model whose features are an nn.Sequential")
    out = []
    for i, m in enumerate(features):
        if isinstance(m, nn.Conv2d):
            if m.groups != 1 or m.kernel_size[0] != m.kernel_size[1]:
                raise ValueError(f"features.{i}: only square, ungrouped convolutions decompose")
            out.append((i, m))
        elif isinstance(m, nn.Linear):
            out.append((i, m))
        elif any(True for _ in m.parameters()):
            raise ValueError(f"features.{i} ({type(m).__name__}) has parameters: cannot decompose")
    return out


def flanc_ranks(S: int, T: int, A: int, p_min: float, first: bool) -> tuple[int, int]:
    """(R1, R2) of FLANC's decomposition (flcore.algorithms.widths.flanc's rule), ``S`` in input
    channels: ``R1 = S p_min`` (``S`` for the first layer, whose inputs do not scale) and
    ``R2 = min(A R1, max(min(S, T), A))``.

    Raises:
        ValueError: ``S p_min`` is not a whole number of channels.
    """
    r1 = S if first else _whole(S * p_min, f"R1 = S p_min = {S} x {p_min:g}")
    return r1, min(A * r1, max(min(S, T), A))


def layer_plans(
    full: nn.Module,
    narrow: nn.Module,
    p_min: float,
    scheme: Literal["channel", "flanc"] = "channel",
) -> list[LayerPlan]:
    """The decomposed layers of ``full`` (width 1), pruned to the sizes of ``narrow`` (the same
    architecture at the client's width), in Pa3dFL's channel-aware scheme or FLANC's.

    Raises:
        ValueError: unsupported layers, or a width whose channel count is not a multiple of R1.
    """
    plans = []
    pairs = zip(_weighted(full.features), _weighted(narrow.features), strict=True)  # type: ignore[arg-type]
    prev_T = None
    for (i, f), (_, n) in pairs:
        if isinstance(f, nn.Conv2d):
            kind, T, S, k = "conv", f.out_channels, f.in_channels, f.kernel_size[0]
            T_p, S_p = n.out_channels, n.in_channels
        else:
            kind, T, S, k = "linear", f.out_features, f.in_features, 1
            T_p, S_p = n.out_features, n.in_features
        block = 1
        if scheme == "flanc":
            # a linear layer after a flattened conv map reads each channel as h w inputs
            if kind == "linear" and prev_T is not None and prev_T != S and S % prev_T == 0:
                block = S // prev_T
            r1, r2 = flanc_ranks(S // block, T, k * k * block, p_min, first=prev_T is None)
            if (S_p // block) % r1:
                raise ValueError(
                    f"features.{i}: {S_p // block} input channels at this width are not a "
                    f"multiple of R1 = {r1}"
                )
        else:
            r1, r2 = ranks(kind, T, S, k, p_min)  # type: ignore[arg-type]
            if T_p % r1:
                raise ValueError(
                    f"features.{i}: {T_p} channels at this width are not a multiple of R1 = {r1}"
                )
        plans.append(LayerPlan(i, kind, T, S, k, r1, r2, T_p, S_p, scheme, block))  # type: ignore[arg-type]
        prev_T = T
    return plans


def recover_weight(U: torch.Tensor, V: torch.Tensor, kind: str) -> torch.Tensor:
    """theta from ``U`` ``[R1, k^2, R2]`` and ``V`` ``[J, R2, S]``: channel ``j R1 + i`` is
    ``u_i v_j``; a conv weight ``[J R1, S, k, k]`` or a linear one ``[J R1, S]``."""
    r1, kk, _ = U.shape
    j, _, s = V.shape
    w = torch.einsum("iar,jrs->jisa", U, V).reshape(j * r1, s, kk)
    if kind == "linear":
        return w.reshape(j * r1, s)
    k = round(kk**0.5)
    return w.reshape(j * r1, s, k, k)


def recover_flanc(U: torch.Tensor, V: torch.Tensor, kind: str, k: int = 1) -> torch.Tensor:
    """theta from FLANC's basis ``U`` ``[R1, A, R2]`` and coefficients ``V`` ``[T, R2, G]``:
    output channel ``o``'s weights over input channel ``g R1 + i`` are ``U[i] V[o, :, g]``
    (``A`` values: a ``k x k`` kernel, or a linear layer's block of inputs); a conv weight
    ``[T, G R1, k, k]`` or a linear one ``[T, G R1 A]``."""
    r1, a, _ = U.shape
    t, _, g = V.shape
    w = torch.einsum("iar,org->ogia", U, V).reshape(t, g * r1, a)
    if kind == "linear":
        return w.reshape(t, g * r1 * a)
    return w.reshape(t, g * r1, k, k)


def recover(plan: LayerPlan, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """The layer's weight from ``U`` and ``V`` in its plan's scheme."""
    if plan.scheme == "flanc":
        return recover_flanc(U, V, plan.kind, plan.k)
    return recover_weight(U, V, plan.kind)


class _Decomposed(nn.Module):
    kind: str

    def __init__(self, plan: LayerPlan) -> None:
        super().__init__()
        self.plan = plan
        self.U = nn.Parameter(torch.zeros(plan.u_shape()))
        self.V = nn.Parameter(torch.zeros(plan.v_shape()))
        self.bias = nn.Parameter(torch.zeros(plan.T_p))

    def weight(self) -> torch.Tensor:
        """The recovered weight at this layer's width."""
        return recover(self.plan, self.U, self.V)


class DecomposedConv2d(_Decomposed):
    """A conv layer whose weight is recovered from ``U`` and the pruned ``V`` each forward pass."""

    kind = "conv"

    def __init__(self, plan: LayerPlan, like: nn.Conv2d) -> None:
        super().__init__(plan)
        self.stride, self.padding, self.dilation = like.stride, like.padding, like.dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight(), self.bias, self.stride, self.padding, self.dilation)


class DecomposedLinear(_Decomposed):
    """A linear layer whose weight is recovered from ``U`` and the pruned ``V``."""

    kind = "linear"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight(), self.bias)


class DecomposedNet(nn.Module):
    """A client's network at width p: decomposed ``features``, a frozen global ``head`` and a
    trainable ``local_head`` (Pa3dFL Algorithm 3). ``forward`` gives the global head's logits.

    Args:
        narrow: the plain architecture at the client's width (its non-weight modules are kept).
        plans: :func:`layer_plans` for that width.
        global_head: the fixed global head at this width (copied, frozen).
    """

    def __init__(self, narrow: nn.Module, plans: list[LayerPlan], global_head: nn.Linear) -> None:
        super().__init__()
        self.plans = plans
        layers = list(copy.deepcopy(narrow.features))
        for plan in plans:
            like = layers[plan.index]
            layers[plan.index] = (
                DecomposedConv2d(plan, like) if plan.kind == "conv" else DecomposedLinear(plan)
            )
        self.features = nn.Sequential(*layers)
        self.head = copy.deepcopy(global_head).requires_grad_(False)
        self.local_head = nn.Linear(global_head.in_features, global_head.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def general_keys(self) -> list[str]:
        """State keys of the general parameters (every layer's ``U``)."""
        return [f"{p.key}.U" for p in self.plans]

    def personal_keys(self) -> list[str]:
        """State keys of the personal parameters: ``V`` and bias of each layer, local head."""
        keys = [k for p in self.plans for k in (f"{p.key}.V", f"{p.key}.bias")]
        return [*keys, "local_head.weight", "local_head.bias"]

    def recovered_state(self, head: Literal["global", "local"]) -> dict[str, torch.Tensor]:
        """The plain width-p network's state: recovered weights, with the chosen head."""
        out: dict[str, torch.Tensor] = {}
        for p in self.plans:
            layer = self.features[p.index]
            out[f"{p.key}.weight"] = layer.weight()  # type: ignore[operator]
            out[f"{p.key}.bias"] = layer.bias  # type: ignore[assignment]
        h = self.head if head == "global" else self.local_head
        out["head.weight"], out["head.bias"] = h.weight, h.bias
        return out


def orthogonality_penalty(net: DecomposedNet) -> torch.Tensor:
    """Eq. 32 without its lambda: ``sum_conv ||S - diag(S)||^2`` with ``S = U^T U``."""
    total = torch.zeros(())
    for p in net.plans:
        if p.kind != "conv":
            continue
        u = net.features[p.index].U.reshape(-1, p.R2)  # type: ignore[union-attr]
        s = u.t() @ u
        total = total + (s - torch.diag_embed(torch.diagonal(s))).pow(2).sum()
    return total
