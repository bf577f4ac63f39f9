"""The privacy evaluation any experiment (and so any sweep trial) can run: HyperFL's protocol,
scored against what a guess without the upload achieves.

At each chosen round, for each chosen client, ``images`` of the client's training records are
drawn (seeded). For each upload of ``batch`` records (1 in the paper's tables) the client's own
local update of that round is replayed on just those records, ``local_steps`` steps, through the
algorithm's own ``local_update`` and upload code, from the very payload and private state the
engine gives the client that round. The server's view of that upload (an
:class:`~flcore.attacks.base.Observation`) goes to the attack, and the reconstructions are
scored against the real records on de-normalised ``[0, 1]`` images.

Raw scores, per record, then the mean over every attacked (round, client, record) and the worst
case: ``leak_psnr``, ``leak_ssim``, ``leak_lpips`` (with real AlexNet weights),
``leak_psnr_max``, ``leak_ssim_max``, ``leak_lpips_min``.

Calibrated scores (:mod:`flcore.attacks.baselines`): per record, the baseline is the best
PSNR (SSIM) of the no-information guesses (the client-train pool's mean image; the class mean
too when labels are given), and

- ``leak_psnr_gain`` (``leak_ssim_gain``): the mean over records of ``max(0, attack -
  baseline)``; clamped per record, so a noisy reconstruction below the baseline never counts
  as "more private than nothing";
- ``leak_identified``: the excess over chance ``max(0, (a - c) / (1 - c))`` of the fraction
  ``a`` of records whose reconstruction is closer to them than to each of ``identify_k`` decoys
  of their class, ``c = 1 / (K + 1)``;
- ``leak_psnr_baseline``, ``leak_ssim_baseline``: the mean baselines, for reference.

Informative uploads (:mod:`flcore.attacks.signal`): ``leak_informative`` counts the records
whose own noise-free replayed update differs from its record-free replay (the same update with
no gradient from any record) in what the attack reads. The noise-free replay is a second
instance of the algorithm built from the same factory
keyword arguments with ``privacy.noise_multiplier`` set to 0: the same clipping, the same
client stream (DP-SGD draws its noise even at sigma 0, so record sampling is unchanged), no
noise; without DP the attacked upload itself is used. ``leak_psnr_gain_informative`` and
``leak_identified_informative`` are the calibrated scores over those records only (null when
there is none).

The attacker's knowledge (``known``): by default (``none``) the replayed update is the
client's step on the attacked records alone, HyperFL's protocol. With ``rest`` it is the
client's real step on its whole set (for a meta step: its support set and its query set), and
the attacker knows every record of it but the attacked ones, the adversary of differential
privacy's neighbouring relation: the surface simulates the real step with the candidates in
place of the attacked records (:meth:`GradientSurface.knowing`; only surfaces whose step is
one full-batch gradient can, which the config checks), and a record is informative when the
real step differs from the step without the attacked records. A meta step needs it to be
measured at all: five inner steps fit a lone record, and a one-record replay's release is
mostly float32 rounding (BENCHMARKS.md, session 35).

Rounds: :meth:`LeakageEvaluator.round_metrics` gives, at each attacked round, that round's
own values under the names above (so each metric's MLflow history is per round), plus
``leak_psnr_gain_worst_round`` and ``leak_identified_worst_round`` (the max over the rounds
attacked so far of each round's value) and ``leak_lpips_worst_round`` (the min: lower LPIPS
leaks more). :meth:`LeakageEvaluator.summary` gives the same names over every attacked record of
the run (``leak_informative`` then counts them all) and the worst rounds over every attacked
round. A sweep trial reports its latest round metrics, so there the plain names are the last
attacked round's values and the ``*_worst_round`` ones cover the whole schedule.

The replay runs in the engine's process before the round's clients train, on separate
instances of the algorithm, so it changes nothing in the run: no server state, no client
state, no random stream of the training (its own streams are derived from the seed, the
round and the client). An algorithm that uploads nothing (``local``) has nothing to attack:
its raw leakage metrics are null with the reason ``nothing uploaded``, and its calibrated ones
are declared (:data:`NOTHING_UPLOADED_LEAKAGE`): nothing can be recovered beyond a guess, so
every gain and identification is 0, and no record is informative.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientTask
from flcore.attacks.base import ATTACKS, Observation
from flcore.attacks.baselines import (
    RecordPrior,
    baseline_scores,
    chance_corrected,
    chance_tail,
    identify,
)
from flcore.attacks.metrics import LPIPS, match_to_truth, psnr, ssim
from flcore.attacks.signal import carries_record, record_free
from flcore.data import ArrayDataset, FederatedData, normalize
from flcore.executor import AlgorithmFactory, client_generator, one_torch_thread

__all__ = [
    "AttackSettings",
    "LeakageEvaluator",
    "LEAK_METRICS",
    "NOTHING_UPLOADED",
    "NOTHING_UPLOADED_LEAKAGE",
    "ReplayedUpload",
    "identified_p",
    "informative_scores",
]

NOTHING_UPLOADED = "nothing uploaded"
#: the summary metrics an evaluation reports (null where not measurable)
LEAK_METRICS = (
    "leak_psnr",
    "leak_ssim",
    "leak_lpips",
    "leak_psnr_max",
    "leak_ssim_max",
    "leak_lpips_min",
    "leak_psnr_baseline",
    "leak_ssim_baseline",
    "leak_psnr_gain",
    "leak_ssim_gain",
    "leak_identified",
    "leak_identified_p",
    "leak_informative",
    "leak_psnr_gain_informative",
    "leak_identified_informative",
    "leak_psnr_gain_worst_round",
    "leak_identified_worst_round",
    "leak_lpips_worst_round",
)
#: the values an algorithm that uploads nothing declares: its true calibrated leakage (nothing
#: can be recovered beyond a guess) and its informative uploads (none); raw scores stay null
NOTHING_UPLOADED_LEAKAGE: Mapping[str, float] = {
    "leak_psnr_gain": 0.0,
    "leak_ssim_gain": 0.0,
    "leak_identified": 0.0,
    "leak_identified_p": 1.0,
    "leak_informative": 0.0,
    "leak_psnr_gain_informative": 0.0,
    "leak_identified_informative": 0.0,
    "leak_psnr_gain_worst_round": 0.0,
    "leak_identified_worst_round": 0.0,
}


@dataclass(frozen=True)
class AttackSettings:
    """A validated ``attack`` config, as typed arguments.

    Attributes:
        name: the registered attack.
        rounds: rounds whose uploads are attacked (1-based, already resolved).
        clients: attacked client ids.
        images: records attacked per (round, client).
        batch: records per replayed upload (``images`` is a multiple of it).
        local_steps: local steps of the replayed update.
        labels: ``given`` (the attacker knows them) or ``auto`` (recovered by iDLG where the
            upload allows it, else given).
        params: the attack's own validated parameters (iterations included).
        seed: seed of the record draw, the decoys and the replay's streams.
        identify_k: decoys per record of ``leak_identified``.
        known: ``none`` (each replayed upload is the client's step on the attacked records
            alone) or ``rest`` (the client's real step; the attacker knows its other records).
    """

    name: str
    rounds: tuple[int, ...]
    clients: tuple[int, ...]
    images: int = 10
    batch: int = 1
    local_steps: int = 1
    labels: str = "given"
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    identify_k: int = 20
    known: str = "none"


@dataclass
class _Record:
    """One attacked record's scores (``None``: not measured, e.g. in an older checkpoint)."""

    round: int
    client: int
    psnr: float
    ssim: float
    lpips: float | None
    label_ok: float | None
    embedding_cos: float | None = None
    psnr_base: float | None = None
    ssim_base: float | None = None
    identified: float | None = None
    chance: float | None = None
    informative: bool | None = None


@dataclass
class ReplayedUpload:
    """A replayed upload: what the server sees, the records behind it (their ids in the train
    split) and, per record, whether the noise-free update carries gradient."""

    observation: Observation
    records: ArrayDataset
    ids: np.ndarray
    informative: bool | None


def _gain(value: float, base: float) -> float:
    return max(0.0, value - base)


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _calibrated(records: Sequence[_Record]) -> dict[str, float | None]:
    """``leak_psnr_gain``, ``leak_ssim_gain``, ``leak_identified`` and ``leak_identified_p``
    of ``records``."""
    based = [r for r in records if r.psnr_base is not None and r.ssim_base is not None]
    tested = [r for r in records if r.identified is not None and r.chance is not None]
    return {
        "leak_psnr_gain": _mean([_gain(r.psnr, r.psnr_base) for r in based]),  # type: ignore[arg-type]
        "leak_ssim_gain": _mean([_gain(r.ssim, r.ssim_base) for r in based]),  # type: ignore[arg-type]
        "leak_identified": chance_corrected(
            [r.identified for r in tested],  # type: ignore[misc]
            [r.chance for r in tested],  # type: ignore[misc]
        ),
        "leak_identified_p": chance_tail(
            [r.identified for r in tested],  # type: ignore[misc]
            [r.chance for r in tested],  # type: ignore[misc]
        ),
    }


def _informative_part(records: Sequence[_Record]) -> dict[str, float | None]:
    """``leak_informative`` and the ``*_informative`` scores of ``records``."""
    decided = [r for r in records if r.informative is not None]
    informative = [r for r in decided if r.informative]
    cal = _calibrated(informative) if informative else {}
    return {
        "leak_informative": float(len(informative)) if decided else None,
        "leak_psnr_gain_informative": cal.get("leak_psnr_gain"),
        "leak_identified_informative": cal.get("leak_identified"),
    }


def _saved(records: Sequence[Mapping[str, Any]], identify_k: int) -> list[_Record]:
    """Saved per-record scores (keys ``psnr``, ``ssim``, ``psnr_baseline``, ``ssim_baseline``,
    ``identified``, ``informative``) as records, each tested against ``identify_k`` decoys."""
    chance = 1.0 / (identify_k + 1)
    return [
        _Record(
            0,
            0,
            r.get("psnr"),
            r.get("ssim"),
            None,
            None,
            psnr_base=r.get("psnr_baseline"),
            ssim_base=r.get("ssim_baseline"),
            identified=r.get("identified"),
            chance=chance if r.get("identified") is not None else None,
            informative=r.get("informative"),
        )
        for r in records
    ]


def informative_scores(
    records: Sequence[Mapping[str, Any]], identify_k: int
) -> dict[str, float | None]:
    """``leak_informative`` and the ``*_informative`` scores recomputed from saved per-record
    scores, as :meth:`LeakageEvaluator.summary` computes them: for a saved result whose
    records were re-decided (benchmarks/reproduce_table3.py ``--check-cached``)."""
    return _informative_part(_saved(records, identify_k))


def identified_p(records: Sequence[Mapping[str, Any]], identify_k: int) -> float | None:
    """``leak_identified_p`` recomputed from saved per-record scores (a result saved before
    the metric existed)."""
    return _calibrated(_saved(records, identify_k))["leak_identified_p"]


class LeakageEvaluator:
    """An engine probe: attacks the chosen uploads before their round trains.

    Args:
        settings: what to attack.
        factory: builds the algorithm (a fresh instance replays each update).
        lpips: the LPIPS metric (default: torchvision's AlexNet when present).
        grid_images: records kept for the image grid (originals and reconstructions).
    """

    def __init__(
        self,
        settings: AttackSettings,
        factory: AlgorithmFactory,
        *,
        lpips: LPIPS | None = None,
        grid_images: int = 10,
    ) -> None:
        self.settings = settings
        training = factory.kwargs["training"]
        self.training = replace(training, epochs=settings.local_steps, batch_size=settings.batch)
        self.factory = AlgorithmFactory(factory.name, factory.kwargs | {"training": self.training})
        self.uploads = bool(ALGORITHMS.get(factory.name).uploads)
        privacy = factory.kwargs.get("privacy")
        # The noise-free twin of the replay (module doc); None where there is no noise.
        self.clean_factory: AlgorithmFactory | None = None
        if privacy is not None and float(getattr(privacy, "noise_multiplier", 0.0)) > 0:
            clean = replace(privacy, noise_multiplier=0.0)
            self.clean_factory = AlgorithmFactory(
                factory.name, self.factory.kwargs | {"privacy": clean}
            )
        self.attack = ATTACKS.create(
            settings.name,
            params=dict(settings.params),
            device=str(factory.kwargs.get("device", "cpu")),
        )
        self.lpips = lpips if lpips is not None else LPIPS()
        self.grid_images = grid_images
        self.records: list[_Record] = []
        self.grid: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original, reconstruction)
        self.seconds = 0.0
        self.label_source: str | None = None
        self.skipped: list[str] = []
        self._replayer: Any = None
        self._clean_replayer: Any = None
        self._prior: RecordPrior | None = None
        self._round_start = 0

    # ------------------------------------------------------------------ probe hooks
    def before_round(self, engine: Any, round: int, tasks: Sequence[ClientTask]) -> None:
        """Attack the chosen clients' uploads of ``round`` (before the round trains)."""
        s = self.settings
        self._round_start = len(self.records)
        if round not in s.rounds:
            return
        if not engine.algorithm.uploads:
            return
        by_client = {t.client_id: t for t in tasks}
        for cid in s.clients:
            task = by_client.get(cid)
            if task is None:
                self.skipped.append(f"client {cid} was not sampled in round {round}")
                continue
            self._attack_client(engine, round, task)

    def round_metrics(self, round: int) -> dict[str, float | None]:
        """The leakage of this round's attacks and the worst round so far (empty when it
        attacked nothing; the declared values where nothing is uploaded)."""
        if round not in self.settings.rounds:
            return {}
        if not self.uploads:
            return dict(NOTHING_UPLOADED_LEAKAGE)
        here = self.records[self._round_start :]
        if not here:
            return {}
        return self._aggregate(here) | self._worst_rounds(self.records)

    def summary(self, engine: Any) -> dict[str, Any]:
        """The final leakage metrics, over every attacked (round, client, record)."""
        out: dict[str, Any] = {k: None for k in LEAK_METRICS}
        out |= {"leak_images": 0, "leak_iterations": self._iterations()}
        if not engine.algorithm.uploads:
            out |= NOTHING_UPLOADED_LEAKAGE
            out["leak_reason"] = NOTHING_UPLOADED
            return out
        out |= self._aggregate(self.records) | self._worst_rounds(self.records)
        if not self.records:
            out["leak_reason"] = "; ".join(self.skipped) or "no attacked round was reached"
        if self.lpips.reason is not None:
            out["leak_lpips_reason"] = self.lpips.reason
        if self.records:
            # leak_identified's closeness: LPIPS where its weights are on this machine, else
            # SSIM (flcore.attacks.baselines.identify); the two can disagree on a record
            out["leak_identified_by"] = "lpips" if self.lpips.available else "ssim"
        return out

    # ------------------------------------------------------------------ the replay
    def _iterations(self) -> int:
        return int(self.attack.params.iterations)

    def _draw(self, round: int, cid: int, n_train: int) -> np.ndarray:
        rng = np.random.default_rng([self.settings.seed, 0xA77, round, cid])
        n = min(self.settings.images, n_train)
        return rng.choice(n_train, size=n, replace=False)

    def prior(self, data: FederatedData) -> RecordPrior:
        """The attacker's no-upload knowledge: the client-train pool (built once)."""
        if self._prior is None:
            pool = np.concatenate([np.asarray(a) for a in data.train.client_indices])
            train = data.splits.train
            self._prior = RecordPrior.from_pool(train.images, train.labels, pool)
        return self._prior

    def replay(self, engine: Any, round: int, task: ClientTask) -> list[ReplayedUpload]:
        """Replay ``task``'s client on its drawn records (``batch`` per upload): per upload,
        what the server sees, the records behind it and whether it carries them (one replay
        for both, where :meth:`observe` and :meth:`informative_flags` each replay)."""
        s, data = self.settings, engine.data
        cid = task.client_id
        if self._replayer is None:
            self._replayer = self.factory()
        if self.clean_factory is not None and self._clean_replayer is None:
            self._clean_replayer = self.clean_factory()
        train = data.client_train(cid)
        ids = np.asarray(data.train.client_indices[cid], dtype=np.int64)
        picks = self._draw(round, cid, len(train))
        surface = engine.algorithm.attack_surface(task.payload, cid)
        out = []
        for start in range(0, len(picks), s.batch):
            idx = torch.from_numpy(picks[start : start + s.batch])
            records = ArrayDataset(train.images[idx], train.labels[idx])
            here, cdata, without = surface, None, None
            client = ClientData(
                cid,
                records,
                data.client_test(cid),
                data.info,
                data.client_val(cid),
                public=data.public_set(),
                train_classes=train.labels.unique(),
            )
            if s.known == "rest":
                # the client's real step, and its neighbour without the attacked records
                rest = np.setdiff1d(np.arange(len(train)), idx.numpy())
                others = ArrayDataset(train.images[rest], train.labels[rest])
                cdata, without = replace(client, train=train), replace(client, train=others)
                query = client.val
                here = surface.knowing(
                    (normalize(others.images, data.info), others.labels),
                    (normalize(query.images, data.info), query.labels)
                    if query is not None
                    else None,
                )
            else:
                cdata = self._replayer.replay_data(client)
            replay_task = replace(task, evaluate=False)
            stream = (s.seed ^ 0xA77, round, cid * 100_003 + start)
            with one_torch_thread():
                result = self._replayer.local_update(cdata, replay_task, client_generator(*stream))
                clean = result.upload
                decider = self._clean_replayer or self._replayer
                if self._clean_replayer is not None:
                    clean = decider.local_update(
                        cdata, replay_task, client_generator(*stream)
                    ).upload
                if without is not None:
                    free = decider.local_update(
                        without, replay_task, client_generator(*stream)
                    ).upload
                else:
                    with record_free():
                        free = decider.local_update(
                            cdata, replay_task, client_generator(*stream)
                        ).upload
            informative = carries_record(here, clean, free, self.training, s.local_steps)
            obs = Observation(
                algorithm=engine.algorithm.name,
                round=round,
                client_id=cid,
                upload=result.upload,
                broadcast=task.payload,
                surface=here,
                training=self.training,
                local_steps=s.local_steps,
                num_records=len(idx),
                info=data.info,
                image_shape=tuple(train.images.shape[1:]),
                labels=records.labels,
                recover_labels=s.labels == "auto",
            )
            out.append(ReplayedUpload(obs, records, ids[idx.numpy()], informative))
        return out

    def observe(
        self, engine: Any, round: int, task: ClientTask
    ) -> tuple[list[Observation], list[ArrayDataset]]:
        """Replay ``task``'s client on its drawn records (``batch`` per upload) and return
        what the server sees of each replayed upload, with the records behind it."""
        uploads = self.replay(engine, round, task)
        return [u.observation for u in uploads], [u.records for u in uploads]

    def informative_flags(self, engine: Any, round: int, task: ClientTask) -> list[bool | None]:
        """Per replayed upload of ``task``'s client, whether it carries its record (the decision
        ``leak_informative`` counts), without attacking."""
        return [u.informative for u in self.replay(engine, round, task)]

    def _attack_client(self, engine: Any, round: int, task: ClientTask) -> None:
        cid = task.client_id
        uploads = self.replay(engine, round, task)
        t0 = time.perf_counter()
        observations = [u.observation for u in uploads]
        # uploads optimised together share a surface; with the rest known, each record's is
        # its own (the others' records are among its known ones)
        groups = [[o] for o in observations] if self.settings.known == "rest" else [observations]
        with one_torch_thread():  # repeatable to the bit on any machine, as the clients are
            recons = [r for group in groups for r in self.attack.reconstruct_many(group)]
        self.seconds += time.perf_counter() - t0
        prior = self.prior(engine.data)
        for up, rec in zip(uploads, recons, strict=True):
            self.label_source = rec.label_source
            emb = rec.extra.get("embedding")
            cos = None
            if emb is not None and isinstance(task.state, Mapping) and "embedding" in task.state:
                true = task.state["embedding"].flatten().float()
                cos = float(torch.nn.functional.cosine_similarity(emb.flatten(), true, dim=0))
            # the class mean is a no-information guess when the attack was handed the labels
            # (labels: given, or auto where the upload does not give them away), not when it
            # recovered them from the upload: that is leakage (flcore.attacks.baselines)
            self._score(
                prior,
                round,
                cid,
                up.records,
                up.ids,
                rec.images,
                rec.labels,
                up.informative,
                cos,
                labels_known=rec.label_source == "given",
            )

    def score_reconstructions(
        self,
        engine: Any,
        round: int,
        client: int,
        picks: np.ndarray,
        images: torch.Tensor,
    ) -> None:
        """Score ``images`` (``[n, C, H, W]`` in ``[0, 1]``) as reconstructions of ``client``'s
        training records ``picks`` (indices into its train set), exactly as an attack's
        reconstructions are scored (no attack runs; labels are taken as right, and whether the
        uploads were informative is unknown). For baselines and tests."""
        train = engine.data.client_train(client)
        idx = torch.as_tensor(np.asarray(picks, dtype=np.int64))
        records = ArrayDataset(train.images[idx], train.labels[idx])
        ids = np.asarray(engine.data.train.client_indices[client], dtype=np.int64)[idx.numpy()]
        self._round_start = len(self.records)
        self._score(
            self.prior(engine.data), round, client, records, ids, images, records.labels, None
        )

    def _score(
        self,
        prior: RecordPrior,
        round: int,
        cid: int,
        records: ArrayDataset,
        ids: np.ndarray,
        rec_images: torch.Tensor,
        rec_labels: torch.Tensor,
        informative: bool | None,
        cos: float | None = None,
        labels_known: bool | None = None,
    ) -> None:
        """Score one upload's reconstructions. ``labels_known``: whether the attacker had the
        records' labels without the upload (None: ``attack.labels`` is ``given``)."""
        s = self.settings
        truth = records.images.float() / 255.0
        order = match_to_truth(rec_images, truth) if len(truth) > 1 else torch.arange(1)
        images = rec_images[order]
        flat = rec_labels.reshape(-1)
        labels = flat[order] if flat.numel() == len(order) else flat
        p, q = psnr(images, truth), ssim(images, truth)
        lp = self.lpips(images, truth)
        known = s.labels == "given" if labels_known is None else labels_known
        guesses, decoys = [], []
        for i in range(len(truth)):
            label = int(records.labels[i])
            guesses.append(prior.guesses(records.images[i], label, labels_known=known))
            rng = np.random.default_rng([s.seed, 0x1D, round, cid, int(ids[i])])
            picked = prior.decoys(records.images[i], label, int(ids[i]), s.identify_k, rng)
            decoys.append(picked.float() / 255.0)
        bases = baseline_scores(guesses, truth)
        tests = identify(images, truth, decoys, self.lpips)
        for i in range(len(truth)):
            ok = float(int(labels.reshape(-1)[i]) == int(records.labels[i]))
            (psnr_base, ssim_base), test = bases[i], tests[i]
            self.records.append(
                _Record(
                    round,
                    cid,
                    float(p[i]),
                    float(q[i]),
                    None if lp is None else float(lp[i]),
                    ok,
                    cos,
                    psnr_base,
                    ssim_base,
                    None if test is None else float(test.identified),
                    None if test is None else test.chance,
                    informative,
                )
            )
            if len(self.grid) < self.grid_images:
                self.grid.append((truth[i], images[i]))

    # ------------------------------------------------------------------ results
    def _aggregate(self, records: Sequence[_Record]) -> dict[str, Any]:
        if not records:
            return {}
        ps = np.array([r.psnr for r in records])
        ss = np.array([r.ssim for r in records])
        out: dict[str, Any] = {
            "leak_psnr": float(ps.mean()),
            "leak_ssim": float(ss.mean()),
            "leak_psnr_max": float(ps.max()),
            "leak_ssim_max": float(ss.max()),
            "leak_images": len(records),
            "leak_label_accuracy": float(np.mean([r.label_ok for r in records])),
            "leak_seconds": self.seconds,
        }
        lp = [r.lpips for r in records if r.lpips is not None]
        out["leak_lpips"] = float(np.mean(lp)) if lp else None
        out["leak_lpips_min"] = float(np.min(lp)) if lp else None
        cos = [r.embedding_cos for r in records if r.embedding_cos is not None]
        if cos:
            out["leak_embedding_cosine"] = float(np.mean(cos))
        if math.isinf(out["leak_psnr"]):  # an exact copy: say so rather than average inf
            out["leak_psnr"] = float("inf")
        out["leak_psnr_baseline"] = _mean([r.psnr_base for r in records if r.psnr_base is not None])  # type: ignore[misc]
        out["leak_ssim_baseline"] = _mean([r.ssim_base for r in records if r.ssim_base is not None])  # type: ignore[misc]
        out |= _calibrated(records)
        # what leak_identified corrects: the fraction identified and the chance of a guess
        tested = [r for r in records if r.identified is not None and r.chance is not None]
        out["leak_identified_rate"] = _mean([float(r.identified) for r in tested])  # type: ignore[arg-type]
        out["leak_identified_chance"] = _mean([r.chance for r in tested])  # type: ignore[misc]
        out |= _informative_part(records)
        return out

    def _worst_rounds(self, records: Sequence[_Record]) -> dict[str, float | None]:
        """The worst attacked round's value of the calibrated scores and LPIPS: the max of
        each round's gain and identification, the min of its LPIPS."""
        by_round: dict[int, list[_Record]] = {}
        for r in records:
            by_round.setdefault(r.round, []).append(r)
        per = [_calibrated(rs) for rs in by_round.values()]
        lpips = [
            _mean([r.lpips for r in rs if r.lpips is not None])  # type: ignore[misc]
            for rs in by_round.values()
        ]

        def pick(values: Sequence[float | None], best: Any) -> float | None:
            known = [v for v in values if v is not None]
            return float(best(known)) if known else None

        return {
            "leak_psnr_gain_worst_round": pick([p["leak_psnr_gain"] for p in per], max),
            "leak_identified_worst_round": pick([p["leak_identified"] for p in per], max),
            "leak_lpips_worst_round": pick(lpips, min),
        }

    def grid_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(originals, reconstructions)`` of the first attacked records, or None."""
        if not self.grid:
            return None
        return torch.stack([g[0] for g in self.grid]), torch.stack([g[1] for g in self.grid])

    def state_dict(self) -> dict[str, Any]:
        return {
            "records": [vars(r).copy() for r in self.records],
            "grid": self.grid,
            "seconds": self.seconds,
            "label_source": self.label_source,
            "skipped": list(self.skipped),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # Records of older checkpoints lack the calibrated fields: they load as not measured.
        self.records = [_Record(**r) for r in state["records"]]
        self.grid = list(state["grid"])
        self.seconds = float(state["seconds"])
        self.label_source = state["label_source"]
        self.skipped = list(state["skipped"])
