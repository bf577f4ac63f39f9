"""HeteroFL: Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated
Learning for Heterogeneous Clients", ICLR 2021.

Implemented (Sec. 3):

- Nested submodels (Sec. 3.1): a client of width p (HeteroFL's shrinkage ratio r) gets, in every
  hidden layer of C channels, the first p*C channels, and in every tensor reading that layer the
  matching inputs (flcore.algorithms.widths.slicing). The input channels and the classes are
  never cut.
- Aggregation (Eq. 2): each entry of the global model is the plain mean of the values uploaded by
  the round's clients whose submodel holds it, ``w[e] = (1/|S_e|) sum_{i in S_e} w_i[e]``; an
  entry no client of the round held keeps its value. Plain, not sample-weighted, as the paper.
- Scaler (Sec. 3.2): during local training, the output of every width-scaled parametric layer
  whose inputs were cut too (the second convolution and both hidden fully-connected layers) is
  divided by the client's width p, directly after the layer and before pooling and the
  activation (both commute with a positive scale here). This compensates for the share of inputs
  a width-p layer drops, as inverted dropout does. The head is not scaled: in HeteroFL's
  networks the output layer has no Scaler. The global model (width 1) is never scaled. A
  width-p submodel is scored as it trained: with static BN (HeteroFL's networks) the Scaler is
  off at evaluation, as in HeteroFL, whose Scaler acts in training mode only (and the
  normalisation that follows each scaled layer cancels the factor anyway: with batch-statistics
  BN in training too, the Scaler changes nothing there); without BN (Pa3dFL's Table 4 CNNs)
  nothing cancels it, and a submodel scored without it would see every scaled layer's output p
  times smaller than in training (its biases unchanged): there the Scaler stays on when a
  client's submodel is scored (``accuracy_before``, ``accuracy``), as the attack surface always
  had it.
- Static batch normalisation (Sec. 3.2): Pa3dFL's Table 4 CNNs have no normalisation layer;
  ``model: pa3dfl_cnn_fmnist_sbn`` (or ``pa3dfl_cnn_cifar100_sbn``) is the same network with a
  BatchNorm after each hidden layer that keeps no running statistics: training normalises
  every batch with its own statistics, and BN's affine weight and bias are sliced and averaged
  like the layer's channels. For evaluation the statistics are computed first
  (``flcore.algorithms.training.static_bn``, the base ``client_eval`` and ``evaluate_server``):
  a client's submodel from the client's own training records, the global model from every
  client's training records (the paper's server querying the clients in turn and cumulating
  their statistics). Deviation: HeteroFL computes the statistics once, on the server, over
  every client's records; here a client's own submodel uses its own records, which releases
  nothing to the server and, on Pa3dFL's i.i.d. FMNIST, estimates the same distribution.
  These statistics are not covered by any privacy accounting (HeteroFL has none). Their cost:
  the global model's ``global_accuracy`` takes one forward pass over every client's training
  records on each evaluation round (48,000 on Pa3dFL's FMNIST; 27 of one round's 61 s on one
  thread, session 58; Table 1's Hetero run takes ~35 s a round on two cores, FedRolex's ~13 s),
  at ``eval_every: 1``; a larger ``eval_every`` cuts it, for a coarser curve and early
  stopping. A FLGo-based HeteroFL found by code search puts such a BatchNorm after every
  Scaler on CNNs that match Table 4's; with it HeteroFL trains at Table 7's Hetero lr 0.1,
  without it the Scaler diverges (below).
- Masked cross-entropy (Sec. 3.2): the training loss of a client ignores the logits of classes
  absent from its training records (they are set to -inf before the softmax, so they get no
  probability and no gradient). Evaluation is unmasked, where HeteroFL's code masks a client's
  test logits to its classes too (no difference on Pa3dFL's i.i.d. FMNIST, where every client
  holds every class).

Choices where the paper is silent, and deviations:

- Deviation: the first convolution is not scaled. HeteroFL's networks put a Scaler after every
  hidden layer, the first included, but there static BN follows and removes the constant factor;
  the first layer's inputs (image channels) are never cut, so without BN the factor 1/p only
  inflates every activation of a narrow client. On Pa3dFL's BN-free FMNIST CNN that made 3 of 6
  short runs (3 rounds, 4 clients, lr 0.05) collapse to a constant prediction; scaling only the
  layers whose inputs were cut trained in all of them.
- The authors' code fills the masked logits with 0 rather than removing them from the softmax;
  this implementation removes them (the paper's "masking"). The authors' code also aggregates a
  head row only over the clients whose data has that class; here, as the brief's plain covering
  mean, every client holding the head contributes every row (the server does not learn a client's
  label set).
- ``accuracy_before`` is the received submodel on the client's test set, ``accuracy`` the trained
  submodel; both unscaled (eval mode).
- The attack surface is the client's submodel with the Scaler on (as it was trained) and plain
  cross-entropy: the server does not know the client's label set, so it cannot mask.
- The leakage evaluation replays an attacked record alone; the replayed step masks the loss to
  the client's whole label set (``ClientData.classes``), as the client's real step does, not to
  the one record's label (over one class the masked loss is constant and its gradient zero, so
  every leakage figure would read 0; session 25 refused HeteroFL an attack until this).
- Pa3dFL Table 7: lr 0.05 (Ideal) / 0.1 (Hetero). No DP mechanism.
- ``algorithm_params.scaler`` (default true, the paper's method) turns the Scaler off when
  false. At Table 7's Hetero setting (lr 0.1, r_i ~ U[0.01, 1]) on this BN-free CNN the Scaler
  makes the narrow clients diverge (session 28, seed 0: a width-0.125 client's weights reach
  |w| 86 in round 6 and a width-0.375 client's loss is NaN, which the plain covering mean hands
  to every client: the global model scores 10% from then on); with the Scaler off the same
  clients' weights stay near 0.2. HeteroFL's networks carry BN after each Scaler, which this
  CNN lacks. A run without the Scaler is HeteroFL's nested slicing with its masked loss only,
  and is labelled so (``reproduce_pa3dfl_table1.py --set algorithm_params.scaler=false``).
- The vectorized executor (``executor: vectorized``) trains every client's submodel zero-padded
  into the full-width network, the Scaler as each scaled layer's weight and bias divided by the
  client's width (the same function as dividing its output), the loss masked to the classes of
  the client's training records (the executor hands them over); equal to the loop within 1e-9
  in float64 (``tests/unit/test_vectorized.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from flcore.algorithms.base import ALGORITHMS, AlgorithmParams, ClientData, ClientTask, VectorJob
from flcore.algorithms.widths.slicing import AxesMap, SlicedWidthAlgorithm

__all__ = ["HeteroFL", "HeteroFLParams", "scaled_layers", "scaler"]


class HeteroFLParams(AlgorithmParams):
    scaler: bool = Field(
        True,
        description="HeteroFL's Scaler (Sec. 3.2): a width-p client divides its scaled layers' "
        "outputs by p while training; false leaves the nested slicing and the masked loss only",
    )


def scaled_layer_names(axes: AxesMap) -> set[str]:
    """The names of the modules the Scaler follows: those whose ``weight`` has both its output
    axis (0) and its input axis (1) indexed by channel layers (width-scaled outputs computed
    from cut inputs; the first layer reads the uncut image channels)."""
    return {
        key.removesuffix(".weight")
        for key, cuts in axes.items()
        if key.endswith(".weight") and {0, 1} <= {axis for axis, _, _ in cuts}
    }


def scaled_layers(model: nn.Module, axes: AxesMap) -> list[nn.Module]:
    """The modules the Scaler follows (:func:`scaled_layer_names`)."""
    names = scaled_layer_names(axes)
    return [m for n, m in model.named_modules() if n in names]


class _VectorObjective(nn.Module):
    """HeteroFL's step for the vectorized executor (``Algorithm.vector_objective``):
    ``forward(x, y, mask, width, present)`` is the label-masked cross-entropy (the masked mean
    over the batch's rows) of the network with the Scaler at the client's ``width``: each
    scaled layer's weight and bias divided by it, which is its output divided by it."""

    def __init__(self, net: nn.Module, scaled: set[str]) -> None:
        super().__init__()
        self.net, self.scaled = net, scaled

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        width: torch.Tensor,
        present: torch.Tensor,
    ) -> torch.Tensor:
        params = {
            key: value / width if key.rsplit(".", 1)[0] in self.scaled else value
            for key, value in self.net.named_parameters()
        }
        logits = functional_call(self.net, params, (x,)).masked_fill(~present, float("-inf"))
        ce = F.cross_entropy(logits, y, reduction="none")
        # a padding row's label may be a class the client lacks (an infinite loss): left out
        ce = torch.where(mask > 0, ce, torch.zeros_like(ce))
        return (ce * mask).sum() / mask.sum().clamp(min=1)


