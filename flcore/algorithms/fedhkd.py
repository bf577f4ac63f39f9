"""FedHKD: Chen & Vikalo, "The Best of Both Worlds: Accurate Global and Personalized Models
through Federated Learning with Data-Free Hyper-Knowledge Distillation", ICLR 2023.

Each client shares "hyper-knowledge" beside its model: per class j, the mean representation
``h_i^j = (1/N_i^j) sum_k R(x_k)`` (Eq. 4; R = ``model.represent``) and the mean soft prediction
``q_i^j = (1/N_i^j) sum_k Q(z_k, T)`` with ``Q(z, T) = softmax(z / T)`` (Eq. 3, T = 0.5; torch's
softmax subtracts the max, so it is numerically stable). A class is shared only if its share of
the client's records exceeds ``nu`` (0.25). The representation mean is released through the
Gaussian mechanism of Theorem 1 / Lemma 1 (:class:`flcore.privacy.gaussian.GaussianMechanism`):
clipped, with noise of std ``sigma 2 zeta / N_i^j`` (sigma 7; by default zeta is an L2 bound,
below, so the noise is sqrt(d) times the paper's). The server aggregates each class
over the clients that shared it (Eq. 9), ``H^j = sum_i p_i h~_i^j`` and ``Q^j = sum_i p_i q_i^j``
with ``p_i = N_i^j / N^j``, and averages the models as FedAvg (n_i-weighted). Each client then
trains (Eq. 11)

    CE(G(R(x_k)), y_k) + lambda (1/n) sum_j ||Q(G(H^j), T) - Q^j||_2
                       + gamma (1/B) sum_k ||R(x_k) - H^{y_k}||_2

with lambda = gamma = 0.05 (``fedhkd``) or gamma = 0 (``fedhkd_star``, the paper's FedHKD*).

Choices where the paper is silent, and deviations, stated:

- Round 1 (no global knowledge yet) trains CE only, as Appendix A.4 says. A class no client
  shared this round has no
  global knowledge next round (the paper: "the server sets K^j = empty"); its terms drop out:
  the second term is ``(1/n) sum`` over the classes with knowledge (n = the number of classes,
  as printed), the third is the mean over the batch's records whose class has knowledge.
- The norms are the paper's L2 norms (not squared), not the KL/MSE of the authors' code; the
  server aggregates (the authors' code overwrites each class with the last client's); the noise
  is scaled to the sensitivity (the authors' code adds one unscaled vector); no gradient
  clipping in local training (the authors' code clips to 1.1, the paper never mentions it).
- The knowledge is computed after local training, with the model in eval mode, over the
  client's training records; the soft prediction uses the unclipped representation.
- Only the counts of shared classes leave the client (``knowledge.counts``, zeros elsewhere):
  the server needs them for p_i; the others are not released.
- Clipping (``knowledge_clip``): ``l2`` (default) clips each representation to L2 norm
  ``zeta``, default ``3 sqrt(d)``; ``coordinate`` clamps each coordinate to ``[-zeta, zeta]``,
  default 3, the paper's bound (Sec. 4.3: "after BatchNorm", about 99.7% of coordinates), with
  exactly the paper's noise, which is noise multiplier ``sigma / sqrt(d)`` for the vector. The
  paper clips nothing: it relies on BatchNorm keeping coordinates within 3 "with probability
  99.73%". Stated plainly: the default ``l2`` adds noise of std ``sigma 2 zeta / N_i^j`` with
  ``zeta = 3 sqrt(d)`` to each coordinate, sqrt(d) times the paper's (5.7x on the 32-d FMNIST and
  SVHN latents, 8x on the 64-d CIFAR ones), so that sigma is the noise multiplier of the whole
  vector; every config uses it, the Table 1 and claim runs of BENCHMARKS.md included. There the
  noise costs nothing measurable: FMNIST beta 0.5 at sigma 0 and at sigma 7 ``l2`` are level
  (claim 5, three seeds), so the paper's smaller noise would be level too.
- The sharing rule: Sec. 3 has a class "below nu" not shared (so a share equal to nu is), Sec.
  4.3 writes ``N_i^j > nu N_i``; we share a class whose share exceeds nu (equality needs ``nu
  N_i`` whole: 112.5 at FMNIST's 450 training records a client, never met).
- Appendix A.1's schedule, "decreased every 10 iterations with a decay factor 0.5", is read as a
  halving every 10 rounds (its "iterations" could be steps); its "hyper-parameter gamma in Adam
  was set to 0.5" names no parameter of Adam and is read as that decay factor. Adam's moments
  start afresh each round (the paper does not say).

Privacy, stated plainly (issue 25 section 3):

- ``epsilon_knowledge`` is what the representation releases spend under the relation "replace
  one record by another of the same class" (the counts N_i^j, the weights p_i and the nu
  decisions are released unnoised, so only a label-preserving relation leaves them unchanged;
  the run is tagged ``dp_relation: replace-one-same-label``). That relation is ours: Lemma 1's
  proof (Appendix A.5, Eqs. 17-18) compares a class's set with the same set less one element
  (add/remove), under which the unnoised counts show the change and the release as the paper
  runs it has no guarantee; the sensitivity, ``2 zeta / N_i^j``, is the same under both. It is
  stated at ``delta`` 1e-5 by default, where the paper's Sec. 4.3 takes 0.01 (its sigma 7 per
  release and coordinate, at both deltas, is in BENCHMARKS.md, "What FedHKD's knowledge noise
  buys"). Every round's release is composed
  by the accountant (flcore.privacy.accounting: R Gaussian releases at the accounted noise
  multiplier, q = 1), for the client that released most often; never a per-round formula
  summed.
- It holds only for the knowledge as a function of a fixed model. The model itself, trained on
  the same records, and the soft predictions are released with no noise: the run has no formal
  guarantee. Its ``dp_guarantee`` is ``none`` and its ``epsilon`` inf, on every front.
- ``knowledge_classes_shared``: the classes with global knowledge after the round's
  aggregation (0 to n). At beta = 5 almost no class passes nu = 0.25 (a Beta(5, 45) share
  exceeds it with probability about 0.003): FedHKD then reduces to FedAvg.

``privacy.protect: knowledge+model`` (``privacy: {mechanism: dpsgd, protect: knowledge+model,
noise_multiplier or target_epsilon, clip, delta}``) gives the run a full guarantee, record-level
(ISRL-DP) under add/remove of one record, for the model, the knowledge and the counts alike:

- Local training is DP-SGD (flcore.privacy.dpsgd) on a :class:`~flcore.privacy.dpsgd.
  SplitObjective`: each record's CE + ``gamma ||R(x_k) - H^{y_k}||_2`` is clipped per sample;
  the lambda term reads no record (the model's head on the global knowledge) and is added to the
  noised gradient. The representation term is therefore averaged over the (expected) batch, a
  record without global knowledge for its class contributing 0, not over the records that have
  it (the non-private objective's choice). BatchNorm stays in eval mode (the latent's BN is then
  the identity of its initial statistics; the representation is clipped anyway).
- The knowledge is released as three Gaussian releases, each at noise multiplier ``sigma``
  relative to its add/remove sensitivity: per-class counts (std ``sigma``), per-class sums of the
  L2-clipped representations (std ``sigma zeta``), per-class sums of the soft predictions (std
  ``sigma``: a softmax vector has L2 norm at most 1). The nu decisions, the means (a noised sum
  over the noised count, at least 1) and the weights p_i (noised counts) are post-processing.
  This is the issue's "noise the counts" option; the soft predictions' add/remove sensitivity
  is 1 on the sum (the issue's sqrt(2) / N_j is the replace-one sensitivity of the mean).
- The three releases compose into one Gaussian at multiplier ``sigma / sqrt(3)`` a round
  (:meth:`FedHKD.dp_side_release`), composed into the client's own accountant beside its DP-SGD
  steps, for every round it takes part; ``epsilon`` is the worst client's, ``dp_guarantee``
  ``isrl``, ``dp_relation`` ``add-remove``. A ``target_epsilon`` calibrates DP-SGD's multiplier
  with the knowledge releases counted. The record counts n_i (the model's aggregation weights,
  DP-SGD's sample rate) are public, as in every ISRL-DP run here.
- ``knowledge_clip: coordinate`` (the paper's noise, stated under the label-preserving relation)
  and ``sigma: 0`` are refused in this mode.

What the paper's metrics are here: its "local accuracy" is ``accuracy`` (the client's model
after local training, on the client's own test records), its "global accuracy" is
``global_accuracy`` (the aggregated model on the global test set). That set is the balanced
global test set (flcore.data), the whole test split on FMNIST and CIFAR; on SVHN, whose test
classes are unequal, it keeps the smallest class's count of each class (about 15,950 of 26,032
records), where the paper (Appendix A.2) scores all of them: a departure for SVHN runs (none is
reported in BENCHMARKS.md yet).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from flcore.algorithms.aggregate import PrototypeMean
from flcore.algorithms.base import (
    ALGORITHMS,
    AlgorithmParams,
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
from flcore.data import normalize
from flcore.errors import ConfigError
from flcore.privacy.accounting import compute_epsilon
from flcore.privacy.dpsgd import SplitObjective
from flcore.privacy.gaussian import GaussianMechanism, class_means

__all__ = [
    "FedHKD",
    "FedHKDParams",
    "FedHKDDP",
    "FedHKDStar",
    "KnowledgeSum",
    "hkd_loss",
    "hkd_objective",
    "local_knowledge",
    "private_knowledge",
    "soft_targets",
]

TensorDict = dict[str, torch.Tensor]
KNOWLEDGE = ("knowledge.rep", "knowledge.soft", "knowledge.mask", "knowledge.counts")


class FedHKDParams(KnowledgeNoiseParams):
    lam: float = Field(0.05, ge=0, description="lambda: weight of the soft-prediction term")
    gamma: float = Field(0.05, ge=0, description="gamma: weight of the representation term")
    temperature: float = Field(0.5, gt=0, description="T of the soft target softmax(z / T)")
    nu: float = Field(0.25, ge=0, lt=1, description="a class is shared if its share exceeds nu")
    sigma: float = Field(7.0, ge=0, description="noise std in units of the sensitivity")


class FedHKDStarParams(FedHKDParams):
    gamma: float = Field(0.0, ge=0, le=0, description="FedHKD*: no representation term (0)")


def soft_targets(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``Q(z, T) = softmax(z / T)`` (torch's softmax is the max-subtracted, stable one)."""
    return torch.softmax(logits / temperature, dim=-1)


