"""Sweep analysis as pure functions of DataFrames: Pareto fronts, hypervolume, plots."""

from __future__ import annotations

from analysis.pareto import (
    Objective,
    ParetoResult,
    hypervolume,
    non_dominated_mask,
    pareto_front,
    pareto_ranks,
    parse_objectives,
)
from analysis.plots import axis_label, plot_pareto_2d

__all__ = [
    "Objective",
    "ParetoResult",
    "axis_label",
    "hypervolume",
    "non_dominated_mask",
    "pareto_front",
    "pareto_ranks",
    "parse_objectives",
    "plot_pareto_2d",
]
