"""FedAlign: Mendieta, Yang, Wang, Lee, Ding & Chen, "Local Learning Matters: Rethinking Data
Heterogeneity in Federated Learning", CVPR 2022.

FedAvg whose local objective adds a Lipschitz-matching regulariser on the network's last block.
Per mini-batch, following the paper (Sec. 4) and the authors' code (github.com/mmendiet/FedAlign):

1. the full-width network runs; its cross-entropy is L_CE. The last block's input X and output
   Y are kept.
2. the width-p sub-network of that block (p = ``width``) runs on the first p*C_in channels of X,
   detached, giving Y_p.
3. each block's transmission matrix, per record, is ``T(A, B) = A B^T / HW`` with A the input
   (C_in x HW, average-pooled to the output's H x W) and B the output (C_out x HW); its
   Lipschitz estimate is ``sigma = sqrt(lambda_max(T T^T))``, the top singular value of T,
   with lambda_max from ``power_iterations`` steps of power iteration from the all-ones vector
   (gradients flow through the iterations, as in the code).
4. ``L_reg = mean_records (sigma_p - sigma_full)^2`` with sigma_full detached (the full network
   is the target), and

       loss = L_CE + mu * (L_CE / L_reg) * L_reg        (the two ratios' values held constant),

   the code's balancing: the regulariser's value is rescaled to mu x L_CE, so mu sets the ratio
   of the two terms (``mu = 0.45``, ``width = 0.25``: FedHKD's settings, App. A.1, and the
   authors' defaults). Gradients are clipped to norm ``max_grad_norm`` (10 in the code).

Only the sub-block's weights (the first p*C_out filters over the first p*C_in input channels,
and their bias / normalisation entries) receive the regulariser's gradient: they are shared
with the full network, which is how aligning the sub-network regularises the full one.

Where our models differ from the paper's, and the choices made, stated plainly:
- The paper's networks are slimmable ResNets; ours are plain :class:`SplitModel`s. The width-p
  sub-network is formed by nested slicing, as ``flcore.algorithms.widths.slicing`` does for
  width-scalable models: the first ``max(1, round(p C))`` channels of the block's input and
  output (no rounding to multiples of 8, the code's ``make_divisible``).
- "The last block" is the last ``nn.Conv2d`` of ``model.features`` (in module order) together
  with the ``BatchNorm2d`` and the elementwise activation that directly follow it in its parent
  module, where present. In the paper it is the network's last residual stage (ResNet's
  ``layer3``, several residual blocks with their skip connections); for ``cnn_fmnist`` (two
  conv stages, then a fully-connected layer) it is the second convolution and its LeakyReLU,
  with X of 16 x 12 x 12 and Y of 32 x 10 x 10; the max-pool and the fully-connected layer
  that follow are not in it. For a residual network (``fedhkd_resnet18``) it is the last
  convolution with its normalisation, not the whole residual block: a departure. For
  ``fedhkd_shufflenet`` (SVHN) it is ``conv5``, one 1 x 1 convolution (464 -> 1024) with its
  BN and ReLU. A grouped
  convolution is sliced only when depthwise; a model whose features hold no convolution is
  refused (a vector block's transmission matrix is rank one and estimates nothing).
- The sub-block's batch normalisation, if any, uses the batch's statistics and leaves the
  running statistics alone (the code's switchable batch norm keeps none for sub-widths).
- A guard of 1e-12 on the power-iteration norm and on L_reg's value (a dead feature map would
  otherwise give 0/0); the code has none.
- ``train_loss`` is the mean cross-entropy, as FedAvg reports it (the regulariser's value is,
  by the balancing, always mu x L_CE).
- The code's SGD with Nesterov momentum 0.9 is replaced by the run's configured optimizer (Adam
  in FedHKD's protocol), as for every baseline.
- Privacy: client-level DP acts at aggregation and is FedAvg's unchanged. DP-SGD is not
  offered: its per-sample gradients are of the cross-entropy only.
- Attack surface: FedAvg's (the cross-entropy gradient at the broadcast); the regulariser's
  gradient (nonzero at the start) is not simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from flcore.algorithms.base import ALGORITHMS, AlgorithmParams, ClientData
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.training import LossFn
from flcore.errors import ConfigError

__all__ = [
    "FedAlign",
    "FedAlignParams",
    "LastBlock",
    "fedalign_loss",
    "find_last_block",
    "lipschitz_estimate",
    "sub_block_forward",
    "transmission_matrix",
]

#: elementwise activations that may close the last block
_ACTIVATIONS = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Hardswish,
    nn.Tanh,
    nn.Sigmoid,
)
_EPS = 1e-12


class FedAlignParams(AlgorithmParams):
    mu: float = Field(
        0.45, ge=0, description="balancing weight mu of the regulariser (FedHKD App. A.1: 0.45)"
    )
    width: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="fractional width p of the sub-network (FedHKD App. A.1: 0.25)",
    )
    power_iterations: int = Field(
        10, ge=1, description="power-iteration steps of the Lipschitz estimate (code: 10)"
    )
    max_grad_norm: float | None = Field(
        10.0, gt=0, description="local gradient-norm clip; null: none (FedAlign's code: 10)"
    )


@dataclass(frozen=True)
class LastBlock:
    """The block FedAlign regularises: a convolution, then optional norm and activation."""

    conv: nn.Conv2d
    norm: nn.BatchNorm2d | None = None
    act: nn.Module | None = None

    @property
    def last(self) -> nn.Module:
        """The module whose output is the block's output."""
        return self.act or self.norm or self.conv


