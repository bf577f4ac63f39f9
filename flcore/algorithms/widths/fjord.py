"""FjORD: Horvath, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and Accurate
Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS 2021.

Implemented (Sec. 2-3):

- Ordered dropout (OD): the width-p submodel keeps the first ``ceil(p C)`` channels of every
  hidden layer of C channels (= p C: widths are multiples of ``p_min``), and every tensor reading
  that layer the matching inputs (flcore.algorithms.widths.slicing). Input channels and classes
  are never cut.
- A client of maximal width p_max = p_i receives and uploads its p_i submodel. At each local step
  it draws p uniformly from ``P_i = {p_min, 2 p_min, ..., p_i}`` (all multiples of the capacity
  setting's ``p_min`` up to p_i) and trains the p-submodel of its p_i model on the mini-batch.
- Self-distillation (Sec. 3.3): a step at p = p_max minimises the cross-entropy
  ``CE(y_pmax, y)``; a step at p < p_max minimises

      (1 - alpha) CE(y_p, y) + alpha T^2 KL( softmax(y_pmax / T) || softmax(y_p / T) )

  where y_pmax are the logits of the p_max submodel on the same mini-batch with the current
  weights, taken as a fixed target (no gradient flows through them), ``alpha`` =
  ``algorithm_params.distill_alpha`` and T = ``algorithm_params.distill_temperature``;
  ``distill_alpha: 0`` turns distillation off (then no teacher pass is run).
- Aggregation: each entry of the global model is the mean over the round's clients whose p_i
  submodel holds it, weighted by their numbers of training records; an entry no client held keeps
  its value.

Choices where the paper is silent, and deviations:

- The set of widths: FjORD samples from a fixed discrete grid (its experiments use 0.2 .. 1.0 in
  steps of 0.2); here the grid is the capacity setting's, multiples of ``p_min``, because every
  width the capacity rule gives lies on it. Without a capacity setting every client is full
  width and trains only p = 1 (plain FedAvg on the full model). The draw uses the client's
  training generator, once per step, after the epoch's shuffle.
- The aggregation weights: the paper averages each parameter over the clients that trained it and
  builds on FedAvg; the weights are not pinned, and here they are FedAvg's sample counts.
- The defaults alpha = 0.5, T = 1 are this implementation's; Pa3dFL's Table 7 lists no FjORD
  parameter (its lr: 0.1).
- One optimizer (the configured one, fresh each round) steps the whole p_i model at every step:
  a step at p < p_i gives the channels beyond p a zero gradient, but momentum and weight decay
  still move them, as when ordered dropout zeroes those channels' outputs in a full network.
- ``train_loss`` is the mean of the per-step losses above (CE and distillation steps mixed).
- ``accuracy_before`` / ``accuracy`` are the received / trained p_i submodel on the client's test
  set. The attack surface is the client's p_i submodel with plain cross-entropy: the server does
  not know which widths the client drew. No DP mechanism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from flcore.algorithms.base import ALGORITHMS, AlgorithmParams, ClientData, ClientTask
from flcore.algorithms.widths.slicing import SlicedWidthAlgorithm, extract, nested_channels

__all__ = ["FjORD", "FjORDParams"]


class FjORDParams(AlgorithmParams):
    distill_alpha: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="weight of the KL term in a step at p < p_max (self-distillation); "
        "0 turns distillation off",
    )
    distill_temperature: float = Field(
        1.0, gt=0.0, description="softmax temperature T of the self-distillation term"
    )


@ALGORITHMS.register("fjord")
class FjORD(SlicedWidthAlgorithm):
    """Ordered dropout with per-step width sampling and self-distillation."""

    name = "fjord"
    Params = FjORDParams
    weighted = True

    def sampled_widths(self, client_id: int) -> list[float]:
        """P_i: the widths client ``client_id`` draws from, ascending (the last is p_i)."""
        if self.capacity is None:
            return [1.0]
        p_min, p_i = self.capacity.p_min, self.client_width(client_id)
        k = round(p_i / p_min)
        return [p_i if j == k else j * p_min for j in range(1, k + 1)]

    def train_submodel(
        self, model: nn.Module, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> float:
        widths = self.sampled_widths(task.client_id)
        alpha = float(self.params.distill_alpha)  # type: ignore[attr-defined]
        temp = float(self.params.distill_temperature)  # type: ignore[attr-defined]
        axes, full = self.axes(), self.full_channels()

        def od_loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            j = int(torch.randint(len(widths), (1,), generator=generator))
            if j == len(widths) - 1:
                return F.cross_entropy(net(x), y)
            p = widths[j]
            sub = extract(dict(net.named_parameters()), axes, nested_channels(full, p))
            logits = functional_call(self.client_model(p), sub, (x,))
            loss = F.cross_entropy(logits, y)
            if alpha == 0.0:
                return loss
            with torch.no_grad():
                teacher = net(x)
            kl = F.kl_div(
                F.log_softmax(logits / temp, dim=1),
                F.log_softmax(teacher / temp, dim=1),
                log_target=True,
                reduction="batchmean",
            )
            return (1 - alpha) * loss + alpha * temp**2 * kl

        opt = self.local_optimizer(model.parameters(), round=task.round)
        return self.run_epochs(model, data, opt, generator, loss_fn=od_loss)
