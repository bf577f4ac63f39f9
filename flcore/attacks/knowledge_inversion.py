"""Knowledge inversion: what a released class representation gives away about a client's data.

Knowledge-sharing algorithms (FedProto, FedHKD) upload, beside their weights, the per-class mean
representation ``h~^j`` of the client's class-j training records (``knowledge.rep[j]``, possibly
noised). No paper measures what that release leaks; this attack asks how much of the client's
class-j *mean image* an honest-but-curious server recovers from it. With the model ``R`` the
client uploaded in the same message (its representation map ``model.represent``), it solves

    min_x  d(R(x), h~^j)  +  tv * TV(x),     x boxed to the valid pixel range

with Adam (step ``lr``, decayed x0.1 at 3/8, 5/8 and 7/8 of the iterations, as Inverting
Gradients, Geiping et al., NeurIPS 2020, whose total-variation prior this borrows), for a fixed
number of iterations, one image per shared class, the classes optimised together (independent
problems: Adam's updates are per coordinate).

Choices, stated:
- ``d`` is the relative squared L2 distance ``|R(x) - h~|^2 / |h~|^2`` by default: a mean
  representation is matched in direction and magnitude, and dividing by ``|h~|^2`` makes the
  TV weight mean the same for any model's feature scale. ``distance: cosine`` is
  ``1 - cos(R(x), h~)``.
- The start image is, by default, the constant image at the dataset's mean intensity (``0`` in
  normalised space: public knowledge, and no class information), ``init: mean`` the
  population's mean image, ``init: class_mean`` the population's class-j mean image (which is
  also the baseline below: the attack then starts at the baseline and its gain measures
  whether the release moves it toward the client's data).
- The model runs in evaluation mode (batch-norm statistics frozen).

Scoring, on de-normalised ``[0, 1]`` images with :func:`~flcore.attacks.metrics.psnr` and
:func:`~flcore.attacks.metrics.ssim`: the reconstruction of class j against the client's
class-j mean image (the mean over its class-j training records); the no-information baseline is
the *population's* class-j mean image (the training records of every other client, the
attacker's public-knowledge prior as in :mod:`flcore.attacks.baselines`; the class label is
known, since a row of ``knowledge.rep`` is a class). The attacked client's own records are left
out of the population, as :mod:`flcore.attacks.baselines` leaves the record out: a prior that
contains the truth is not a guess without information (with them in, a client holding a share
``f`` of class j raised the baseline by about ``-20 log10(1 - f)`` dB, 1.9 dB at ``f = 0.2``, and
so lowered the gain). ``init: mean`` and ``class_mean`` start from that same population. Per
shared class, then averaged over the shared classes: ``knowledge_psnr``,
``knowledge_psnr_baseline``, ``knowledge_psnr_gain = max(0, attack - baseline)`` (clamped per
class), the same for SSIM, ``knowledge_classes`` (how many were shared) and
``knowledge_rep_distance`` (the final relative L2 distance, whatever ``d``).

Two ways to run it:
- :class:`KnowledgeInversionProbe`, an engine probe: at each chosen round, each chosen client's
  update of that round is replayed (a fresh algorithm instance, the engine's payload, private
  state and random stream for that client, evaluation off: the upload the client sends, up to
  float rounding of the thread count) and its released classes are inverted and scored;
  ``round_metrics`` gives that round's figures and ``knowledge_psnr_gain_worst_round``.
- The registered attack ``knowledge_inversion`` fits the gradient-inversion contract
  (:class:`~flcore.attacks.base.Attack`): for a replayed upload of a few records (the
  leakage evaluation), each record's reconstruction is the inversion of its class's released
  row, from the constant start (an observation carries no population). With ``labels: auto``
  the labels are read off ``knowledge.counts`` (the release gives the label histogram away).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from flcore.algorithms.base import ClientData, ClientTask, ModelSpec, seeded
from flcore.attacks.base import ATTACKS, Attack, AttackParams, Observation, Reconstruction
from flcore.attacks.gradmatch import pixel_box, to_unit, total_variation
from flcore.attacks.metrics import psnr, ssim
from flcore.data import ArrayDataset, DatasetInfo

__all__ = [
    "KNOWLEDGE_METRICS",
    "KnowledgeInversion",
    "KnowledgeInversionParams",
    "KnowledgeInversionProbe",
    "KnowledgeScores",
    "class_mean_images",
    "invert_knowledge",
    "score_knowledge_inversion",
    "knowledge_scores",
]

Distance = Literal["l2", "cosine"]
Init = Literal["constant", "mean", "class_mean"]

#: what the probe reports (null where nothing was attacked)
KNOWLEDGE_METRICS = (
    "knowledge_psnr",
    "knowledge_ssim",
    "knowledge_psnr_baseline",
    "knowledge_ssim_baseline",
    "knowledge_psnr_gain",
    "knowledge_ssim_gain",
    "knowledge_classes",
    "knowledge_rep_distance",
    "knowledge_psnr_gain_worst_round",
)
_KEYS = ("knowledge.rep", "knowledge.mask")


class KnowledgeInversionParams(AttackParams):
    iterations: int = Field(500, ge=1, description="Adam steps of the image optimisation")
    lr: float = Field(0.1, gt=0, description="Adam step size on the (normalised) images")
    tv: float = Field(0.05, ge=0, description="weight of the total-variation prior")
    distance: Distance = Field(
        "l2", description="l2: |R(x) - h|^2 / |h|^2; cosine: 1 - cos(R(x), h)"
    )
    init: Init = Field(
        "constant",
        description="start image: the dataset-mean constant, the population mean image, or "
        "the population class mean (the probe and score function only)",
    )


# --------------------------------------------------------------------------- the inversion
def _distances(h: torch.Tensor, target: torch.Tensor, distance: Distance) -> torch.Tensor:
    if distance == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(h, target, dim=1)
    return (h - target).pow(2).sum(1) / target.pow(2).sum(1).clamp(min=1e-12)


def invert_knowledge(
    model: nn.Module,
    rep: torch.Tensor,
    *,
    info: DatasetInfo,
    shape: tuple[int, int, int],
    steps: int = 500,
    tv: float = 0.05,
    lr: float = 0.1,
    distance: Distance = "l2",
    init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images whose representation under ``model`` matches each row of ``rep`` (module doc).

    Args:
        model: a network with ``represent``; its parameters are not changed (nor their grads).
        rep: ``[k, d]`` target representations (or one ``[d]`` row).
        info: the dataset's normalisation.
        shape: ``(C, H, W)`` of an image.
        steps, tv, lr, distance: the optimisation (module doc).
        init: ``[k, C, H, W]`` start images in ``[0, 1]``; None: the dataset-mean constant.

    Returns:
        ``(images [k, C, H, W] in [0, 1], relative L2 distance at the start [k], at the end
        [k])``.
    """
    target = rep.detach().reshape(-1, rep.shape[-1]).float()
    device = next(model.parameters()).device
    target = target.to(device)
    k = len(target)
    mean = torch.tensor(info.mean, device=device).view(-1, 1, 1)
    std = torch.tensor(info.std, device=device).view(-1, 1, 1)
    if init is None:
        x0 = torch.zeros((k, *shape), device=device)
    else:
        x0 = (init.to(device).float().reshape(k, *shape) - mean) / std
    lo, hi = pixel_box(info, device)
    x = torch.maximum(torch.minimum(x0, hi), lo).clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    milestones = [int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    was_training = model.training
    model.eval()

    def rel_l2() -> torch.Tensor:
        with torch.no_grad():
            return _distances(model.represent(x).flatten(1), target, "l2").cpu()  # type: ignore[operator]

    try:
        start = rel_l2()
        for _ in range(steps):
            h = model.represent(x).flatten(1)  # type: ignore[operator]
            loss = _distances(h, target, distance).sum()
            if tv:
                loss = loss + tv * total_variation(x).sum()
            # grad of x only: the model's parameters (and their .grad) stay untouched
            (x.grad,) = torch.autograd.grad(loss, [x])
            opt.step()
            sched.step()
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, hi), lo))
        end = rel_l2()
    finally:
        model.train(was_training)
    return to_unit(x.detach(), info).cpu(), start, end