def find_last_block(model: nn.Module) -> LastBlock:
    """The last ``nn.Conv2d`` of ``model.features`` with the batch norm and activation that
    directly follow it in its parent module (see the module doc).

    Raises:
        ConfigError: the features hold no convolution, or it cannot be sliced.
    """
    features: nn.Module = model.features  # type: ignore[assignment]
    convs = [k for k, m in features.named_modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        raise ConfigError("model", "fedalign needs a convolution in the model's features")
    path, _, name = convs[-1].rpartition(".")
    parent = features.get_submodule(path)
    children = list(parent.named_children())
    i = [n for n, _ in children].index(name)
    conv = children[i][1]
    assert isinstance(conv, nn.Conv2d)
    if conv.groups != 1 and not (conv.groups == conv.in_channels == conv.out_channels):
        raise ConfigError("model", "fedalign slices only plain or depthwise last convolutions")
    if conv.padding_mode != "zeros":
        raise ConfigError("model", "fedalign slices only zero-padded last convolutions")
    rest = [m for _, m in children[i + 1 : i + 3]]
    norm = rest.pop(0) if rest and isinstance(rest[0], nn.BatchNorm2d) else None
    act = rest[0] if rest and isinstance(rest[0], _ACTIVATIONS) else None
    return LastBlock(conv, norm, act)


def _kept(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def sub_block_forward(block: LastBlock, x: torch.Tensor, width: float) -> torch.Tensor:
    """The width-``width`` sub-block on ``x``, already cut to its first input channels."""
    conv = block.conv
    depthwise = conv.groups != 1
    c_out = x.shape[1] if depthwise else _kept(conv.out_channels, width)
    weight = conv.weight[:c_out] if depthwise else conv.weight[:c_out, : x.shape[1]]
    bias = conv.bias[:c_out] if conv.bias is not None else None
    out = F.conv2d(
        x, weight, bias, conv.stride, conv.padding, conv.dilation, c_out if depthwise else 1
    )
    if block.norm is not None:
        n = block.norm
        w = n.weight[:c_out] if n.weight is not None else None
        b = n.bias[:c_out] if n.bias is not None else None
        out = F.batch_norm(out, None, None, w, b, True, 0.0, n.eps)
    return block.act(out) if block.act is not None else out


def transmission_matrix(fm_in: torch.Tensor, fm_out: torch.Tensor) -> torch.Tensor:
    """``A B^T / HW`` per record: ``[b, C_in, C_out]`` from ``[b, C_in, H', W']`` (pooled to
    ``H x W`` when it differs) and ``[b, C_out, H, W]``."""
    if fm_in.shape[2:] != fm_out.shape[2:]:
        fm_in = F.adaptive_avg_pool2d(fm_in, fm_out.shape[2:])
    a = fm_in.flatten(2)
    b = fm_out.flatten(2).transpose(1, 2)
    return torch.bmm(a, b) / a.shape[2]


def lipschitz_estimate(tm: torch.Tensor, iterations: int) -> torch.Tensor:
    """Per record, ``sqrt(lambda_max(T T^T))`` by power iteration from the all-ones vector:
    the top singular value of T (``[b]``)."""
    k = torch.bmm(tm, tm.transpose(1, 2))
    v = torch.ones(k.shape[0], k.shape[1], 1, dtype=k.dtype, device=k.device)
    for _ in range(iterations):
        m = torch.bmm(k, v)
        n = m.norm(dim=1, keepdim=True).clamp_min(_EPS)
        v = m / n
    return n.flatten().sqrt()


def fedalign_loss(block: LastBlock, mu: float, width: float, iterations: int) -> LossFn:
    """The ``loss_fn`` hook: L_CE + mu * (L_CE / L_reg) * L_reg on ``block`` (a block of the
    trained model); its value is L_CE alone (the regulariser enters the gradient only)."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen: dict[str, torch.Tensor] = {}
        hooks = [
            block.conv.register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0])),
            block.last.register_forward_hook(lambda m, a, o: seen.__setitem__("out", o)),
        ]
        try:
            ce = F.cross_entropy(model(x), y)
        finally:
            for h in hooks:
                h.remove()
        if mu == 0:
            return ce
        x_in = seen["in"].detach()
        x_sub = x_in[:, : _kept(x_in.shape[1], width)]
        with torch.no_grad():
            target = lipschitz_estimate(transmission_matrix(x_in, seen["out"]), iterations)
        sub = lipschitz_estimate(
            transmission_matrix(x_sub, sub_block_forward(block, x_sub, width)), iterations
        )
        reg = F.mse_loss(sub, target)
        term = mu * (ce.detach() / reg.detach().clamp_min(_EPS)) * reg
        return ce + (term - term.detach())  # value: CE; gradient: CE's + the term's

    return loss


@ALGORITHMS.register("fedalign")
class FedAlign(FedAvg):
    """FedAvg with FedAlign's Lipschitz-matching regulariser on the last block."""

    name = "fedalign"
    privacy_mechanisms = frozenset({"client"})
    Params = FedAlignParams

    def init_server(self) -> None:
        super().init_server()
        find_last_block(self.model)  # a model FedAlign cannot slice fails before any round

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
    ) -> float:
        """E epochs of L_CE plus the balanced regulariser, gradient-norm clipped."""
        p = self.params
        assert isinstance(p, FedAlignParams)
        opt = optimizer or self.local_optimizer(model.parameters(), round=round)
        loss_fn = fedalign_loss(find_last_block(model), p.mu, p.width, p.power_iterations)
        return self.run_epochs(
            model,
            data,
            opt,
            generator,
            epochs=epochs,
            loss_fn=loss_fn,
            max_grad_norm=p.max_grad_norm,
        )
