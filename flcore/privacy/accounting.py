"""Privacy accounting: adapters over Opacus (RDP, PRV) and Google's dp-accounting (RDP, PLD).

No RDP math is written here. An :class:`Accountant` keeps the composition history of one
protected party as ``(noise_multiplier, sample_rate, steps)`` entries and asks a library for
epsilon at a delta. Its state is plain data, saved in every checkpoint, so a resumed run keeps
counting. What an entry means depends on the accountant's sampling scheme, and the scheme fixes
the neighbouring relation the epsilon is stated under:

- ``poisson`` (the default; DP-SGD's records, client-level DP with ``client_sampling:
  poisson``): each party joins a step independently with probability ``q``. An entry is the
  dp-accounting event ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` (``GaussianDpEvent``
  at ``q = 1``), run ``steps`` times, under the **add/remove** relation, with ``sigma`` relative
  to the add/remove sensitivity ``S`` (the clipping norm). ``rdp`` and ``prv`` go through
  Opacus's accountants (they compose exactly this event; the tests check Opacus's RDP against
  dp-accounting's fed the event, to 1e-6), ``pld`` through dp-accounting's PLD accountant.
- ``fixed`` (client-level DP with ``client_sampling: fixed``): exactly ``m`` of the
  ``population`` ``N`` parties take part, drawn without replacement; the entry's sample rate is
  ``m / N``. Such sampling is only analysed under the **replace-one** relation: the entry is
  ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(sigma / 2))`` (``GaussianDpEvent(sigma
  / 2)`` at ``m = N``), composed by dp-accounting's ``RdpAccountant(neighboring_relation=
  REPLACE_ONE)``, the only accountant of the two libraries that accepts it. The library reads
  the noise multiplier relative to the replace-one sensitivity ``2 S`` (replacing a party moves
  a clipped sum by up to ``2 S``), hence ``sigma / 2`` for noise of std ``sigma S``. ``pld`` and
  ``prv`` are refused with fixed-size sampling (a :class:`ConfigError` naming ``accountant``).

Epsilons under different relations are not comparable (an add/remove guarantee at epsilon
implies replace-one at about 2 epsilon, not the reverse): every DP run is tagged with its
relation (``dp_relation``), see :func:`relation_of`.

The sampling scheme must match what the training does: DP-SGD samples each record with
probability ``q = B / n`` at every step; client-level DP samples clients as its
``client_sampling`` says (flcore.privacy.client_level).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from flcore.errors import ConfigError

__all__ = [
    "ACCOUNTANTS",
    "RELATIONS",
    "SAMPLINGS",
    "Accountant",
    "AccountantName",
    "ClientSampling",
    "calibrate_history",
    "calibrate_noise",
    "check_delta",
    "check_epsilon",
    "compute_epsilon",
    "history_event",
    "relation_of",
]

AccountantName = Literal["rdp", "prv", "pld"]
ACCOUNTANTS = ("rdp", "prv", "pld")
ClientSampling = Literal["poisson", "fixed"]
SAMPLINGS = ("poisson", "fixed")
#: the neighbouring relation each sampling scheme's epsilon is stated under (the ``dp_relation``
#: tag of a run)
RELATIONS: dict[str, str] = {"poisson": "add-remove", "fixed": "replace-one"}
Entry = tuple[float, float, int]
#: RDP orders: Opacus's defaults plus larger ones, which give tighter (still valid) bounds when
#: few, noisy steps are composed; the accountant takes the best order.
RDP_ORDERS = (
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(12, 64))
    + [64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024]
)


def relation_of(sampling: str) -> str:
    """``add-remove`` for Poisson sampling, ``replace-one`` for fixed-size sampling."""
    _check_sampling(sampling)
    return RELATIONS[sampling]


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


def _check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise ConfigError(
            "client_sampling", f"unknown sampling {sampling!r}; known: {', '.join(SAMPLINGS)}"
        )


def _check_scheme(accountant: str, sampling: str, population: int | None) -> None:
    """The accountant can state the sampling scheme's epsilon (checked before any work)."""
    _check_name(accountant)
    _check_sampling(sampling)
    if sampling == "fixed":
        if accountant != "rdp":
            raise ConfigError(
                "accountant",
                f"{accountant!r} cannot account fixed-size (without replacement) sampling; only "
                "dp-accounting's RDP accountant can, under the replace-one relation: use rdp, "
                "or Poisson client sampling",
            )
        if population is None or population < 1:
            raise ConfigError(
                "population", f"fixed-size sampling needs the population size, got {population}"
            )