def class_mean_images(data: ArrayDataset, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean images ``[K, C, H, W]`` in ``[0, 1]`` (zeros for an absent class) and the
    per-class counts ``[K]``."""
    x = data.images.double() / 255.0
    labels = data.labels.reshape(-1)
    counts = torch.bincount(labels, minlength=num_classes)
    sums = torch.zeros((num_classes, *x.shape[1:]), dtype=torch.float64)
    sums.index_add_(0, labels, x)
    return (sums / counts.clamp(min=1).view(-1, 1, 1, 1)).float(), counts


def _model_with(model: nn.Module | ModelSpec, upload: Mapping[str, torch.Tensor]) -> nn.Module:
    """The uploaded network: ``model`` (a spec, built fresh, or a public copy of the
    architecture) with every uploaded tensor it has loaded."""
    if isinstance(model, ModelSpec):
        net = seeded((0, 0x4B1), model)  # every tensor is overwritten; no global RNG draw
        missing = [k for k in net.state_dict() if k not in upload]
        if missing:
            raise ValueError(
                f"the upload lacks model tensors {missing[:3]}...: give the public network "
                "(e.g. the attack surface's model) instead of a spec"
            )
    else:
        net = copy.deepcopy(model)
    state = net.state_dict()
    net.load_state_dict({k: upload.get(k, v) for k, v in state.items()})
    return net.requires_grad_(False)


def _check_upload(upload: Mapping[str, torch.Tensor]) -> None:
    missing = [k for k in _KEYS if k not in upload]
    if missing:
        raise ValueError(
            f"the upload has no {', '.join(missing)}: knowledge inversion needs a "
            "knowledge-sharing upload (fedproto, fedhkd)"
        )


# --------------------------------------------------------------------------- scoring
@dataclass
class KnowledgeScores:
    """Per shared class: its reconstruction and scores (all images ``[k, C, H, W]`` in
    ``[0, 1]``; scores ``[k]``)."""

    classes: torch.Tensor
    images: torch.Tensor
    truth: torch.Tensor
    baseline: torch.Tensor
    psnr: torch.Tensor
    ssim: torch.Tensor
    psnr_baseline: torch.Tensor
    ssim_baseline: torch.Tensor
    distance_start: torch.Tensor
    distance_end: torch.Tensor

    def rows(self) -> list[dict[str, float]]:
        """One dict per class (what the probe keeps)."""
        return [
            {
                "class": float(self.classes[i]),
                "psnr": float(self.psnr[i]),
                "ssim": float(self.ssim[i]),
                "psnr_base": float(self.psnr_baseline[i]),
                "ssim_base": float(self.ssim_baseline[i]),
                "distance": float(self.distance_end[i]),
            }
            for i in range(len(self.classes))
        ]

    def metrics(self) -> dict[str, float | None]:
        """The class-averaged metrics (module doc)."""
        return aggregate(self.rows())


def aggregate(rows: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    """``knowledge_*`` means over per-class rows (gains clamped per row); nulls for none."""
    if not rows:
        return {k: None for k in KNOWLEDGE_METRICS if k != "knowledge_psnr_gain_worst_round"}

    def mean(f: Any) -> float:
        return float(np.mean([f(r) for r in rows]))

    return {
        "knowledge_psnr": mean(lambda r: r["psnr"]),
        "knowledge_ssim": mean(lambda r: r["ssim"]),
        "knowledge_psnr_baseline": mean(lambda r: r["psnr_base"]),
        "knowledge_ssim_baseline": mean(lambda r: r["ssim_base"]),
        "knowledge_psnr_gain": mean(lambda r: max(0.0, r["psnr"] - r["psnr_base"])),
        "knowledge_ssim_gain": mean(lambda r: max(0.0, r["ssim"] - r["ssim_base"])),
        "knowledge_classes": float(len(rows)),
        "knowledge_rep_distance": mean(lambda r: r["distance"]),
    }


def knowledge_scores(
    upload: Mapping[str, torch.Tensor],
    model: nn.Module | ModelSpec,
    client_train: ArrayDataset,
    population_train: ArrayDataset,
    info: DatasetInfo,
    *,
    steps: int = 500,
    tv: float = 0.05,
    lr: float = 0.1,
    distance: Distance = "l2",
    init: Init = "constant",
) -> KnowledgeScores:
    """Invert every class ``upload`` shares and score it (module doc).

    Args:
        upload: a knowledge-sharing upload: model weights and ``knowledge.rep``/``mask``.
        model: the model's spec (the upload holds every tensor) or its public architecture.
        client_train: the client's training records (the truth: its class mean images).
        population_train: the population's training records (the baseline's class means).
        info: the dataset's facts (normalisation, classes).
    """
    _check_upload(upload)
    net = _model_with(model, upload)
    k = info.num_classes
    truth_all, client_n = class_mean_images(client_train, k)
    pop_all, pop_n = class_mean_images(population_train, k)
    mask = upload["knowledge.mask"].reshape(-1) > 0
    shared = torch.nonzero(mask & (client_n > 0) & (pop_n > 0)).flatten()
    shape = tuple(client_train.images.shape[1:])
    start = None
    if init == "mean":
        whole = population_train.images.double().mean(0) / 255.0
        start = whole.float().expand(len(shared), *shape)
    elif init == "class_mean":
        start = pop_all[shared]
    if len(shared) == 0:
        empty = torch.zeros((0, *shape))
        none = torch.zeros(0)
        return KnowledgeScores(shared, empty, empty, empty, *[none] * 6)
    images, d0, d1 = invert_knowledge(
        net,
        upload["knowledge.rep"][shared],
        info=info,
        shape=shape,  # type: ignore[arg-type]
        steps=steps,
        tv=tv,
        lr=lr,
        distance=distance,
        init=start,
    )
    truth, base = truth_all[shared], pop_all[shared]
    return KnowledgeScores(
        shared,
        images,
        truth,
        base,
        psnr(images, truth),
        ssim(images, truth),
        psnr(base, truth),
        ssim(base, truth),
        d0,
        d1,
    )


def score_knowledge_inversion(
    upload: Mapping[str, torch.Tensor],
    model: nn.Module | ModelSpec,
    client_train: ArrayDataset,
    population_train: ArrayDataset,
    info: DatasetInfo,
    **options: Any,
) -> dict[str, float | None]:
    """The class-averaged ``knowledge_*`` metrics of :func:`knowledge_scores`."""
    return knowledge_scores(
        upload, model, client_train, population_train, info, **options
    ).metrics()


# --------------------------------------------------------------------------- the attack
@ATTACKS.register("knowledge_inversion")
class KnowledgeInversion(Attack):
    """Invert released class representations into images (module doc)."""

    name = "knowledge_inversion"
    Params = KnowledgeInversionParams
    algorithms = frozenset({"fedproto", "fedhkd", "fedhkd_star"})

    def options(self) -> dict[str, Any]:
        p = self.params
        assert isinstance(p, KnowledgeInversionParams)
        return {"steps": p.iterations, "tv": p.tv, "lr": p.lr, "distance": p.distance}

    def _labels(self, o: Observation) -> tuple[torch.Tensor, Literal["given", "idlg"]]:
        counts = o.upload.get("knowledge.counts")
        if o.recover_labels and counts is not None:
            n = counts.round().long().clamp(min=0)
            if int(n.sum()) == o.num_records:  # the label histogram is released
                return torch.repeat_interleave(torch.arange(len(n)), n), "idlg"
        if o.labels is None:
            raise ValueError("the labels cannot be read off knowledge.counts and none were given")
        return o.labels.reshape(-1).long(), "given"

    def reconstruct(self, observation: Observation) -> Reconstruction:
        p = self.params
        assert isinstance(p, KnowledgeInversionParams)
        if p.init != "constant":
            raise ValueError(
                "attack.params.init: an observation carries no population; the "
                "knowledge_inversion attack starts from the constant image (init 'mean' and "
                "'class_mean' are for the knowledge probe)"
            )
        o = observation
        _check_upload(o.upload)
        public = getattr(o.surface, "model", None)
        if public is None:
            raise ValueError(f"the {o.algorithm} attack surface exposes no model")
        net = _model_with(public, o.upload).to(self.device)
        labels, source = self._labels(o)
        mask = o.upload["knowledge.mask"].reshape(-1)
        reps = o.upload["knowledge.rep"][labels]
        images, _, end = invert_knowledge(
            net, reps, info=o.info, shape=o.image_shape, **self.options()
        )
        unshared = mask[labels] <= 0  # nothing released for the class: the start image
        if bool(unshared.any()):
            images[unshared] = to_unit(torch.zeros((1, *o.image_shape)), o.info)
        return Reconstruction(
            images, labels, source, p.iterations, extra={"rep_distance": end.tolist()}
        )


# --------------------------------------------------------------------------- the probe
class KnowledgeInversionProbe:
    """An engine probe (see :class:`~flcore.engine.Engine`): inverts the chosen clients'
    released class representations at the chosen rounds (module doc).

    Args:
        settings: the attack config as typed arguments
            (:class:`~flcore.attacks.evaluation.AttackSettings`: its ``rounds``, ``clients`` and
            ``params`` are used; ``images``, ``batch``, ``local_steps``, ``labels`` and
            ``identify_k`` do not apply).
        factory: builds the algorithm (a fresh instance replays each update).
    """

    def __init__(self, settings: Any, factory: Any) -> None:
        self.settings = settings
        self.factory = factory
        params = KnowledgeInversion.validate(dict(settings.params))
        assert isinstance(params, KnowledgeInversionParams)
        self.params = params
        self.rows: list[dict[str, float]] = []
        self.skipped: list[str] = []
        self.seconds = 0.0
        self._replayer: Any = None
        self._pools: dict[int, ArrayDataset] = {}
        self._round_start = 0

    def _population(self, data: Any, client: int) -> ArrayDataset:
        """Every other client's training records (each once), ``client``'s own left out: the
        attacker's prior must not contain the data it is scored against (module doc)."""
        if client not in self._pools:
            indices = data.train.client_indices
            others = [np.asarray(a) for c, a in enumerate(indices) if c != client]
            ids = np.setdiff1d(
                np.unique(np.concatenate(others)) if others else np.zeros(0, np.int64),
                np.asarray(indices[client]),
            )
            idx = torch.from_numpy(ids.astype(np.int64))
            train = data.splits.train
            self._pools[client] = ArrayDataset(train.images[idx], train.labels[idx])
        return self._pools[client]

    def before_round(self, engine: Any, round: int, tasks: Sequence[ClientTask]) -> None:
        """Replay and attack the chosen clients' uploads of ``round``."""
        from flcore.executor import client_generator, one_torch_thread

        self._round_start = len(self.rows)
        if round not in self.settings.rounds:
            return
        by_client = {t.client_id: t for t in tasks}
        fed = engine.data
        if self._replayer is None:
            self._replayer = self.factory()
        p = self.params
        for cid in self.settings.clients:
            task = by_client.get(cid)
            if task is None:
                self.skipped.append(f"client {cid} was not sampled in round {round}")
                continue
            data = ClientData(
                cid, fed.client_train(cid), fed.client_test(cid), fed.info, fed.client_val(cid)
            )
            gen = client_generator(task.seed, round, cid)
            t0 = time.perf_counter()
            with one_torch_thread():
                upload = self._replayer.local_update(data, replace(task, evaluate=False), gen)
                scores = knowledge_scores(
                    upload.upload,
                    self.factory.kwargs["model_spec"],
                    data.train,
                    self._population(fed, cid),
                    fed.info,
                    steps=p.iterations,
                    tv=p.tv,
                    lr=p.lr,
                    distance=p.distance,
                    init=p.init,
                )
            self.seconds += time.perf_counter() - t0
            for row in scores.rows():
                self.rows.append(row | {"round": float(round), "client": float(cid)})

    def _worst_round(self) -> float | None:
        by_round: dict[float, list[dict[str, float]]] = {}
        for r in self.rows:
            by_round.setdefault(r["round"], []).append(r)
        gains = [aggregate(rs)["knowledge_psnr_gain"] for rs in by_round.values()]
        known = [g for g in gains if g is not None]
        return max(known) if known else None

    def round_metrics(self, round: int) -> dict[str, float | None]:
        """This round's figures and the worst round so far (empty when it attacked nothing)."""
        here = self.rows[self._round_start :]
        if round not in self.settings.rounds or not here:
            return {}
        return aggregate(here) | {"knowledge_psnr_gain_worst_round": self._worst_round()}

    def summary(self, engine: Any) -> dict[str, Any]:
        """Every attacked class of the run, averaged, and the worst round."""
        out: dict[str, Any] = dict(aggregate(self.rows))
        out["knowledge_psnr_gain_worst_round"] = self._worst_round()
        out["knowledge_seconds"] = self.seconds
        out["knowledge_iterations"] = self.params.iterations
        if not self.rows:
            out["knowledge_reason"] = "; ".join(self.skipped) or "no attacked round was reached"
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": [dict(r) for r in self.rows],
            "skipped": list(self.skipped),
            "seconds": self.seconds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rows = [dict(r) for r in state["rows"]]
        self.skipped = list(state["skipped"])
        self.seconds = float(state["seconds"])
