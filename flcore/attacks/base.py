"""The attack contract: ``reconstruct(observation) -> Reconstruction``.

The threat model is an honest-but-curious server (HyperFL, Guo et al. AAAI 2025, section 4.1).
An :class:`Observation` holds exactly what such a server sees of one client in one round, and
nothing else:

- ``upload``: the tensors the client sent (what ``bytes_up`` counts);
- ``broadcast``: the shared tensors the server sent it;
- ``surface``: the public architecture as a differentiable simulation, built only from the
  broadcast and the protocol's public initial values (:mod:`flcore.attacks.surface`);
- ``training``: the public local-training hyperparameters (lr, momentum, weight decay), the
  local steps and the number of records in the attacked update;
- ``labels``: the true labels when the evaluation gives them (HyperFL's protocol assumes known
  labels), else None; with ``recover_labels`` an attack first tries to recover them from the
  upload (iDLG) and uses the given ones only where it cannot.

Attacks live one per file, registered in :data:`ATTACKS`; each validates its own parameters
(:class:`AttackParams`). An attack that needs a generative prior (ROG, Yue et al. 2023) fits the
same contract: its parameters name the prior, and it is registered like the others once such a
model can be loaded; none can be had offline here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flcore.algorithms.base import LocalTraining
from flcore.attacks.surface import GradientSurface
from flcore.data import DatasetInfo
from flcore.errors import ConfigError
from flcore.registry import Registry

__all__ = [
    "ATTACKS",
    "Attack",
    "AttackParams",
    "Observation",
    "Reconstruction",
    "LabelSource",
]

LabelSource = Literal["given", "idlg"]


@dataclass(frozen=True)
class Observation:
    """What an honest-but-curious server sees of one client's update (see the module doc)."""

    algorithm: str
    round: int
    client_id: int
    upload: Mapping[str, torch.Tensor]
    broadcast: Mapping[str, torch.Tensor]
    surface: GradientSurface
    training: LocalTraining
    local_steps: int
    num_records: int
    info: DatasetInfo
    image_shape: tuple[int, int, int]
    labels: torch.Tensor | None = None
    recover_labels: bool = True

    def target(self) -> dict[str, torch.Tensor]:
        """The gradient the upload implies, as the surface reads it (see
        :meth:`GradientSurface.pseudo_gradient`)."""
        return self.surface.pseudo_gradient(self.upload, self.training, self.local_steps)


@dataclass
class Reconstruction:
    """An attack's answer for one observation: normalised-space images are never returned.

    Attributes:
        images: ``[n, C, H, W]`` in ``[0, 1]`` (de-normalised), one per record of the update.
        labels: the labels the attack used.
        label_source: ``given`` (the evaluation supplied them) or ``idlg`` (recovered).
        iterations: optimisation steps taken.
        extra: attack-specific figures (e.g. the tailored attack's recovered embedding).
    """

    images: torch.Tensor
    labels: torch.Tensor
    label_source: LabelSource
    iterations: int
    extra: dict[str, Any] = field(default_factory=dict)


class AttackParams(BaseModel):
    """Knobs every gradient-matching attack shares; each attack may add its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iterations: int = Field(10_000, ge=1, description="optimisation steps")
    lr: float = Field(0.1, gt=0, description="step size of the image optimiser")
    seed: int = Field(0, ge=0, description="seed of the random initial images")


class Attack(ABC):
    """Base class of every attack. Subclasses register with ``@ATTACKS.register(name)``.

    Args:
        params: the validated attack parameters (or a mapping to validate).
        device: torch device of the optimisation.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[AttackParams]] = AttackParams
    #: the algorithms whose uploads this attack understands (None: any uploading algorithm)
    algorithms: ClassVar[frozenset[str] | None] = None

    def __init__(
        self, params: AttackParams | Mapping[str, Any] | None = None, device: str = "cpu"
    ) -> None:
        self.params = params if isinstance(params, AttackParams) else self.validate(params)
        self.device = torch.device(device)

    @classmethod
    def validate(cls, params: Mapping[str, Any] | None) -> AttackParams:
        """Validate the attack's parameters; errors name ``attack.<key>``."""
        try:
            return cls.Params.model_validate(dict(params or {}))
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(["attack", *map(str, err["loc"])])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            raise ConfigError(key, f"{msg} (for attack {cls.name!r})") from None

    @abstractmethod
    def reconstruct(self, observation: Observation) -> Reconstruction:
        """Reconstruct the records behind one observed update."""

    def reconstruct_many(self, observations: Sequence[Observation]) -> list[Reconstruction]:
        """Several observations of one round and client (one per attacked image); attacks
        that can, override this to optimise them together."""
        return [self.reconstruct(o) for o in observations]


ATTACKS: Registry[type[Attack]] = Registry("attack")