def _sample_size(q: float, population: int) -> int:
    """``m`` from a fixed-size entry's sample rate ``m / N`` (which must be a whole count)."""
    m = round(q * population)
    if not 1 <= m <= population or abs(m - q * population) > 1e-6:
        raise ConfigError(
            "sample_rate",
            f"{q} is not a sample of whole parties out of {population} (fixed-size sampling)",
        )
    return m


def history_event(
    history: Sequence[Entry], *, sampling: str = "poisson", population: int | None = None
) -> Any:
    """The dp-accounting event of composing ``history`` under ``sampling`` (see the module
    docstring): what every accountant here composes."""
    from dp_accounting import dp_event

    _check_sampling(sampling)
    events = []
    for s, q, t in history:
        _check_entry(s, q, t)
        if sampling == "fixed":
            assert population is not None
            m = _sample_size(q, population)
            event: Any = dp_event.GaussianDpEvent(s / 2)  # sigma relative to 2S, see above
            if m < population:
                event = dp_event.SampledWithoutReplacementDpEvent(population, m, event)
        else:
            event = dp_event.GaussianDpEvent(s)
            if q < 1:
                event = dp_event.PoissonSampledDpEvent(q, event)
        events.append(dp_event.SelfComposedDpEvent(event, int(t)))
    return dp_event.ComposedDpEvent(events)


