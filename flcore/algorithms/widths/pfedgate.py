"""pFedGate: Chen, Gao, Xie, Li & Ding, "Efficient Personalized Federated Learning via Sparse
Model-Adaptation", ICML 2023 (a capacity-aware baseline of Pa3dFL, Wang et al., Table 1;
Appendix D: B = 5, the gating layer's learning rate tuned, Table 7; Appendix D.4: costs).
Reference code: github.com/yxdyc/pFedGate (read to understand; this is our own code).

The server keeps one dense global model theta (full width) and averages it as FedAvg does
(weights n_i). Each client keeps a private gating layer g_i. Every parameter tensor of theta is
split into B blocks (``blocks``; flattened, ``ceil(n / B)`` entries each, the last one shorter),
and for each mini-batch x:

    score = mean_over_batch sigmoid(g_i(x))  in (0, 1)^{#blocks},  clipped below at min(1/B, r_i)
    S     = knapsack(values = score, sizes = block sizes, capacity = r_i * size)     (a 0/1 set)
    theta_i(x) = theta (.) expand(score * 1[S])                                   (block-wise)

and the client's loss is CE(f(x; theta_i(x)), y); one backward pass trains theta and g_i
together (the reference's ``bi_level_opt 0`` of its scripts). r_i is the client's capacity
ratio (``capacity.ratios[i]``; 1 without a capacity setting). The gating layer is the
reference's: a normalisation of the input, a linear map from the flattened image to one logit
per block, and a batch norm of the logits.

The knapsack follows the reference's block-wise solver (``found_max_value_greedy``): blocks in
descending value are taken while they fit, separately for the blocks of linear layers and of the
other layers (each group gets r_i of its own size, since linear layers hold most parameters),
and the first block of every tensor is protected first (taken ahead of the others, "to avoid
cutting the information flow").

Choices and deviations, stated plainly:

- Budget: the reference always keeps every tensor's first block and fills ``(s - 1/B)`` of the
  rest, which exceeds the budget when r_i < 1/B (e.g. Pa3dFL's Hetero clients with r ~ 0.01).
  Here the budget is strict, selected parameters <= r_i x the model's (per group): the
  protected first blocks are taken greedily too, in descending value, while they fit. A very
  small r_i can therefore leave a large layer with no active block (its output is its bias).
  On Pa3dFL's FMNIST CNN (B = 5) one block of conv2 is 19.7% of the conv group's parameters
  and one block of fc1 19.2% of the linear group's, so a client with r_i below about 0.197
  keeps no block of one of them and predicts one class whatever its input: under Hetero's
  r ~ U[0.01, 1] about a fifth of the clients score chance, and ``accuracy_worst_width``
  reads about 10%. (Pa3dFL's Hetero cell, 76.58, is close to what that would give.)
- Values are the raw gate scores (the reference rounds score x 10 to integers for its exact
  0/1 solver and ranks the rounded values); ties go to the lower block index.
- The selected blocks are multiplied by the clipped score (at least min(1/B, r_i)); the
  reference multiplies by the unclipped mean sigmoid and builds its 0/1 mask from the clipped
  score (a straight-through mask). The server averages the round's sampled clients (n_i
  weights); the reference's default (``aggregate_sampled_clients`` 0) averages over every
  client, the stale copies of those not sampled included.
- Gating learning rate: Pa3dFL tunes it "from the grid {0.005, 0.01, 0.05, 0.1} of the model
  learning rate", the very grid of the model's learning rate, and the reference's
  ``--lr_gating`` is an absolute rate (0.1 beside ``--lr_model 0.1``): ``gating_lr`` is
  absolute, Table 7's FMNIST value 0.1 (Ideal) by default, 0.05 for Hetero, and decays per
  round with the model's rate (lr_decay). Both parameter sets are clipped to gradient norm
  ``max_grad_norm`` (the reference's 10), separately.
- The input normalisation is a BatchNorm2d over the image channels (the reference uses a
  switchable norm); the gating layer, with its batch-norm statistics, is the client's private
  state, seeded per client (never aggregated: the reference's ``trans_gating_layer`` is off).
- Initial gates (``gate_bias``): the reference's batch norm of the gate logits starts with bias
  0, so every block starts at gate ~0.5; in a model without batch norm (Pa3dFL's CNNs; the
  reference's models have it) that halves all five layers and shrinks the logits ~30-fold. On
  4 FMNIST clients (capacities 1, 0.25, 0.0625, 1; 60 records, 5 epochs, lr 0.1) the training
  loss went 2.26 -> 2.23 in 3 rounds and accuracy stayed at the majority class over 8 rounds.
  The bias starts at 3 (gates ~0.95, the personalised model starts close to the received
  dense one): loss 2.03 -> 1.47 in 3 rounds. ``gate_bias: 0`` is the reference's start.
- A one-record training batch (an attack's replay) is normalised with the gating layer's
  running statistics (batch norm has no statistics of one record; the reference skips such
  batches).
- Evaluation gates each evaluation batch (1,000 records) as training gates a mini-batch.
- Parameters are zero-masked, not removed (as the reference, and Pa3dFL Appendix D.4): the
  client holds, trains and uploads the whole dense model. ``cost_model`` is therefore the
  dense model plus the gating layer, and its measured FLOPs and peak memory are those of the
  dense model plus the gating layer (Pa3dFL instead estimates a sparsity-s model by the
  sqrt(s)-width pruned one plus the gating layer); ``bytes_up`` is the full model's.
- ``attack_surface`` simulates the dense broadcast model (every gate 1): the gates come from
  the client's private gating layer, which the server does not have.

``accuracy_before`` is the received global model under the client's own gating layer,
``accuracy`` the same after local training. There is no single model every client runs (each
gates its own), so ``global_accuracy`` is null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    seeded,
)
from flcore.models import SplitModel

__all__ = [
    "PFedGate",
    "PFedGateParams",
    "GatedModel",
    "GatingLayer",
    "block_sizes",
    "input_shape",
    "knapsack_select",
]


class PFedGateParams(AlgorithmParams):
    blocks: int = Field(
        5, ge=1, description="B: blocks each parameter tensor is split into (Pa3dFL: 5)"
    )
    gating_lr: float = Field(
        0.1,
        gt=0,
        description="learning rate of the gating layer, absolute, decayed per round as the "
        "model's (Table 7, FMNIST: 0.1 Ideal, 0.05 Hetero)",
    )
    gate_bias: float = Field(
        3.0,
        description="initial bias of the gate logits' batch norm: sigmoid(3) = 0.95, every "
        "block starts nearly open (the reference's 0 halves every layer at the start)",
    )
    max_grad_norm: float = Field(
        10.0, gt=0, description="gradient-norm clip of the model and of the gating layer"
    )


# ---------------------------------------------------------------------------- pure math
def knapsack_select(
    values: torch.Tensor,
    sizes: torch.Tensor,
    capacity: float,
    protected: Sequence[int] = (),
) -> torch.Tensor:
    """A 0/1 mask of the blocks chosen greedily by value within ``capacity``.

    ``protected`` blocks are offered first, in descending value, then the others in
    descending value (ties: the lower index); each is taken if it still fits. The selected
    size never exceeds ``capacity``.
    """
    v = values.detach().double().cpu()
    order = torch.sort(-v, stable=True).indices.tolist()
    first = set(protected)
    chosen = torch.zeros(len(v), dtype=torch.bool)
    used = 0.0
    for idx in [i for i in order if i in first] + [i for i in order if i not in first]:
        size = float(sizes[idx])
        if used + size <= capacity + 1e-9:
            chosen[idx] = True
            used += size
    return chosen


def block_sizes(numel: int, blocks: int) -> list[int]:
    """Sizes of a tensor's blocks: ``ceil(n / B)`` each, the last one shorter (the reference's
    split; a tensor smaller than B gets one block per entry)."""
    split = min(blocks, numel)
    each = math.ceil(numel / split)
    count = math.ceil(numel / each)
    return [each] * (count - 1) + [numel - each * (count - 1)]


# ---------------------------------------------------------------------------- the network
class GatingLayer(nn.Module):
    """The reference's gating layer: input norm, a linear map of the flattened input to one
    logit per block, a batch norm of the logits."""

    def __init__(
        self, in_channels: int, in_features: int, num_blocks: int, bias: float = 0.0
    ) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(in_channels)
        self.linear = nn.Linear(in_features, num_blocks)
        self.out_norm = nn.BatchNorm1d(num_blocks)
        nn.init.constant_(self.out_norm.bias, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        single = self.training and x.shape[0] == 1
        if single:  # one record has no batch statistics: normalise it with the running ones
            self.norm.eval()
            self.out_norm.eval()
        try:
            return self.out_norm(self.linear(self.norm(x).flatten(1)))
        finally:
            if single:
                self.norm.train()
                self.out_norm.train()


class GatedModel(nn.Module):
    """The dense model ``net`` whose parameters are gated block-wise by ``gate(x)``.

    Args:
        net: the shared (dense) model.
        ratio: r, the share of parameters a batch may activate.
        blocks: B.
        input_shape: (C, H, W) of one record.
    """

    def __init__(
        self,
        net: SplitModel,
        ratio: float,
        blocks: int,
        input_shape: Sequence[int],
        gate_bias: float = 0.0,
    ) -> None:
        super().__init__()
        self.net = net
        self.ratio = float(ratio)
        self.names: list[str] = []
        sizes: list[int] = []
        self._spans: dict[str, tuple[int, int]] = {}
        protected: list[int] = []
        linear: list[bool] = []
        modules = dict(net.named_modules())
        for name, p in net.named_parameters():
            start = len(sizes)
            protected.append(start)
            parts = block_sizes(p.numel(), blocks)
            sizes += parts
            self._spans[name] = (start, len(sizes))
            is_linear = isinstance(modules[name.rsplit(".", 1)[0]], nn.Linear)
            linear += [is_linear] * len(parts)
            self.names.append(name)
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.float64), persistent=False)
        self.protected = protected
        self.linear_blocks = torch.tensor(linear)
        self.min_score = min(1.0 / blocks, self.ratio)
        c, h, w = input_shape
        self.input_shape = (c, h, w)
        self.gate = GatingLayer(c, c * h * w, len(sizes), gate_bias)

    def select(self, score: torch.Tensor) -> torch.Tensor:
        """The knapsack's 0/1 block mask for one batch's scores (per group, r_i of each)."""
        mask = torch.zeros(len(score), dtype=torch.bool)
        sizes = self.sizes.cpu()
        for group in (self.linear_blocks, ~self.linear_blocks):
            ids = group.nonzero().flatten()
            if not len(ids):
                continue
            pos = {int(b): i for i, b in enumerate(ids.tolist())}
            protected = [pos[b] for b in self.protected if b in pos]
            chosen = knapsack_select(
                score[ids], sizes[ids], self.ratio * float(sizes[ids].sum()), protected
            )
            mask[ids[chosen]] = True
        return mask

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """Per-block gate values for the batch ``x``: score on the selected blocks, else 0."""
        score = torch.sigmoid(self.gate(x)).mean(0).clamp_min(self.min_score)
        if self.ratio >= 1.0:
            return score
        return score * self.select(score.detach()).to(score.device, score.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gates(x)
        params = {}
        for name, p in self.net.named_parameters():
            a, b = self._spans[name]
            each, n = int(self.sizes[a]), p.numel()
            # blocks are consecutive runs of ``each`` entries (the last one shorter): pad the
            # flat tensor to whole blocks and scale each row by its gate
            flat = F.pad(p.reshape(-1), (0, (b - a) * each - n)).view(b - a, each)
            params[name] = (flat * g[a:b, None]).reshape(-1)[:n].view(p.shape)
        return functional_call(self.net, params, (x,))


# ---------------------------------------------------------------------------- algorithm
@ALGORITHMS.register("pfedgate")
class PFedGate(Algorithm):
    """A dense global model, personalised per batch by a private block-gating layer."""

    name = "pfedgate"
    capacity_aware = True
    static_bn_ok = False  # it rebuilds (or gates) the layers; no rule for BatchNorm
    Params = PFedGateParams
    reports = Algorithm.reports - {"global_accuracy"}

    def ratio(self, client_id: int) -> float:
        """r_i: the share of the model's parameters client ``client_id`` may activate."""
        return 1.0 if self.capacity is None else float(self.capacity.ratios[client_id])

    def _gated(self, client_id: int) -> GatedModel:
        """A fresh gated network for ``client_id`` (its gating layer seeded per client)."""
        p = self.params
        shape = input_shape(self.model_spec.in_channels)

        def build() -> GatedModel:
            net = self.model_spec()
            return GatedModel(
                net,
                self.ratio(client_id),
                p.blocks,  # type: ignore[attr-defined]
                shape,
                p.gate_bias,  # type: ignore[attr-defined]
            )

        return seeded((self.seed, 0x6A7E, client_id), build).to(self.device)

    def cost_model(self, client_id: int) -> nn.Module:
        """The dense model plus the gating layer (masked parameters are zeros, not removed)."""
        return self._gated(client_id)

    # ------------------------------------------------------------------ server side
    def init_server(self) -> None:
        self.model = seeded((self.seed, 0x6A7E), self.model_spec).to(self.device)
        self._mean: WeightedMean | None = None

    def init_client_state(self, client_id: int) -> Any:
        gated = self._gated(client_id)
        return {k: v.detach().cpu().clone() for k, v in gated.gate.state_dict().items()}

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        self._mean = WeightedMean()

    def accumulate(self, result: ClientResult) -> None:
        assert self._mean is not None, "begin_round was not called"
        self._mean.add(result.upload, float(result.num_samples))

    def end_round(self, round: int) -> None:
        assert self._mean is not None, "begin_round was not called"
        if self._mean.count:
            self.model.load_state_dict(self._mean.result())
        self._mean = None

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The dense broadcast model (gates 1: the gating layer is the client's secret)."""
        from flcore.attacks.surface import ModelSurface

        model = seeded((self.seed, 0x6A7E), self.model_spec).to(self.device)
        return ModelSurface(model, broadcast, label_key="head.bias")

    def state_dict(self) -> dict[str, Any]:
        return {"model": {k: v.clone() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])

    # ------------------------------------------------------------------ client side
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        gated = self._gated(task.client_id)
        side = data.info.image_size
        if gated.input_shape != (data.info.in_channels, side, side):
            raise ValueError(
                f"pfedgate: the gating layer reads {gated.input_shape} images, the data has "
                f"{(data.info.in_channels, side, side)}"
            )
        self._client_model = gated.net  # the contract checks the upload does not alias it
        gated.net.load_state_dict(task.payload)
        gated.gate.load_state_dict(task.state)
        p, t = self.params, self.training
        clip = float(p.max_grad_norm)  # type: ignore[attr-defined]
        scale = float(p.gating_lr) / t.lr  # type: ignore[attr-defined]
        opt = self.local_optimizer(
            [
                {"params": list(gated.net.parameters())},
                {"params": list(gated.gate.parameters()), "lr": t.lr_at(task.round) * scale},
            ],
            round=task.round,
        )

        def backward(
            model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Any
        ) -> torch.Tensor:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(gated.net.parameters(), clip)
            nn.utils.clip_grad_norm_(gated.gate.parameters(), clip)
            return loss.detach()

        metrics = self.client_eval(task, gated, data, before=True)
        metrics["train_loss"] = self.run_epochs(gated, data, opt, generator, backward=backward)
        metrics |= self.client_eval(task, gated, data)
        upload = {k: v.detach().to("cpu", copy=True) for k, v in gated.net.state_dict().items()}
        state = {k: v.detach().to("cpu", copy=True) for k, v in gated.gate.state_dict().items()}
        return ClientResult(task.client_id, len(data.train), upload, state, metrics)


def input_shape(in_channels: int) -> tuple[int, int, int]:
    """(C, H, W) of one record of a registered dataset with ``in_channels`` channels (the
    gating layer reads the whole image, so it is built for one image size).

    Raises:
        ValueError: the registered datasets of that channel count differ in image size.
    """
    from flcore.data import DATASET_INFO

    sides = {i.image_size for i in DATASET_INFO.values() if i.in_channels == in_channels}
    if len(sides) != 1:
        raise ValueError(
            f"pfedgate: no single image size for {in_channels}-channel datasets ({sides})"
        )
    side = sides.pop()
    return (in_channels, side, side)
