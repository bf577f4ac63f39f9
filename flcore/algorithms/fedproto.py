"""FedProto: Tan, Long, Liu, Zhou, Lu, Jiang & Zhang, "FedProto: Federated Prototype Learning
across Heterogeneous Clients", AAAI 2022; run as FedHKD's baseline (Chen & Vikalo, "The Best of
Both Worlds: Accurate Global and Personalized Models through Federated Learning with Data-Free
Hyper-Knowledge Distillation", ICLR 2023, Sec. 4.1 and Appendix A.1).

A client's prototype of class j is the mean representation of its class-j training records,

    C_i^j = (1 / N_i^j) sum_{(x, y) in D_i, y = j} R(x)          (R = ``model.represent``)

and the server's global prototype is the count-weighted mean over the clients that hold j,

    C^j = sum_{i in N_j} N_i^j C_i^j / sum_{i in N_j} N_i^j.

From round 2 on, client i trains on

    L = CE(G(R(x)), y) + lambda * MSE(R(x), C^y)                  (lambda = 0.05, FedHKD A.1)

and round 1, which has no global prototype, on CE alone.

As in FedHKD's comparison, FedProto here also averages the models (FedAvg, ``n_i``-weighted):
each client starts the round from the global model and uploads its trained weights beside its
prototypes, so the run has a global model and a ``global_accuracy``. (FedProto's own paper
shares prototypes only, for clients with different architectures.)

The upload is the model's weights plus the knowledge-sharing format every such algorithm here
uses (FedHKD writes the same keys): ``knowledge.rep`` ``[K, d]`` the per-class mean
representations (zero rows for classes not shared), ``knowledge.mask`` ``[K]`` 0/1 which
classes are shared, ``knowledge.counts`` ``[K]`` the per-class record counts N_i^j. The
broadcast from round 2 on carries the global prototypes under the same two names
``knowledge.rep`` / ``knowledge.mask``.

Choices where the papers are silent, and deviations, stated:
- Aggregation weights: FedProto's Eq. 6 writes ``(1/|N_j|) sum_i (N_i^j / N_j) C_i^j``, whose
  extra ``1/|N_j|`` shrinks the prototype as more clients hold the class; its official code
  takes a plain mean over the holders. FedHKD aggregates its own class representations with
  the count weights ``N_i^j / N^j`` (its Eq. 9). Default ``aggregation: count`` is that
  normalised count-weighted mean (a class-j prototype is then the mean representation over
  all class-j records of the round); ``aggregation: mean`` is the plain mean over holders.
- FedHKD's comparison code stores each client's prototypes into one dict, so the "global"
  prototype of a class is the last client's; that bug is not reproduced.
- A class no client of the round shared has no global prototype the next round (FedHKD:
  "the server sets K^j = empty"); its records get no prototype term. The MSE is the mean
  over the batch's elements ``[B, d]`` with those records' terms zero (FedHKD's comparison
  code does the same: their target is the record's own representation).
- A client shares every class it holds (``N_i^j > 0``); FedProto has no sharing threshold.
- Prototypes are computed after local training, on the client's training records, in
  evaluation mode (batch-norm statistics frozen), without gradient, as FedHKD's code computes
  them; FedProto's code (and its Algorithm 1) averages the training-mode representations of
  the last local epoch's passes instead. Released as they are by
  default (``sigma: 0``: no noise, as both papers). ``sigma > 0`` releases them through
  FedHKD's mechanism instead (flcore.algorithms.knowledge: each representation clipped to
  ``zeta``, noise of std ``sigma 2 zeta / N_i^j`` on each class mean; not in either paper),
  so that what prototypes leak can be measured at FedHKD's noise; ``epsilon_knowledge`` is
  then what the prototypes spent (the model weights stay un-noised: ``epsilon`` inf).
- FedHKD's comparison code clips FedProto's gradients to norm 1.1 in prototype rounds; neither
  paper does, and neither do we.
- No DP mechanism: DP-SGD would leave the prototypes un-noised, so none is offered.
- Attack surface (gradient inversion): FedAvg's, the broadcast model under cross-entropy. From
  round 2 the upload also moved along lambda * grad MSE(R(x), C^y), which the simulation leaves
  out (C^y is public, so an attacker could add it; at lambda = 0.05 the CE term dominates).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from flcore.algorithms.aggregate import PrototypeMean
from flcore.algorithms.base import (
    ALGORITHMS,
    ClientData,
    ClientResult,
    ClientTask,
)
from flcore.algorithms.fedavg import FedAvg
from flcore.algorithms.knowledge import (
    RELATION,
    KnowledgeNoiseParams,
    knowledge_epsilon,
    knowledge_mechanism,
)
from flcore.algorithms.training import LossFn
from flcore.data import ArrayDataset, DatasetInfo, normalize
from flcore.privacy.gaussian import GaussianMechanism, class_means

__all__ = [
    "FedProto",
    "FedProtoParams",
    "KNOWLEDGE_PREFIX",
    "client_prototypes",
    "prototype_loss",
]

#: upload/broadcast keys of the shared knowledge start with this; the rest are model weights
KNOWLEDGE_PREFIX = "knowledge."


class FedProtoParams(KnowledgeNoiseParams):
    lam: float = Field(
        0.05,
        ge=0,
        description="lambda of the prototype term lambda * MSE(R(x), C^y) (FedHKD A.1: 0.05)",
    )
    aggregation: Literal["count", "mean"] = Field(
        "count",
        description="global prototype: count-weighted mean over the clients holding the class "
        "(N_i^j weights, FedHKD's Eq. 9) or the plain mean over them (FedProto's code)",
    )


def prototype_loss(protos: torch.Tensor | None, mask: torch.Tensor | None, lam: float) -> LossFn:
    """``CE + lam * MSE(R(x), protos[y])``, the MSE averaged over the batch's ``[B, d]``
    elements with the records of classes without a prototype (``mask`` 0) contributing 0;
    plain cross-entropy when ``protos`` is None or ``lam`` is 0."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = model.represent(x)  # type: ignore[operator]
        ce = F.cross_entropy(model.head(h), y)  # type: ignore[operator]
        if protos is None or mask is None or lam == 0:
            return ce
        h = h.flatten(1)
        sq = (h - protos[y]).pow(2) * mask[y].unsqueeze(1)
        return ce + lam * sq.mean()

    return loss