def _outputs(
    model: nn.Module, images: torch.Tensor, temperature: float, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The representations and soft predictions of ``images``, in eval mode."""
    was_training = model.training
    model.eval()
    reps, softs = [], []
    with torch.no_grad():
        for i in range(0, len(images), batch):
            h = model.represent(images[i : i + batch])  # type: ignore[operator]
            reps.append(h)
            softs.append(soft_targets(model.head(h), temperature))  # type: ignore[operator]
    model.train(was_training)
    return torch.cat(reps), torch.cat(softs)


def local_knowledge(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    temperature: float,
    nu: float,
    mechanism: GaussianMechanism | None,
    generator: torch.Generator,
    batch: int = 500,
) -> TensorDict:
    """A client's released hyper-knowledge (normalised ``images``): per class the (clipped,
    noised) mean representation and the mean soft prediction, for the classes whose share of
    the records exceeds ``nu``; the other rows are zeros and their counts 0."""
    h, q = _outputs(model, images, temperature, batch)
    labels = labels.to(h.device)
    soft, counts = class_means(q, labels, num_classes)
    if mechanism is not None:
        rep, _ = mechanism.release(h, labels, num_classes, generator)
    else:
        rep, _ = class_means(h, labels, num_classes)
    shared = counts.to(torch.float64) / max(1, len(labels)) > nu
    mask = shared.to(h.dtype)
    return {
        "knowledge.rep": (rep * mask[:, None]).detach().cpu(),
        "knowledge.soft": (soft * mask[:, None]).detach().cpu(),
        "knowledge.mask": mask.detach().cpu(),
        "knowledge.counts": (counts.to(h.dtype) * mask).detach().cpu(),
    }


def private_knowledge(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_classes: int,
    temperature: float,
    nu: float,
    sigma: float,
    zeta: float,
    generator: torch.Generator,
    batch: int = 500,
) -> TensorDict:
    """The hyper-knowledge under ``privacy.protect: knowledge+model``: noised per-class counts,
    sums of L2-clipped representations and sums of soft predictions (each at noise multiplier
    ``sigma`` under add/remove), and everything else computed from them (module docstring).
    Same keys as :func:`local_knowledge`; ``knowledge.counts`` holds the noised counts."""
    h, q = _outputs(model, images, temperature, batch)
    labels = labels.to(h.device)
    ones = torch.ones(len(labels), 1, dtype=h.dtype, device=h.device)
    counts = GaussianMechanism(sigma, 1.0).release_sums(ones, labels, num_classes, generator)[:, 0]
    reps = GaussianMechanism(sigma, zeta).release_sums(h, labels, num_classes, generator)
    softs = GaussianMechanism(sigma, 1.0).release_sums(q, labels, num_classes, generator)
    held = counts.clamp(min=0)
    mask = (held / held.sum().clamp(min=1) > nu).to(h.dtype)
    denom = counts.clamp(min=1)[:, None]
    return {
        "knowledge.rep": (reps / denom * mask[:, None]).detach().cpu(),
        "knowledge.soft": (softs / denom * mask[:, None]).detach().cpu(),
        "knowledge.mask": mask.detach().cpu(),
        "knowledge.counts": (held * mask).detach().cpu(),
    }


class KnowledgeSum:
    """Eq. 9, streamed: per class the count-weighted means of the shared representations and
    soft predictions, ``p_i = N_i^j / N^j`` over the clients that shared class j (two
    :class:`~flcore.algorithms.aggregate.PrototypeMean`, as FedProto's prototypes)."""

    def __init__(self) -> None:
        self._rep = PrototypeMean("count")
        self._soft = PrototypeMean("count")
        self.empty = True

    def add(self, knowledge: Mapping[str, torch.Tensor]) -> None:
        mask, counts = knowledge["knowledge.mask"], knowledge["knowledge.counts"]
        self._rep.add(knowledge["knowledge.rep"], mask, counts)
        self._soft.add(knowledge["knowledge.soft"], mask, counts)
        self.empty = False

    def result(self) -> TensorDict:
        """The global knowledge: ``rep``, ``soft`` and ``mask`` (1 where some client shared)."""
        rep, soft = self._rep.result(), self._soft.result()
        if rep is None or soft is None:
            raise ValueError("no knowledge was added")
        return {"knowledge.rep": rep[0], "knowledge.soft": soft[0], "knowledge.mask": rep[1]}


def hkd_loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    knowledge: Mapping[str, torch.Tensor] | None,
    *,
    lam: float,
    gamma: float,
    temperature: float,
) -> torch.Tensor:
    """Eq. 11 on one batch (``knowledge`` None: CE only, round 1)."""
    h = model.represent(x)  # type: ignore[operator]
    loss = F.cross_entropy(model.head(h), y)  # type: ignore[operator]
    if knowledge is None:
        return loss
    mask = knowledge["knowledge.mask"] > 0
    if not bool(mask.any()):
        return loss
    rep, soft = knowledge["knowledge.rep"], knowledge["knowledge.soft"]
    if lam > 0:
        q = soft_targets(model.head(rep[mask]), temperature)  # type: ignore[operator]
        loss = loss + lam * (q - soft[mask]).norm(dim=1).sum() / len(mask)
    if gamma > 0:
        have = mask[y]
        if bool(have.any()):
            loss = loss + gamma * (h[have] - rep[y[have]]).norm(dim=1).mean()
    return loss


