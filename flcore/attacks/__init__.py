"""Gradient inversion attacks and leakage metrics (issue: privacy evaluation).

Importing this package registers every attack in :data:`ATTACKS`. See :mod:`.base` for the
contract, :mod:`.surface` for how an upload becomes a gradient to match, :mod:`.evaluation` for
the replay protocol that any experiment or sweep trial can run, :mod:`.baselines` for what a
guess without the upload achieves (the calibrated metrics) and :mod:`.signal` for whether an
upload carries any gradient at all.
"""

from __future__ import annotations

from flcore.attacks import dlg, hyperfl_tailored, ig, knowledge_inversion  # noqa: F401  (registration)
from flcore.attacks.base import ATTACKS, Attack, AttackParams, Observation, Reconstruction
from flcore.attacks.surface import GradientSurface, HyperSurface, ModelSurface

__all__ = [
    "ATTACKS",
    "Attack",
    "AttackParams",
    "GradientSurface",
    "HyperSurface",
    "ModelSurface",
    "Observation",
    "Reconstruction",
]
