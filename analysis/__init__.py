"""Sweep analysis as pure functions of DataFrames: Pareto fronts, hypervolume, plots, reports.

``analysis.load`` (and ``analysis.artifacts``, ``analysis.collect``) read MLflow or Parquet at the
edge; everything else takes and returns frames, arrays, figures or strings. What may stand on a
front, and at which epsilon, is decided in one place, :func:`analysis.pareto.pareto_front`, with
the rules of :mod:`analysis.guarantees` and :mod:`analysis.validity`.
"""

from __future__ import annotations

from analysis.fronts import FrontAnalysis, ObjectiveError, analyse_front
from analysis.guarantees import NO_FORMAL_DP, apply_guarantees, relation_note
from analysis.load import LoadError, load_histories, load_parquet, load_runs
from analysis.pareto import (
    Objective,
    ParetoResult,
    hypervolume,
    non_dominated_mask,
    pareto_front,
    pareto_ranks,
    parse_objectives,
)
from analysis.plots import axis_label, plot_attack_grid, plot_pareto_2d
from analysis.validity import exclusion_reasons

__all__ = [
    "NO_FORMAL_DP",
    "FrontAnalysis",
    "LoadError",
    "Objective",
    "ObjectiveError",
    "ParetoResult",
    "analyse_front",
    "apply_guarantees",
    "axis_label",
    "exclusion_reasons",
    "hypervolume",
    "load_histories",
    "load_parquet",
    "load_runs",
    "non_dominated_mask",
    "pareto_front",
    "pareto_ranks",
    "parse_objectives",
    "plot_attack_grid",
    "plot_pareto_2d",
    "relation_note",
]
