"""Sweep analysis as pure functions of DataFrames: Pareto fronts, hypervolume, plots, reports.

``analysis.load`` (and ``analysis.artifacts``, ``analysis.collect``) read MLflow or Parquet at the
edge; everything else takes and returns frames, arrays, figures or strings.
"""

from __future__ import annotations

from analysis.fronts import FrontAnalysis, ObjectiveError, analyse_front
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

__all__ = [
    "FrontAnalysis",
    "LoadError",
    "Objective",
    "ObjectiveError",
    "ParetoResult",
    "analyse_front",
    "axis_label",
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
]
