"""Client-level DP (McMahan et al., "Learning Differentially Private Recurrent Language Models",
ICLR 2018): each sampled client's model update is clipped to L2 norm ``S``; the server adds
``N(0, sigma^2 S^2)`` to the sum and divides by the number of sampled clients ``m`` (the fixed,
unweighted estimator: weighting by n_i would let one client's weight change the sensitivity).

    w^{t+1} = w^t + (sum_i clip(w_i - w^t, S) + N(0, sigma^2 S^2 I)) / m

Accounting: one Gaussian release per round for the whole population, at sampling rate
``q = m / N`` (``q = 1``, no amplification, at full participation and in a forced full last
round). This protects a client's participation against everyone but the server that adds the
noise, a weaker threat model than ISRL-DP; HyperFL's DP baselines use ISRL-DP (``dp_fedavg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flcore.privacy.accounting import Accountant
from flcore.privacy.mechanisms import MECHANISMS
from flcore.privacy.settings import PrivacySettings

__all__ = ["ClientLevelDP"]


@MECHANISMS.register("client")
class ClientLevelDP:
    """Clipped-sum aggregation with server noise, plus the population's accountant."""

    def __init__(self, settings: PrivacySettings, num_clients: int) -> None:
        self.settings = settings
        self.num_clients = num_clients
        self.accountant = Accountant(settings.accountant)
        self._base: dict[str, torch.Tensor] | None = None
        self._sum: dict[str, torch.Tensor] = {}
        self._count = 0

    def begin(self, global_state: Mapping[str, torch.Tensor]) -> None:
        self._base = {k: v.detach().clone() for k, v in global_state.items()}
        self._sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in self._base.items()}
        self._count = 0

    def add(self, upload: Mapping[str, torch.Tensor]) -> float:
        """Clip one client's update and add it to the sum; returns its norm before clipping."""
        assert self._base is not None, "begin() was not called"
        delta = {k: upload[k].double() - self._base[k].double() for k in self._base}
        norm = float(torch.sqrt(sum(d.pow(2).sum() for d in delta.values())))
        scale = min(1.0, self.settings.clip / (norm + 1e-12))
        for k, d in delta.items():
            self._sum[k].add_(d, alpha=scale)
        self._count += 1
        return norm

    def result(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The new global state; composes this round's release into the accountant."""
        assert self._base is not None and self._count, "no client update was added"
        std = self.settings.noise_multiplier * self.settings.clip
        out = {}
        for k, base in self._base.items():
            noise = (
                torch.normal(0.0, std, size=base.shape, generator=generator, dtype=torch.float64)
                if std > 0
                else 0.0
            )
            out[k] = (base.double() + (self._sum[k] + noise) / self._count).to(base.dtype)
        self.accountant.step(self.settings.noise_multiplier, self._count / self.num_clients, 1)
        self._base = None
        return out

    def metrics(self) -> dict[str, float]:
        return {
            "epsilon": self.accountant.epsilon(self.settings.delta),
            "delta": self.settings.delta,
            "noise_multiplier": self.settings.noise_multiplier,
        }

    def state_dict(self) -> dict[str, Any]:
        return self.accountant.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state)