def compute_epsilon(
    history: Sequence[Entry],
    delta: float,
    accountant: str = "rdp",
    *,
    sampling: str = "poisson",
    population: int | None = None,
) -> float:
    """Epsilon at ``delta`` of composing ``history`` (``inf`` for any entry with sigma 0).

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` entries.
        sampling: ``poisson`` (add/remove) or ``fixed`` (replace-one; sample rates are ``m /
            population``); see the module docstring.
        population: ``N``, the parties fixed-size sampling draws from.
    """
    _check_scheme(accountant, sampling, population)
    check_delta(delta)
    for _, _, t in history:
        if int(t) < 0:  # zero steps release nothing; a negative count is a mistake
            raise ConfigError("steps", f"must be >= 0, got {t}")
    entries = [(float(s), float(q), int(t)) for s, q, t in history if t > 0]
    for s, q, t in entries:
        _check_entry(s, q, t)
    if not entries:
        return 0.0
    if any(s == 0 for s, _, _ in entries):
        return math.inf  # no noise: nothing is bounded
    if sampling == "fixed":
        from dp_accounting.rdp import rdp_privacy_accountant

        assert population is not None
        # what dp-accounting's RdpAccountant (replace-one) computes composing the history's
        # event, term for term, with each entry's one-step RDP remembered
        # (_fixed_rdp_per_step): bitwise its epsilon
        rdp = np.zeros_like(RDP_ORDERS, dtype=np.float64)
        for s, q, t in entries:  # a q that is no whole sample is refused inside, never kept
            rdp += t * _fixed_rdp_per_step(s, q, population)
        return float(rdp_privacy_accountant.compute_epsilon(np.array(RDP_ORDERS), rdp, delta)[0])
    if accountant == "pld":
        from dp_accounting.pld import pld_privacy_accountant

        pld = pld_privacy_accountant.PLDAccountant()
        pld.compose(history_event(entries))
        return float(pld.get_epsilon(delta))
    if accountant == "rdp":
        from opacus.accountants.analysis.rdp import get_privacy_spent

        # what Opacus's RDPAccountant computes, term for term, with each entry's one-step RDP
        # remembered (see _rdp_per_step): bitwise its epsilon
        rdp = sum([_rdp_per_step(s, q) * t for s, q, t in entries])
        return float(get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = list(entries)
    return float(prv.get_epsilon(delta))


@functools.lru_cache(maxsize=4096)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus's RDP of one sampled Gaussian step at every order of ``RDP_ORDERS`` (read-only).

    Opacus's accountant scales this vector by each entry's steps; computing it costs 0.2-0.35 s
    at sample rates 0.1-0.5 (its fractional orders sum series in Python), and a run asks for
    epsilon every round with the same ``(sigma, q)``, so it is remembered per pair."""
    from opacus.accountants.analysis.rdp import compute_rdp

    rdp = np.asarray(
        compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS)
    )
    rdp.flags.writeable = False
    return rdp


@functools.lru_cache(maxsize=4096)
def _fixed_rdp_per_step(noise_multiplier: float, sample_rate: float, population: int) -> np.ndarray:
    """dp-accounting's RDP (replace-one) of one fixed-size-sampled Gaussian step, ``m =
    sample_rate x population`` of ``population``, at every order of ``RDP_ORDERS`` (read-only):
    the accountant's own vector for the entry's event composed once.

    The accountant scales this vector by each entry's steps; computing it costs 0.7-1 s (the
    sampling-without-replacement bound's sums over every order), and a run asks for epsilon
    every round with the same entry, so it is remembered per ``(sigma, q, N)``."""
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant(
        orders=RDP_ORDERS, neighboring_relation=NeighboringRelation.REPLACE_ONE
    )
    accountant.compose(
        history_event([(noise_multiplier, sample_rate, 1)], sampling="fixed", population=population)
    )
    rdp = accountant.rdp
    rdp.flags.writeable = False
    return rdp


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    *,
    accountant: str = "rdp",
    max_noise_multiplier: float = 1000.0,
    tolerance: float = 0.01,
    sampling: str = "poisson",
    population: int | None = None,
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
        sampling=sampling,
        population=population,
    )


def calibrate_history(
    target_epsilon: float,
    delta: float,
    schedule: Sequence[tuple[float, int]],
    *,
    accountant: str = "rdp",
    max_noise_multiplier: float = 1000.0,
    tolerance: float = 0.01,
    sampling: str = "poisson",
    population: int | None = None,
    fixed: Sequence[Entry] = (),
) -> float:
    """Like :func:`calibrate_noise` for a schedule of ``(sample_rate, steps)`` phases that all
    use one noise multiplier (client-level DP with a full last round, say), accounted under
    ``sampling`` exactly as :func:`compute_epsilon` accounts the run. ``fixed`` entries are
    composed too at their own noise (releases the calibrated multiplier does not set: FedHKD's
    class statistics beside its DP-SGD)."""
    check_epsilon(target_epsilon, "target_epsilon")
    check_delta(delta)
    _check_scheme(accountant, sampling, population)
    for q, t in schedule:
        _check_entry(1.0, q, t)
        if sampling == "fixed":
            assert population is not None
            _sample_size(q, population)
    if not max_noise_multiplier > 0:
        raise ConfigError("max_noise_multiplier", f"must be > 0, got {max_noise_multiplier}")

    def eps(sigma: float) -> float:
        return compute_epsilon(
            [(sigma, q, t) for q, t in schedule] + list(fixed),
            delta,
            accountant,
            sampling=sampling,
            population=population,
        )

    if eps(max_noise_multiplier) > target_epsilon:
        raise ConfigError(
            "target_epsilon",
            f"epsilon {target_epsilon} at delta {delta} cannot "
            f"be reached over {sum(t for _, t in schedule)} steps at sample rate(s) "
            f"{', '.join(f'{q:g}' for q, _ in schedule)} with a noise multiplier "
            f"<= {max_noise_multiplier} (max_noise_multiplier)"
            + (
                f", beside {sum(t for _, _, t in fixed)} fixed releases that alone spend "
                f"{compute_epsilon(fixed, delta, accountant):.3g}"
                if fixed
                else ""
            ),
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
    population under client-level DP).

    Args:
        kind: ``rdp``, ``prv`` or ``pld``.
        history: ``(noise_multiplier, sample_rate, steps)`` entries.
        sampling: ``poisson`` (add/remove) or ``fixed`` (replace-one, sample rate ``m / N``).
        population: ``N`` for fixed-size sampling.
    """

    kind: str = "rdp"
    history: list[Entry] = field(default_factory=list)
    sampling: str = "poisson"
    population: int | None = None

    def __post_init__(self) -> None:
        _check_scheme(self.kind, self.sampling, self.population)

    @property
    def relation(self) -> str:
        """The neighbouring relation :meth:`epsilon` is stated under."""
        return RELATIONS[self.sampling]

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` more releases; consecutive equal entries are merged."""
        _check_entry(noise_multiplier, sample_rate, steps)
        if self.sampling == "fixed":
            assert self.population is not None
            _sample_size(sample_rate, self.population)
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            s, q, t = self.history[-1]
            self.history[-1] = (s, q, t + steps)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def steps(self) -> int:
        return sum(t for _, _, t in self.history)

    def epsilon(self, delta: float) -> float:
        return compute_epsilon(
            self.history, delta, self.kind, sampling=self.sampling, population=self.population
        )

    def state_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "history": list(self.history),
            "sampling": self.sampling,
            "population": self.population,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`. A state saved before sampling schemes existed has no
        ``sampling``: it was Poisson (add/remove) accounting, the only kind there was."""
        kind = str(state["kind"])
        sampling = str(state.get("sampling", "poisson"))
        population = state.get("population")
        _check_scheme(kind, sampling, population)  # type: ignore[arg-type]
        self.kind, self.sampling, self.population = kind, sampling, population  # type: ignore[assignment]
        self.history = [tuple(e) for e in state["history"]]  # type: ignore[misc, attr-defined]
