"""Client-level DP (McMahan et al., "Learning Differentially Private Recurrent Language Models",
ICLR 2018): each sampled client's model update is clipped to L2 norm ``S``; the server adds
``N(0, sigma^2 S^2)`` to the sum and divides by a denominator fixed before the round (the
unweighted estimator, ``w_i = 1``: weighting by ``n_i`` would let one client's weight change
the sensitivity). The sampling scheme, ``privacy.client_sampling``, decides the denominator and
the accounting, so that the two always agree:

``poisson`` (default; the paper's scheme): each of the ``N`` clients joins round ``t``
independently with probability ``q`` (``client_fraction``; ``q = 1`` in a forced full last
round), and the server divides by the expected count ``qN`` (the paper's fixed-denominator
estimator ``f~_f``), never by the number that came::

    w^{t+1} = w^t + (sum_{i in C_t} clip(w_i - w^t, S) + N(0, sigma^2 S^2 I)) / (q N)

Adding or removing one client changes the clipped sum by at most ``S`` and the denominator not
at all, so a round is ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` under the
**add/remove** relation. A round may sample no client: nobody trains, but the server still
releases ``w^t + noise / (qN)`` and the accountant still counts the round (the event's privacy
comes from not knowing who was sampled; skipping empty rounds would reveal that).

``fixed``: exactly ``m = max(1, int(q N))`` clients, without replacement (``m = N`` in a forced
full round), and the server divides by ``m``. Fixed-size sampling is analysed only under the
**replace-one** relation, where swapping one client's data moves the clipped sum by up to ``2S``;
a round is dp-accounting's ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(sigma /
2))`` (the library reads sigma relative to ``2S``), composed by its RDP accountant with
``NeighboringRelation.REPLACE_ONE``. The PLD and PRV accountants cannot account it: the config
refuses them (``privacy.accountant``).

Epsilons of the two schemes are under different relations and not comparable; each run is
tagged ``client_sampling`` and ``dp_relation`` (``Algorithm.privacy_tags``).

Deviation and history, stated: before this scheme choice the server sampled a fixed ``m``,
divided by the count and accounted Poisson sampling at ``q = m / N`` under add/remove, a bound
that does not hold for fixed-size sampling (it under-reported epsilon). Checkpoints of that time
resume only with ``client_sampling: fixed``, whose accounting is valid for the rounds they ran.

This protects a client's participation against everyone but the server that adds the noise, a
weaker threat model than ISRL-DP; HyperFL's DP baselines use ISRL-DP (``dp_fedavg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from flcore.errors import ConfigError
from flcore.privacy.accounting import Accountant
from flcore.privacy.mechanisms import MECHANISMS
from flcore.privacy.settings import PrivacySettings

__all__ = ["ClientLevelDP"]


@MECHANISMS.register("client")
class ClientLevelDP:
    """Client sampling, clipped-sum aggregation with server noise, and the population's
    accountant, for one scheme (``settings.client_sampling``).

    A round: :meth:`sample_clients`, :meth:`begin`, :meth:`add` per client, :meth:`result`.
    """

    def __init__(self, settings: PrivacySettings, num_clients: int) -> None:
        self.settings = settings
        self.num_clients = num_clients
        self.sampling = settings.client_sampling
        self.accountant = Accountant(
            settings.accountant,
            sampling=self.sampling,
            population=num_clients if self.sampling == "fixed" else None,
        )
        self._base: dict[str, torch.Tensor] | None = None
        self._sum: dict[str, torch.Tensor] = {}
        self._count = 0
        #: this round's sampling rate (q, or m / N), set by sample_clients
        self._rate: float | None = None

    def sample_clients(
        self, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        """The clients of one round, sorted, drawn as the scheme says (possibly none under
        Poisson sampling); remembers the round's rate for :meth:`result`."""
        n = self.num_clients
        if force_all:
            self._rate = 1.0
            return list(range(n))
        if self.sampling == "poisson":
            self._rate = float(fraction)
            return [int(i) for i in np.flatnonzero(rng.random(n) < fraction)]
        m = max(1, int(fraction * n))
        self._rate = m / n
        return sorted(int(i) for i in rng.choice(n, size=m, replace=False))

    def begin(self, global_state: Mapping[str, torch.Tensor]) -> None:
        # on the CPU, where uploads arrive and the noise generator draws, whatever the device
        self._base = {k: v.detach().to("cpu", copy=True) for k, v in global_state.items()}
        self._sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in self._base.items()}
        self._count = 0

    def add(self, upload: Mapping[str, torch.Tensor]) -> float:
        """Clip one client's update and add it to the sum; returns its norm before clipping."""
        if self._base is None:
            raise RuntimeError("begin() was not called")
        # an upload may arrive on the device (the vectorized executor's): the sum is on the CPU
        delta = {k: upload[k].to("cpu", torch.float64) - self._base[k].double() for k in self._base}
        norm = float(torch.sqrt(sum(d.pow(2).sum() for d in delta.values())))
        scale = min(1.0, self.settings.clip / (norm + 1e-12))
        for k, d in delta.items():
            self._sum[k].add_(d, alpha=scale)
        self._count += 1
        return norm

    def _denominator(self) -> float:
        if self.sampling == "fixed":
            if not self._count:
                raise RuntimeError("fixed-size sampling: no client update was added")
            if self._rate is not None and round(self._rate * self.num_clients) != self._count:
                raise RuntimeError(
                    f"fixed-size sampling drew {round(self._rate * self.num_clients)} clients "
                    f"but {self._count} updates were added"
                )
            return float(self._count)
        if self._rate is None:
            raise RuntimeError("Poisson sampling: sample_clients() was not called this round")
        return self._rate * self.num_clients

    def result(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The new global state; composes this round's release into the accountant. Under
        Poisson sampling a round without clients still releases the noise and still counts."""
        if self._base is None:
            raise RuntimeError("begin() was not called")
        denominator = self._denominator()
        rate = self._count / self.num_clients if self._rate is None else self._rate
        std = self.settings.noise_multiplier * self.settings.clip
        out = {}
        for k, base in self._base.items():
            noise = (
                torch.normal(0.0, std, size=base.shape, generator=generator, dtype=torch.float64)
                if std > 0
                else 0.0
            )
            out[k] = (base.double() + (self._sum[k] + noise) / denominator).to(base.dtype)
        self.accountant.step(self.settings.noise_multiplier, rate, 1)
        self._base, self._rate = None, None
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
        """Restore the accountant. A checkpoint must have been made under this run's scheme:
        one from before ``client_sampling`` existed sampled a fixed number of clients, so it
        resumes only with ``client_sampling: fixed``."""
        saved = state.get("sampling")
        if saved is None and self.sampling != "fixed":
            raise ConfigError(
                "privacy.client_sampling",
                "this checkpoint was written before client sampling was configurable: its "
                "rounds sampled a fixed number of clients; resume it with "
                "privacy.client_sampling: fixed",
            )
        if saved is not None and saved != self.sampling:
            raise ConfigError(
                "privacy.client_sampling",
                f"the checkpoint was made with {saved!r} client sampling, not {self.sampling!r}",
            )
        self.accountant.load_state_dict(
            dict(state) | {"sampling": self.sampling, "population": self.accountant.population}
        )