@contextmanager
def scaler(model: nn.Module, axes: AxesMap, width: float) -> Iterator[None]:
    """HeteroFL's Scaler while the context is open: each :func:`scaled_layers` output / width."""

    def hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output / width

    handles = (
        [] if width == 1.0 else [m.register_forward_hook(hook) for m in scaled_layers(model, axes)]
    )
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@ALGORITHMS.register("heterofl")
class HeteroFL(SlicedWidthAlgorithm):
    """Nested width slicing with the Scaler and label-masked cross-entropy."""

    name = "heterofl"
    Params = HeteroFLParams
    vectorized = True  # padded to full width, with its own objective (the Scaler, the mask)
    vector_objective = True
    _vector_prefix = "net."

    def train_submodel(
        self, model: nn.Module, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> float:
        present = torch.zeros(self.model_spec.num_classes, dtype=torch.bool, device=self.device)
        # the client's label set, also when the leakage evaluation replays one of its records
        present[data.classes().to(self.device)] = True

        def masked_ce(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = net(x).masked_fill(~present, float("-inf"))
            return F.cross_entropy(logits, y)

        opt = self.local_optimizer(model.parameters(), round=task.round)
        with scaler(model, self.axes(), self.scaler_width(task.client_id)):
            return self.run_epochs(model, data, opt, generator, loss_fn=masked_ce)

    def client_eval(
        self, task: ClientTask, model: nn.Module, data: ClientData, *, before: bool = False
    ) -> dict[str, float]:
        """The base evaluation, with the Scaler on for a submodel without static BN (module
        docstring); the loop and the vectorized executor both score clients through it."""
        static = bool(getattr(model, "STATIC_BN", False))
        width = 1.0 if static else self.scaler_width(task.client_id)
        with scaler(model, self.axes(), width):
            return super().client_eval(task, model, data, before=before)

    def scaler_width(self, client_id: int) -> float:
        """What the Scaler divides by: the client's width, or 1 with the Scaler off."""
        on = bool(self.params.scaler)  # type: ignore[attr-defined]
        return self.client_width(client_id) if on else 1.0

    def surface_model(self, client_id: int) -> nn.Module:
        """The client's submodel with the Scaler on for good (it trained with it; none when
        ``scaler`` is off)."""
        model = super().surface_model(client_id)
        width = self.scaler_width(client_id)
        if width != 1.0:
            for m in scaled_layers(model, self.axes()):
                m.register_forward_hook(lambda _m, _i, out, w=width: out / w)
        return model

    # ------------------------------------------------------------------ vectorized rounds
    def vector_model(self) -> nn.Module:
        """The full-width network inside HeteroFL's step objective; every client trains its
        submodel zero-padded into it (``SlicedWidthAlgorithm.vector_job``)."""
        return _VectorObjective(self.build(1.0), scaled_layer_names(self.axes()))

    def vector_keys(self, model: nn.Module) -> list[str] | None:
        assert isinstance(model, _VectorObjective)
        return [f"net.{k}" for k in model.net.state_dict()]

    def vector_job(self, task: ClientTask) -> VectorJob:
        """The submodel's epochs with the Scaler at the client's width and its label mask."""
        width = torch.tensor(self.scaler_width(task.client_id), dtype=torch.get_default_dtype())
        job = super().vector_job(task)
        return dataclasses.replace(job, consts=(width,), class_mask=True)
