"""Brute-force references for the Pareto laws: dominance by definition, cells on a grid."""

from __future__ import annotations

import itertools
import math

__all__ = ["brute_hypervolume", "brute_mask", "brute_ranks"]


def _at_least_as_good(a: float, b: float, direction: str) -> bool:
    return a >= b if direction == "max" else a <= b


def _strictly_better(a: float, b: float, direction: str) -> bool:
    return a > b if direction == "max" else a < b


def brute_mask(rows: list[list[float]], directions: list[str]) -> list[bool]:
    valid = [not any(math.isnan(v) for v in row) for row in rows]
    mask = []
    for i, row in enumerate(rows):
        dominated = any(
            valid[j]
            and all(
                _at_least_as_good(o, v, d) for o, v, d in zip(other, row, directions, strict=True)
            )
            and any(
                _strictly_better(o, v, d) for o, v, d in zip(other, row, directions, strict=True)
            )
            for j, other in enumerate(rows)
        )
        mask.append(valid[i] and not dominated)
    return mask


def brute_ranks(rows: list[list[float]], directions: list[str]) -> list[int]:
    ranks = [-1] * len(rows)
    remaining = [i for i, row in enumerate(rows) if not any(math.isnan(v) for v in row)]
    rank = 0
    while remaining:
        mask = brute_mask([rows[i] for i in remaining], directions)
        for i, on_front in zip(remaining, mask, strict=True):
            if on_front:
                ranks[i] = rank
        remaining = [i for i, on_front in zip(remaining, mask, strict=True) if not on_front]
        rank += 1
    return ranks


def brute_hypervolume(rows: list[list[float]], directions: list[str], reference: list[int]) -> int:
    """Count the unit cells some finite point dominates, objective by objective, on a grid."""
    points = [row for row in rows if all(math.isfinite(v) for v in row)]
    ranges = []
    for d, (ref, direction) in enumerate(zip(reference, directions, strict=True)):
        values = [int(p[d]) for p in points] + [ref]
        # A cell is [c, c + 1]; it lies on the better side of the reference.
        ranges.append(range(min(values), ref) if direction == "min" else range(ref, max(values)))

    def covers(point: list[float], cell: tuple[int, ...]) -> bool:
        return all(
            point[d] <= c if direction == "min" else point[d] >= c + 1
            for d, (c, direction) in enumerate(zip(cell, directions, strict=True))
        )

    return sum(any(covers(p, cell) for p in points) for cell in itertools.product(*ranges))
