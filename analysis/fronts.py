"""The Pareto analysis of a table of runs, as the CLI and the report need it.

On top of :func:`analysis.pareto.pareto_front`: the objectives are checked against the runs
(an objective no run reports is an error that lists the metrics there are), several seeds of
one configuration are averaged (the front uses the per-configuration mean, and the largest
epsilon, the table keeps the standard deviation), and the hypervolume of each group's front
and of the overall front is measured against a reference point. Pure functions of DataFrames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from analysis.pareto import Objective, ParetoResult, hypervolume, pareto_front
from analysis.validity import exclusion_reasons

__all__ = [
    "FrontAnalysis",
    "NOT_CONFIG",
    "ObjectiveError",
    "analyse_front",
    "check_objectives",
    "config_columns",
    "metric_columns",
    "repeated_seeds",
]

#: params that do not change what a run computes (or that tell seeds apart): not part of a
#: configuration's identity
NOT_CONFIG = frozenset(
    {
        "params.seed",
        "params.output_dir",
        "params.data_root",
        "params.workers",
        "params.device",
        "params.experiment",
        "params.checkpoint_every",
    }
)
_NOT_METRICS = frozenset({"duration_s"})


class ObjectiveError(ValueError):
    """An objective that no run of the table reports."""


def metric_columns(df: pd.DataFrame) -> list[str]:
    """The metric columns of a runs table: numeric, not ``params.*``/``tags.*``, sorted."""
    return sorted(
        c
        for c in df.columns
        if isinstance(c, str)
        and not c.startswith(("params.", "tags."))
        and c not in _NOT_METRICS
        and pd.api.types.is_numeric_dtype(df[c])
        and not pd.api.types.is_bool_dtype(df[c])
    )


def check_objectives(df: pd.DataFrame, objectives: Sequence[Objective]) -> None:
    """Every objective must be a metric that at least one run reports.

    Raises:
        ObjectiveError: naming the objective(s) and listing the metrics the runs have.
    """
    missing = [
        o.name
        for o in objectives
        if o.name not in df.columns or pd.to_numeric(df[o.name], errors="coerce").isna().all()
    ]
    if missing:
        metrics = metric_columns(df)
        raise ObjectiveError(
            f"no run reports objective(s) {', '.join(map(repr, missing))}; "
            f"metrics of these runs: {', '.join(metrics) or '(none)'}"
        )


def config_columns(df: pd.DataFrame) -> list[str]:
    """The ``params.*`` columns that identify a configuration (all but seeds and paths)."""
    return [c for c in df.columns if str(c).startswith("params.") and c not in NOT_CONFIG]


def repeated_seeds(df: pd.DataFrame, keys: Sequence[str], ok_status: str = "FINISHED") -> bool:
    """Whether some configuration ran with more than one seed (among the runs that may stand
    on a front: finished, not pruned, not stopped early)."""
    if not keys or "params.seed" not in df.columns:
        return False
    ok = df.loc[exclusion_reasons(df, [], ok_status=ok_status).isna().to_numpy()]
    if not len(ok):
        return False
    seeds = ok.groupby(list(keys), dropna=False, sort=False)["params.seed"].nunique(dropna=False)
    return bool((seeds > 1).any())


@dataclass
class FrontAnalysis:
    """A Pareto front and what it was computed from.

    Attributes:
        result: the fronts, the ranked table and the counts (failed, invalid).
        seeds_averaged: whether the table holds per-configuration means over seeds.
        config_columns: the configuration columns (averaging keys).
        statuses: the number of runs in each status.
        hypervolume: ``"all"`` and each group's front, when a reference was given.
    """

    result: ParetoResult
    seeds_averaged: bool
    config_columns: list[str]
    statuses: dict[str, int]
    hypervolume: dict[str, float] = field(default_factory=dict)


def analyse_front(
    df: pd.DataFrame,
    objectives: Sequence[Objective],
    *,
    by: str | None = "algorithm",
    average_seeds: bool | None = None,
    reference: Sequence[float] | None = None,
) -> FrontAnalysis:
    """Fronts per ``by`` group and overall, seeds averaged, hypervolume measured.

    Args:
        df: one row per run (:func:`analysis.load.load_runs`); failed runs are counted.
        objectives: what to optimise.
        by: the grouping column, or None.
        average_seeds: average the seeds of a configuration; None: when some configuration ran
            with several seeds.
        reference: one value per objective for the hypervolume (worse than the points).

    Raises:
        ObjectiveError: an objective no run reports.
        ValueError: a missing ``by`` column, or a reference of the wrong length.
    """
    objectives = list(objectives)
    check_objectives(df, objectives)
    if by is not None and by not in df.columns:
        raise ValueError(f"group-by column {by!r} not in the runs table")
    if reference is not None and len(reference) != len(objectives):
        raise ValueError(
            f"the reference point needs one value per objective ({len(objectives)}), "
            f"got {len(reference)}"
        )
    keys = config_columns(df)
    if average_seeds is None:
        average_seeds = repeated_seeds(df, keys + ([by] if by and by not in keys else []))
    result = pareto_front(
        df, objectives, by=by, group_cols=keys if average_seeds and keys else None
    )
    statuses = (
        {str(k): int(v) for k, v in df["status"].value_counts(sort=False).items()}
        if "status" in df.columns
        else {}
    )
    volumes: dict[str, float] = {}
    if reference is not None:
        names = [o.name for o in objectives]
        directions = [o.direction for o in objectives]
        fronts = {"all": result.front, **result.per_group}
        for key, front in fronts.items():
            values = front[names].to_numpy(dtype=float).reshape(len(front), len(names))
            volumes[key] = hypervolume(values, directions, list(reference))
    return FrontAnalysis(
        result=result,
        seeds_averaged=bool(average_seeds and keys),
        config_columns=keys,
        statuses=statuses,
        hypervolume=volumes,
    )