def hkd_objective(
    knowledge: Mapping[str, torch.Tensor] | None,
    *,
    lam: float,
    gamma: float,
    temperature: float,
) -> SplitObjective:
    """Eq. 11 split for DP-SGD (module docstring): per record CE + ``gamma ||R(x_k) -
    H^{y_k}||_2`` (0 for a record whose class has no knowledge), and the lambda term, which
    reads no record."""

    def per_record(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = m.represent(x)  # type: ignore[operator]
        loss = F.cross_entropy(m.head(h), y, reduction="none")  # type: ignore[operator]
        if knowledge is None or gamma == 0:
            return loss
        have = knowledge["knowledge.mask"][y]  # no data-dependent shapes: vmap runs it
        return loss + gamma * have * (h - knowledge["knowledge.rep"][y]).norm(dim=1)

    def record_free(m: nn.Module) -> torch.Tensor:
        assert knowledge is not None
        mask = knowledge["knowledge.mask"] > 0
        q = soft_targets(m.head(knowledge["knowledge.rep"][mask]), temperature)  # type: ignore[operator]
        return lam * (q - knowledge["knowledge.soft"][mask]).norm(dim=1).sum() / len(mask)

    usable = knowledge is not None and bool((knowledge["knowledge.mask"] > 0).any())
    return SplitObjective(per_record, record_free if usable and lam > 0 else None)


@ALGORITHMS.register("fedhkd")
class FedHKD(FedAvg):
    """FedAvg's models plus hyper-knowledge distillation (module docstring)."""

    name = "fedhkd"
    Params = FedHKDParams
    privacy_mechanisms = frozenset({"dpsgd"})  # with privacy.protect: knowledge+model
    side_releases = True
    reports = FedAvg.reports | {"epsilon_knowledge", "knowledge_classes_shared"}

    @classmethod
    def dp_side_release(cls, params: AlgorithmParams) -> float | None:
        """The knowledge's three Gaussian releases (counts, representation sums, soft sums),
        each at multiplier sigma, as one Gaussian: ``sigma / sqrt(3)``."""
        assert isinstance(params, FedHKDParams)
        if params.sigma == 0:
            raise ConfigError(
                "algorithm_params.sigma",
                "privacy.protect knowledge+model noises the knowledge: sigma must be > 0",
            )
        if params.knowledge_clip != "l2":
            raise ConfigError(
                "algorithm_params.knowledge_clip",
                "privacy.protect knowledge+model releases L2-clipped sums: use knowledge_clip "
                "l2 (coordinate is the paper's noise for the knowledge-only relation)",
            )
        return params.sigma / math.sqrt(3.0)

    def _protected(self) -> bool:
        return self.privacy is not None and self.privacy.protect == "knowledge+model"

    # ------------------------------------------------------------------ knowledge release
    def mechanism(self, dim: int) -> GaussianMechanism | None:
        """The representation release's mechanism (None: sigma 0, plain means)."""
        p = self.params
        assert isinstance(p, FedHKDParams)
        return knowledge_mechanism(p, dim)

    def _latent_dim(self) -> int:
        head = self.client_model().head
        return int(head.in_features)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ server
    def init_server(self) -> None:
        super().init_server()
        self.knowledge: TensorDict | None = None
        self._ksum: KnowledgeSum | None = None
        self.releases = [0] * self.num_clients
        self._classes_shared = 0

    def broadcast(self, round: int, client_id: int) -> TensorDict:
        out = super().broadcast(round, client_id)
        if self.knowledge is not None:
            out |= {k: v.clone() for k, v in self.knowledge.items()}
        return out

    def begin_round(self, round: int, client_ids: list[int]) -> None:
        super().begin_round(round, client_ids)
        self._ksum = KnowledgeSum()

    def accumulate(self, result: ClientResult) -> None:
        know = {k: v for k, v in result.upload.items() if k.startswith("knowledge.")}
        model = {k: v for k, v in result.upload.items() if not k.startswith("knowledge.")}
        super().accumulate(dataclasses.replace(result, upload=model))
        assert self._ksum is not None, "begin_round was not called"
        self._ksum.add(know)
        if self._protected():  # every round it takes part: noised counts always go out
            self.releases[result.client_id] += 1
            side = self.dp_side_release(self.params)
            assert self._record_dp is not None and side is not None
            self._record_dp.release(result.client_id, side)
        elif float(know["knowledge.mask"].sum()) > 0:
            self.releases[result.client_id] += 1

    def end_round(self, round: int) -> None:
        super().end_round(round)
        assert self._ksum is not None
        self.knowledge = None if self._ksum.empty else self._ksum.result()
        self._ksum = None
        mask = self.knowledge["knowledge.mask"] if self.knowledge is not None else None
        self._classes_shared = int(mask.sum()) if mask is not None else 0
        if self._classes_shared == 0:
            self.knowledge = None

    def privacy_metrics(self) -> dict[str, float]:
        """``epsilon`` (inf: the model and soft predictions carry no noise), and what the
        knowledge releases spent, ``epsilon_knowledge``, for the client that released most (R
        Gaussian releases composed by the accountant, q = 1: the representation means, or under
        ``protect: knowledge+model`` the counts, representation sums and soft-prediction sums
        together); ``knowledge_classes_shared``."""
        metrics = super().privacy_metrics()
        p = self.params
        assert isinstance(p, FedHKDParams)
        most = max(getattr(self, "releases", [0]) or [0])
        if self._protected():
            assert self.privacy is not None
            sigma = self.dp_side_release(p) or 0.0
            delta, accountant = self.privacy.delta, self.privacy.accountant
            metrics["epsilon_knowledge"] = (
                compute_epsilon([(sigma, 1.0, most)], delta, accountant) if most else 0.0
            )
        else:
            metrics["epsilon_knowledge"] = knowledge_epsilon(p, self._latent_dim(), most)
        metrics["knowledge_classes_shared"] = float(getattr(self, "_classes_shared", 0))
        return metrics

    def privacy_tags(self) -> dict[str, str]:
        """``dp_guarantee: none`` (no formal guarantee for the run) and, when the knowledge is
        noised, the relation ``epsilon_knowledge`` is stated under."""
        tags = super().privacy_tags()
        if self.privacy is None and self.params.sigma > 0:  # type: ignore[attr-defined]
            tags["dp_relation"] = RELATION
        return tags

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "knowledge": None
            if self.knowledge is None
            else {k: v.clone() for k, v in self.knowledge.items()},
            "releases": list(self.releases),
            "classes_shared": self._classes_shared,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.knowledge = state["knowledge"]
        self.releases = list(state["releases"])
        self._classes_shared = int(state["classes_shared"])

    # ------------------------------------------------------------------ client
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, FedHKDParams)
        model = self.client_model()
        weights = {k: v for k, v in task.payload.items() if not k.startswith("knowledge.")}
        model.load_state_dict(weights, strict=False)
        knowledge = (
            {k: task.payload[k].to(self.device) for k in KNOWLEDGE[:3]}
            if "knowledge.mask" in task.payload
            else None
        )
        metrics = self.client_eval(task, model, data, before=True)

        protected = self._protected()
        if protected:
            loss_fn: Any = hkd_objective(
                knowledge, lam=p.lam, gamma=p.gamma, temperature=p.temperature
            )
        else:

            def loss_fn(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return hkd_loss(
                    m, x, y, knowledge, lam=p.lam, gamma=p.gamma, temperature=p.temperature
                )

        metrics["train_loss"] = self.train_local(
            model, data, generator, round=task.round, loss_fn=loss_fn
        )
        metrics |= self.client_eval(task, model, data)
        state = model.state_dict()
        upload = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        images = normalize(data.train.images, data.info).to(self.device)
        dim = int(model.head.in_features)  # type: ignore[union-attr]
        common = {"num_classes": data.info.num_classes, "temperature": p.temperature, "nu": p.nu}
        if protected:
            mech = self.mechanism(dim)
            assert mech is not None  # sigma > 0 in this mode (dp_side_release)
            upload |= private_knowledge(
                model,
                images,
                data.train.labels,
                sigma=mech.noise_multiplier,
                zeta=mech.clip,
                generator=generator,
                **common,
            )
        else:
            upload |= local_knowledge(
                model,
                images,
                data.train.labels,
                mechanism=self.mechanism(dim),
                generator=generator,
                **common,
            )
        return ClientResult(task.client_id, len(data.train), upload, None, metrics)


@ALGORITHMS.register("fedhkd_star")
class FedHKDStar(FedHKD):
    """FedHKD* (the paper's ablation): gamma = 0, no representation term."""

    name = "fedhkd_star"
    Params = FedHKDStarParams


@ALGORITHMS.register("fedhkd_dp")
class FedHKDDP(FedHKD):
    """FedHKD with a full record-level guarantee: it runs only with ``privacy: {mechanism:
    dpsgd, protect: knowledge+model, ...}`` (module docstring), as ``dp_fedavg`` is FedAvg with
    DP-SGD required. Its own name keeps it apart from FedHKD on fronts and in search spaces."""

    name = "fedhkd_dp"
    requires_privacy = "dpsgd"
