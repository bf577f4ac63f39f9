"""Capacity heterogeneity: each client's capacity ratio r_i and the width p_i it trains.

Pa3dFL (Wang et al., "Towards Efficient and Privacy-Preserving Personalised Federated Learning
under Capacity Heterogeneity", Eq. 2 and Sec. 3.2) bounds a client's model size by r_i times the
full model's; a width-p model has about p^2 of the full model's parameters, so a client trains
width p_i, the largest multiple of ``p_min`` with p_i^2 <= r_i. Every width-scalable model
scales its hidden channel counts by p_i, and ``p_min`` times each full channel count must be a
whole number of channels so that every width the rule can give is exact
(:func:`check_model_widths`).

Capacity-aware algorithms (``Algorithm.capacity_aware``) give each client its own width; the
others train "the maximum model all users can compute" (Pa3dFL Sec. 6.1): the narrowest
client's width, for every client.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flcore.errors import ConfigError

__all__ = ["Capacity", "width_for", "make_capacity", "width_label", "check_model_widths"]

#: slack for sqrt and division round-off when a ratio sits exactly on a width's square
_EPS = 1e-9


def width_for(ratio: float, p_min: float) -> float:
    """The largest multiple of ``p_min`` whose square is at most ``ratio`` (Eq. 2's width).

    Raises:
        ValueError: ``ratio`` is below ``p_min**2`` (no width fits).
    """
    k = math.floor(math.sqrt(ratio) / p_min + _EPS)
    if k < 1:
        raise ValueError(f"capacity {ratio} is below p_min^2 = {p_min**2:.6g}: no width fits")
    return min(1.0, k * p_min)


def width_label(width: float) -> str:
    """A width as metric names spell it: ``0.0625``, ``0.5``, ``1``."""
    return f"{width:.6g}"


@dataclass(frozen=True)
class Capacity:
    """Capacity ratios r_i of all clients and the width rule's step ``p_min``."""

    ratios: tuple[float, ...]
    p_min: float = 1 / 16

    @property
    def widths(self) -> tuple[float, ...]:
        """p_i of every client."""
        return tuple(width_for(r, self.p_min) for r in self.ratios)

    def width(self, client_id: int) -> float:
        return width_for(self.ratios[client_id], self.p_min)

    @property
    def min_width(self) -> float:
        """The widest model every client can train (capacity-unaware methods use it)."""
        return min(self.widths)

    @property
    def levels(self) -> tuple[float, ...]:
        """The distinct widths, ascending."""
        return tuple(sorted(set(self.widths)))

    def clients_of(self, width: float) -> list[int]:
        return [i for i, w in enumerate(self.widths) if w == width]


def make_capacity(
    name: str,
    *,
    num_clients: int,
    seed: int,
    low: float = 0.01,
    high: float = 1.0,
    ratios: Sequence[float] | None = None,
    p_min: float = 1 / 16,
) -> Capacity:
    """The capacities of ``num_clients`` clients (``ideal``, ``uniform`` or ``fixed``).

    ``uniform`` draws r_i ~ U[low, high] from its own stream of ``seed``.

    Raises:
        ConfigError: ``fixed`` ratios are not one per client, or a name is unknown.
    """
    if name == "ideal":
        values = [1.0] * num_clients
    elif name == "uniform":
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA9]))
        values = [float(v) for v in rng.uniform(low, high, size=num_clients)]
    elif name == "fixed":
        if ratios is None or len(ratios) != num_clients:
            got = "none" if ratios is None else len(ratios)
            raise ConfigError(
                "capacity.ratios", f"needs one ratio per client ({num_clients}), got {got}"
            )
        values = [float(r) for r in ratios]
    else:
        raise ConfigError(
            "capacity.name", f"unknown capacity {name!r}; known: fixed, ideal, uniform"
        )
    for r in values:
        if not p_min**2 - _EPS <= r <= 1:
            raise ConfigError(
                "capacity", f"capacity {r} is not in [p_min^2, 1] = [{p_min**2:.6g}, 1]"
            )
    return Capacity(tuple(values), p_min)


def check_model_widths(full_channels: dict[str, int], p_min: float) -> None:
    """Check that ``p_min`` of each width-scaled layer is a whole, nonzero channel count.

    Args:
        full_channels: the full model's hidden channel count of each width-scaled layer.

    Raises:
        ConfigError: (``capacity.p_min``) a layer would have no channels, or a fraction of one.
    """
    for layer, channels in full_channels.items():
        c = channels * p_min
        if c < 1 - _EPS:
            raise ConfigError(
                "capacity.p_min",
                f"p_min {p_min:g} leaves layer {layer!r} ({channels} channels) with no channels "
                f"at the narrowest width ({c:g}); use p_min >= {1 / channels:g}",
            )
        if abs(c - round(c)) > _EPS:
            raise ConfigError(
                "capacity.p_min",
                f"p_min {p_min:g} gives layer {layer!r} ({channels} channels) {c:g} channels "
                "at the narrowest width: widths must be whole channel counts",
            )