@torch.no_grad()
def client_prototypes(
    model: nn.Module,
    data: ArrayDataset,
    info: DatasetInfo,
    *,
    device: torch.device | None = None,
    batch_size: int = 1000,
    mechanism: GaussianMechanism | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean representations ``[K, d]`` (zero rows for absent classes) of ``model``
    on ``data``, in evaluation mode, and the per-class counts ``[K]``; released through
    ``mechanism`` (clipped, noised, drawing from ``generator``) when given."""
    device = device or torch.device("cpu")
    was_training = model.training
    model.eval()
    reps = [
        model.represent(normalize(data.images[s : s + batch_size], info).to(device)).flatten(1)  # type: ignore[operator]
        for s in range(0, len(data.labels), batch_size)
    ]
    model.train(was_training)
    h = torch.cat(reps).to("cpu", torch.float64)  # the sums do not depend on batch order
    if mechanism is not None:
        assert generator is not None, "a noised release needs the client's generator"
        means, counts = mechanism.release(h, data.labels, info.num_classes, generator)
    else:
        means, counts = class_means(h, data.labels, info.num_classes)
    return means.float(), counts


def _weights_only(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if not k.startswith(KNOWLEDGE_PREFIX)}


@ALGORITHMS.register("fedproto")
class FedProto(FedAvg):
    """FedAvg plus class prototypes: a prototype-alignment term in the local objective and
    count-weighted prototype aggregation on the server."""

    name = "fedproto"
    privacy_mechanisms = frozenset()
    Params = FedProtoParams
    reports = FedAvg.reports | {"epsilon_knowledge"}

    # ------------------------------------------------------------------ server side
    def init_server(self) -> None:
        super().init_server()
        self.prototypes: torch.Tensor | None = None  # [K, d]; None before any aggregation
        self.prototype_mask: torch.Tensor | None = None  # [K] 0/1
        self._protos: PrototypeMean | None = None
        self.releases = [0] * self.num_clients  # prototype releases per client

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        out = super().broadcast(round, client_id)
        if self.prototypes is not None and self.prototype_mask is not None:
            out[f"{KNOWLEDGE_PREFIX}rep"] = self.prototypes.clone()
            out[f"{KNOWLEDGE_PREFIX}mask"] = self.prototype_mask.clone()
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        super().begin_round(round, client_ids)
        p = self.params
        assert isinstance(p, FedProtoParams)
        self._protos = PrototypeMean(p.aggregation)

    def accumulate(self, result: ClientResult) -> None:
        assert self._protos is not None, "begin_round was not called"
        up = result.upload
        k = KNOWLEDGE_PREFIX
        self._protos.add(up[f"{k}rep"], up[f"{k}mask"], up[f"{k}counts"])
        if float(up[f"{k}mask"].sum()) > 0:
            self.releases[result.client_id] += 1
        weights = ClientResult(
            result.client_id, result.num_samples, _weights_only(up), result.state, result.metrics
        )
        super().accumulate(weights)

    def end_round(self, round: int) -> None:
        super().end_round(round)
        assert self._protos is not None, "begin_round was not called"
        agg = self._protos.result()
        if agg is not None:  # a round without clients keeps the last prototypes
            self.prototypes, self.prototype_mask = agg
        self._protos = None

    def privacy_metrics(self) -> dict[str, float]:
        """``epsilon`` (inf: the weights carry no noise) and ``epsilon_knowledge``, what the
        prototype releases of the client that released most spent (inf un-noised; module
        docstring)."""
        p = self.params
        assert isinstance(p, FedProtoParams)
        most = max(self.releases or [0])
        dim = int(self.client_model().head.in_features)  # type: ignore[union-attr]
        return super().privacy_metrics() | {"epsilon_knowledge": knowledge_epsilon(p, dim, most)}

    def privacy_tags(self) -> dict[str, str]:
        """With noised prototypes, the relation ``epsilon_knowledge`` is stated under."""
        tags = super().privacy_tags()
        if self.params.sigma > 0:  # type: ignore[attr-defined]
            tags["dp_relation"] = RELATION
        return tags

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        out["releases"] = list(self.releases)
        out["prototypes"] = None if self.prototypes is None else self.prototypes.clone()
        out["prototype_mask"] = None if self.prototype_mask is None else self.prototype_mask.clone()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.releases = list(state.get("releases", [0] * self.num_clients))
        protos, mask = state["prototypes"], state["prototype_mask"]
        self.prototypes = None if protos is None else protos.clone()
        self.prototype_mask = None if mask is None else mask.clone()

    # ------------------------------------------------------------------ client side
    def starting_weights(self, task: ClientTask) -> dict[str, torch.Tensor]:
        return _weights_only(task.payload)

    def release(self, protos: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
        """The knowledge part of the upload: every held class (module doc)."""
        mask = (counts > 0).float()
        k = KNOWLEDGE_PREFIX
        return {
            f"{k}rep": protos * mask.unsqueeze(1),
            f"{k}mask": mask,
            f"{k}counts": counts.float(),
        }

    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FedProtoParams)
        model = self.client_model()
        model.load_state_dict(self.starting_weights(task), strict=False)
        metrics = self.client_eval(task, model, data, before=True)
        k = KNOWLEDGE_PREFIX
        protos = task.payload.get(f"{k}rep")
        mask = task.payload.get(f"{k}mask")
        if protos is not None and mask is not None:
            protos, mask = protos.to(self.device), mask.to(self.device)
        opt = self.local_optimizer(
            (q for q in model.parameters() if q.requires_grad), round=task.round
        )
        metrics["train_loss"] = self.run_epochs(
            model, data, opt, generator, loss_fn=prototype_loss(protos, mask, p.lam)
        )
        metrics |= self.client_eval(task, model, data)
        keys = self.trainable_keys(model)
        state = model.state_dict()
        sent = state if keys is None else keys
        upload = {key: state[key].detach().to("cpu", copy=True) for key in sent}
        mech = knowledge_mechanism(p, int(model.head.in_features))  # type: ignore[union-attr]
        local, counts = client_prototypes(
            model, data.train, data.info, device=self.device, mechanism=mech, generator=generator
        )
        upload |= self.release(local, counts)
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)
