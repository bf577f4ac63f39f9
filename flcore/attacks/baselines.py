"""What a guess without the upload achieves: per-record baselines and the identification test.

Raw PSNR and SSIM of a reconstruction say little on their own: on real FMNIST the dataset's
mean image scores about 10.9 dB against attacked records, a constant grey 9.4 dB and IG's random
start 6.9 dB, so a 7 dB "reconstruction" recovered nothing. Two calibrations are built here, on
de-normalised ``[0, 1]`` images with the same :func:`~flcore.attacks.metrics.psnr` and
:func:`~flcore.attacks.metrics.ssim` as the raw scores.

**Baselines.** The attacker's prior knowledge is the *client-train pool*: the union of every
client's training records (each counted once). Public-knowledge assumption: the attacker knows
the distribution the federation's records come from (for a public benchmark, it has the data
set); the pool is the best estimate of it that the run itself defines. The no-information
guesses for a record are

- the pool's mean image, and
- when the attacker knows the record's label without the upload (``attack.labels: given``, or
  ``auto`` where the upload does not give the labels away and the attack is handed them), the
  mean image of the record's class.

Both leave the record itself out (``(sum - x) / (n - 1)``): a guess that contains the record is
not a guess without information; on a 12,000-record pool the difference is about 1e-4 dB.
The baseline PSNR (SSIM) of a record is the best PSNR (SSIM) over its guesses. Where ``auto``
labels are recovered from the upload (iDLG), only the mean image is a no-information guess: a
label recovered from the upload is leakage, so it must not raise the baseline.

**Identification.** For each attacked record, K other records of its class are drawn from the
pool (seeded per record, the record and any pixel-identical copy of it excluded: a duplicate
cannot be told apart, and counting it would under-report identification). The record is
*identified* when its reconstruction is strictly closer to it than to each of the K decoys:
SSIM higher, or LPIPS lower where real LPIPS weights are present (a perceptual distance is the
better judge; SSIM is the fallback everyone can compute). A guess that ignores the record is
identified with probability ``c = 1 / (K + 1)``; the excess over chance of the fraction ``a``
identified, ``max(0, (a - c) / (1 - c))``, is 0 at chance and 1 when every record is
identified (:func:`chance_corrected`). A class with fewer than K other records gives fewer
decoys, and that record's chance is ``1 / (k + 1)`` for its own ``k``; ``c`` is then the
mean chance of the records counted. A record with no decoy at all is not counted. How likely
chance alone is to identify as many (:func:`chance_tail`) says whether a small excess means
anything: 2 of 10 records at ``c = 1/21`` happen by chance 8% of the time, 4 of 10 0.1%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from flcore.attacks.metrics import LPIPS, psnr, ssim

__all__ = [
    "Identification",
    "RecordPrior",
    "baseline_scores",
    "chance_corrected",
    "chance_tail",
    "identify",
]


class RecordPrior:
    """The attacker's knowledge without any upload: the pool's images by class (module doc).

    Args:
        images: the pool's records, uint8 ``[N, C, H, W]``.
        labels: their labels ``[N]``.
        ids: an id per record (its index in the dataset's train split), to exclude a record
            from its own decoys.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, ids: np.ndarray) -> None:
        if not len(images) == len(labels) == len(ids) or len(images) < 2:
            raise ValueError("a prior needs at least 2 records with one label and id each")
        self.images = images
        self.labels = labels.reshape(-1).long()
        self.ids = np.asarray(ids, dtype=np.int64)
        x = images.double()
        self.count = len(images)
        self.total = x.sum(0)
        classes = int(self.labels.max()) + 1
        self.class_count = torch.bincount(self.labels, minlength=classes)
        self.class_total = torch.zeros((classes, *x.shape[1:]), dtype=torch.float64)
        self.class_total.index_add_(0, self.labels, x)
        self._by_class = {
            int(c): torch.nonzero(self.labels == c).flatten().numpy() for c in range(classes)
        }

    @classmethod
    def from_pool(cls, train_images: torch.Tensor, train_labels: torch.Tensor, pool: np.ndarray):  # type: ignore[no-untyped-def]
        """The prior of the records ``pool`` (indices into the train split, repeats allowed)."""
        ids = np.unique(np.asarray(pool, dtype=np.int64))
        idx = torch.from_numpy(ids)
        return cls(train_images[idx], train_labels[idx], ids)

    def guesses(self, record: torch.Tensor, label: int, labels_known: bool) -> torch.Tensor:
        """The no-information guesses for one pool record (uint8 ``[C, H, W]``), ``[g, C, H,
        W]`` in ``[0, 1]``: the leave-one-out pool mean and, with ``labels_known``, the
        leave-one-out mean of its class (when the class has another record)."""
        x = record.double()
        out = [(self.total - x) / (self.count - 1)]
        n = int(self.class_count[label]) if label < len(self.class_count) else 0
        if labels_known and n > 1:
            out.append((self.class_total[label] - x) / (n - 1))
        return (torch.stack(out) / 255.0).float()

    def decoys(
        self, record: torch.Tensor, label: int, record_id: int, k: int, rng: np.random.Generator
    ) -> torch.Tensor:
        """Up to ``k`` other pool records of class ``label`` (uint8 ``[k', C, H, W]``), drawn
        with ``rng``, never the record itself nor a pixel-identical copy of it."""
        members = self._by_class.get(int(label), np.empty(0, dtype=np.int64))
        picked: list[int] = []
        for j in rng.permutation(members):
            if self.ids[j] == record_id or torch.equal(self.images[j], record):
                continue
            picked.append(int(j))
            if len(picked) == k:
                break
        if not picked:
            return self.images[:0]
        return self.images[torch.tensor(picked)]


