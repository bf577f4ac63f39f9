"""Privacy accounting: adapters over Opacus (RDP, PRV) and Google's dp-accounting (PLD).

No RDP math is written here. An :class:`Accountant` keeps the composition history of one
protected party as ``(noise_multiplier, sample_rate, steps)`` entries, each a Poisson-subsampled
Gaussian mechanism run ``steps`` times, and asks the library for epsilon at a delta. Its state
is a plain list, saved in every checkpoint, so a resumed run keeps counting.

The sampling scheme must match what the training does: DP-SGD here samples each record with
probability ``q = B / n`` at every step (Poisson, as these accountants assume); client-level DP
samples clients with ``q = clients per round / total`` (``q = 1``, no amplification, at full
participation or in a forced full last round).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from flcore.errors import ConfigError

__all__ = [
    "Accountant",
    "AccountantName",
    "compute_epsilon",
    "calibrate_noise",
    "calibrate_history",
    "check_delta",
    "check_epsilon",
]

AccountantName = Literal["rdp", "prv", "pld"]
ACCOUNTANTS = ("rdp", "prv", "pld")
Entry = tuple[float, float, int]
#: RDP orders: Opacus's defaults plus larger ones, which give tighter (still valid) bounds when
#: few, noisy steps are composed; the accountant takes the best order.
RDP_ORDERS = (
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + [64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024]
)


def check_epsilon(epsilon: float, key: str = "epsilon") -> None:
    if not epsilon > 0 or math.isinf(epsilon):
        raise ConfigError(key, f"must be a finite number > 0, got {epsilon}")


def check_delta(delta: float, key: str = "delta") -> None:
    if not 0 < delta < 1:
        raise ConfigError(key, f"must be in (0, 1), got {delta}")


def _check_entry(sigma: float, q: float, steps: int) -> None:
    if sigma < 0 or math.isnan(sigma):
        raise ConfigError("noise_multiplier", f"must be >= 0, got {sigma}")
    if not 0 < q <= 1:
        raise ConfigError("sample_rate", f"must be in (0, 1], got {q}")
    if steps < 1:
        raise ConfigError("steps", f"must be >= 1, got {steps}")


def _check_name(name: str) -> None:
    if name not in ACCOUNTANTS:
        raise ConfigError(
            "accountant", f"unknown accountant {name!r}; known: {', '.join(ACCOUNTANTS)}"
        )


def compute_epsilon(history: Sequence[Entry], delta: float, accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` of composing ``history`` (``inf`` for any entry with sigma 0)."""
    _check_name(accountant)
    check_delta(delta)
    entries = [(float(s), float(q), int(t)) for s, q, t in history if t > 0]
    for s, q, t in entries:
        _check_entry(s, q, t)
    if not entries:
        return 0.0
    if any(s == 0 for s, _, _ in entries):
        return math.inf  # no noise: nothing is bounded
    if accountant == "pld":
        from dp_accounting import dp_event
        from dp_accounting.pld import pld_privacy_accountant

        acc = pld_privacy_accountant.PLDAccountant()
        for s, q, t in entries:
            event = dp_event.GaussianDpEvent(s)
            if q < 1:
                event = dp_event.PoissonSampledDpEvent(q, event)
            acc.compose(event, t)
        return float(acc.get_epsilon(delta))
    from opacus.accountants import PRVAccountant, RDPAccountant

    if accountant == "rdp":
        acc = RDPAccountant()
        acc.history = list(entries)
        return float(acc.get_epsilon(delta, alphas=RDP_ORDERS))
    acc = PRVAccountant()
    acc.history = list(entries)
    return float(acc.get_epsilon(delta))


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    accountant: str = "rdp",
    max_noise_multiplier: float = 100.0,
    tolerance: float = 0.01,
) -> float:
    """The smallest noise multiplier (to ``tolerance`` in epsilon) whose epsilon after ``steps``
    steps at ``sample_rate`` is at most ``target_epsilon``; the result is checked with
    :func:`compute_epsilon`, so it never over-promises.

    Raises:
        ConfigError: bad inputs, or the target needs more than ``max_noise_multiplier``.
    """
    return calibrate_history(
        target_epsilon,
        delta,
        [(sample_rate, steps)],
        accountant=accountant,
        max_noise_multiplier=max_noise_multiplier,
        tolerance=tolerance,
    )


def calibrate_history(
    target_epsilon: float,
    delta: float,
    schedule: Sequence[tuple[float, int]],
    *,
    accountant: str = "rdp",
    max_noise_multiplier: float = 100.0,
    tolerance: float = 0.01,
) -> float:
    """Like :func:`calibrate_noise` for a schedule of ``(sample_rate, steps)`` phases that all
    use one noise multiplier (client-level DP with a full last round, say)."""
    check_epsilon(target_epsilon, "target_epsilon")
    check_delta(delta)
    for q, t in schedule:
        _check_entry(1.0, q, t)
    _check_name(accountant)
    if not max_noise_multiplier > 0:
        raise ConfigError("max_noise_multiplier", f"must be > 0, got {max_noise_multiplier}")

    def eps(sigma: float) -> float:
        return compute_epsilon([(sigma, q, t) for q, t in schedule], delta, accountant)

    if eps(max_noise_multiplier) > target_epsilon:
        raise ConfigError(
            "target_epsilon",
            f"epsilon {target_epsilon} at delta {delta} cannot "
            f"be reached over {sum(t for _, t in schedule)} steps at sample rate(s) "
            f"{', '.join(f'{q:g}' for q, _ in schedule)} with a noise multiplier "
            f"<= {max_noise_multiplier} (max_noise_multiplier)",
        )
    # Bisection keeping eps(hi) <= target; stop once eps(hi) is within tolerance of it.
    lo, hi, eps_hi = 0.0, max_noise_multiplier, eps(max_noise_multiplier)
    while hi - lo > 1e-4 and target_epsilon - eps_hi > tolerance:
        mid = (lo + hi) / 2
        eps_mid = eps(mid)
        if eps_mid <= target_epsilon:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    return hi


@dataclass
class Accountant:
    """The composition history of one protected party (a client under ISRL-DP, or the whole
    population under client-level DP)."""

    kind: str = "rdp"
    history: list[Entry] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_name(self.kind)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` more releases; consecutive equal entries are merged."""
        _check_entry(noise_multiplier, sample_rate, steps)
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            s, q, t = self.history[-1]
            self.history[-1] = (s, q, t + steps)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def steps(self) -> int:
        return sum(t for _, _, t in self.history)

    def epsilon(self, delta: float) -> float:
        return compute_epsilon(self.history, delta, self.kind)

    def state_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.kind = str(state["kind"])
        self.history = [tuple(e) for e in state["history"]]  # type: ignore[misc]
