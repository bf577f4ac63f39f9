"""What the knowledge-sharing algorithms share: the noised release of per-class mean
representations (FedHKD's Theorem 1 / Lemma 1 mechanism,
:class:`flcore.privacy.gaussian.GaussianMechanism`), its settings, and the epsilon it spends.

FedHKD releases its class means through it (sigma 7 by default); FedProto, whose papers add no
noise, can (sigma 0 by default), so that what its prototypes leak can be measured at the same
noise (issue 25: the knowledge inversion at sigma 0, 7 and 20 for both).

``epsilon_knowledge`` composes, with the accountant (Opacus RDP, q = 1), the releases of the
client that released most, at the mechanism's accounted noise multiplier (``sigma``, or
``sigma / sqrt(d)`` for ``knowledge_clip: coordinate``), under :data:`RELATION`: one record
replaced by another of the same class, the per-class counts public (Lemma 1's sensitivity
under our relation: the paper's proof of it removes a record). It covers the
class means only: the model weights (and FedHKD's soft predictions) go out un-noised, so the
run's own ``epsilon`` stays inf.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from flcore.algorithms.base import AlgorithmParams
from flcore.privacy.accounting import compute_epsilon
from flcore.privacy.gaussian import GaussianMechanism

__all__ = ["RELATION", "KnowledgeNoiseParams", "knowledge_epsilon", "knowledge_mechanism"]

#: the neighbouring relation ``epsilon_knowledge`` is stated under
RELATION = "replace-one-same-label"


class KnowledgeNoiseParams(AlgorithmParams):
    sigma: float = Field(0.0, ge=0, description="noise std in units of the sensitivity")
    knowledge_clip: Literal["l2", "coordinate"] = Field(
        "l2", description="clip each representation to L2 norm zeta, or each coordinate"
    )
    zeta: float | None = Field(
        None, gt=0, description="the clipping bound (default: 3 sqrt(d) for l2, 3 per coordinate)"
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta epsilon_knowledge is stated at")


def knowledge_mechanism(params: KnowledgeNoiseParams, dim: int) -> GaussianMechanism | None:
    """The class-mean release's mechanism for ``dim``-dimensional representations (None at
    sigma 0: plain means). The default zeta is the paper's 3 per coordinate, or for ``l2`` the
    L2 norm ``3 sqrt(d)`` of a vector within that box."""
    if params.sigma == 0:
        return None
    default = 3.0 * math.sqrt(dim) if params.knowledge_clip == "l2" else 3.0
    zeta = params.zeta if params.zeta is not None else default
    return GaussianMechanism(params.sigma, zeta, params.knowledge_clip)


def knowledge_epsilon(params: KnowledgeNoiseParams, dim: int, releases: int) -> float:
    """``epsilon_knowledge`` after ``releases`` releases of one client (0 before any; inf for
    un-noised releases)."""
    if releases == 0:
        return 0.0
    mech = knowledge_mechanism(params, dim)
    sigma = mech.accounted_multiplier(dim) if mech is not None else 0.0
    return compute_epsilon([(sigma, 1.0, releases)], params.delta, "rdp")