def _split(values: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    return list(torch.split(values, list(sizes)))


def baseline_scores(
    guesses: Sequence[torch.Tensor], truths: torch.Tensor
) -> list[tuple[float, float]]:
    """Per record ``i``: (best PSNR, best SSIM) of its guesses ``guesses[i]`` (``[g, C, H,
    W]``) against ``truths[i]`` (``[C, H, W]``), all in ``[0, 1]``; each maximised on its own.
    Scored in one batch (SSIM's convolutions dominate the cost)."""
    sizes = [len(g) for g in guesses]
    t = torch.cat([truths[i].expand_as(g) for i, g in enumerate(guesses)])
    g = torch.cat(list(guesses))
    ps, ss = _split(psnr(g, t), sizes), _split(ssim(g, t), sizes)
    return [(float(p.max()), float(q.max())) for p, q in zip(ps, ss, strict=True)]


@dataclass(frozen=True)
class Identification:
    """One record's identification test: ``identified`` (its reconstruction is strictly
    closer to it than to every decoy) and ``chance`` (``1 / (k + 1)`` for ``k`` decoys)."""

    identified: bool
    chance: float


def identify(
    recons: torch.Tensor,
    truths: torch.Tensor,
    decoys: Sequence[torch.Tensor],
    lpips: LPIPS | None = None,
) -> list[Identification | None]:
    """Per record ``i``: is ``recons[i]`` closer to ``truths[i]`` than to each of
    ``decoys[i]`` (``[k, C, H, W]``)? All in ``[0, 1]``. LPIPS when ``lpips`` is available,
    else SSIM; None for a record without decoys."""
    sizes = [len(d) + 1 if len(d) else 0 for d in decoys]
    if not any(sizes):
        return [None] * len(decoys)
    cands = torch.cat([torch.cat([truths[i : i + 1], d]) for i, d in enumerate(decoys) if len(d)])
    r = torch.cat([recons[i].expand(n, *recons.shape[1:]) for i, n in enumerate(sizes) if n])
    if lpips is not None and lpips.available:
        d = lpips(r, cands)
        assert d is not None
        scores = -d  # lower LPIPS is closer
    else:
        scores = ssim(r, cands)
    out: list[Identification | None] = []
    parts = iter(_split(scores, [n for n in sizes if n]))
    for n in sizes:
        if not n:
            out.append(None)
            continue
        s = next(parts)
        out.append(Identification(bool((s[0] > s[1:]).all()), 1.0 / n))
    return out


def chance_tail(identified: Sequence[float], chance: Sequence[float]) -> float | None:
    """The probability that chance alone identifies at least as many of these records as
    ``identified`` counts: record ``i`` picked with probability ``chance[i]`` independently of
    the others (a reconstruction that says nothing of its record is as close to it as to any
    decoy), the upper tail of that Poisson-binomial count. Small: more identified than chance
    explains. None for no record."""
    if len(identified) == 0:
        return None
    dist = np.zeros(len(chance) + 1)  # dist[j]: P(j records picked by chance)
    dist[0] = 1.0
    for c in chance:
        dist[1:] = dist[1:] * (1.0 - c) + dist[:-1] * c
        dist[0] *= 1.0 - c
    hits = int(round(float(np.sum(identified))))
    if hits == 0:
        return 1.0
    return float(min(1.0, dist[hits:].sum()))


def chance_corrected(identified: Sequence[float], chance: Sequence[float]) -> float | None:
    """``max(0, (a - c) / (1 - c))``: ``a`` the fraction identified, ``c`` the mean chance
    (None for no record)."""
    if len(identified) == 0:
        return None
    a, c = float(np.mean(identified)), float(np.mean(chance))
    return max(0.0, (a - c) / (1.0 - c))
