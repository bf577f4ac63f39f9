"""Per-client accounting for ISRL-DP (inter-silo record-level DP, Lowy & Razaviyayn 2023).

Each client protects its own records against the server with DP-SGD, so each client has its
own accountant, composing only the rounds it took part in: the server chooses the clients, so
client sampling gives no amplification. A client's round is ``epochs x ceil(n_i / B)`` steps at
record sampling rate ``B / n_i``. The reported epsilon is the maximum over clients: the guarantee
every client has. An algorithm that releases more than its model (FedHKD's class statistics
under ``privacy.protect: knowledge+model``) composes those releases into the same client's
accountant (:meth:`PerClientAccounting.release`), under the same add/remove relation.

The record count ``n_i`` is public: it sets the client's sampling rate, its step count and its
weight in the server's average (every n-weighted aggregation), all in the clear. The add/remove
epsilon holds with ``n_i`` fixed, as Opacus and the papers account DP-SGD; a relation under which
the count is private admits no add/remove figure for this mechanism, only the replace-one one
(about twice the epsilon). README.md says so where it states the accounting.
"""

from __future__ import annotations

import math
from typing import Any

from flcore.privacy.accounting import Accountant
from flcore.privacy.settings import PrivacySettings

__all__ = ["PerClientAccounting"]


class PerClientAccounting:
    """Server-side record of every client's DP-SGD steps."""

    def __init__(self, settings: PrivacySettings, *, epochs: int, batch_size: int) -> None:
        self.settings = settings
        self.epochs, self.batch_size = epochs, batch_size
        self.accountants: dict[int, Accountant] = {}

    def record(self, client_id: int, num_samples: int) -> None:
        """Compose one round of local DP-SGD of ``client_id`` over ``num_samples`` records."""
        acc = self.accountants.setdefault(client_id, Accountant(self.settings.accountant))
        q = min(1.0, self.batch_size / num_samples)
        acc.step(
            self.settings.noise_multiplier,
            q,
            self.epochs * math.ceil(num_samples / self.batch_size),
        )

    def release(self, client_id: int, noise_multiplier: float) -> None:
        """Compose one more Gaussian release of ``client_id`` (all its records, ``q = 1``) at
        ``noise_multiplier`` relative to its add/remove sensitivity."""
        acc = self.accountants.setdefault(client_id, Accountant(self.settings.accountant))
        acc.step(noise_multiplier, 1.0, 1)

    def epsilon(self) -> float:
        """The largest epsilon of any client (0 before any training). Clients with the same
        history share one computation."""
        cache: dict[tuple, float] = {}
        worst = 0.0
        for acc in self.accountants.values():
            key = tuple(acc.history)
            if key not in cache:
                cache[key] = acc.epsilon(self.settings.delta)
            worst = max(worst, cache[key])
        return worst

    def metrics(self) -> dict[str, float]:
        return {
            "epsilon": self.epsilon(),
            "delta": self.settings.delta,
            "noise_multiplier": self.settings.noise_multiplier,
        }

    def state_dict(self) -> dict[str, Any]:
        return {cid: a.state_dict() for cid, a in self.accountants.items()}

    def load_state_dict(self, state: dict[int, Any]) -> None:
        self.accountants = {}
        for cid, s in state.items():
            acc = Accountant(self.settings.accountant)
            acc.load_state_dict(s)
            self.accountants[int(cid)] = acc
