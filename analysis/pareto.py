"""Pareto fronts, non-domination ranks and hypervolume over sweep results.

Everything here is a pure function of arrays or DataFrames. Conventions:

* An objective is a column and a direction (``max`` or ``min``); internally every objective is
  turned into minimisation by negating the ``max`` columns.
* ``+inf`` is a legal value: a non-DP run has ``epsilon = +inf``, the worst value of
  ``epsilon:min``. Comparisons use plain IEEE order, so ``inf <= inf`` and two runs at
  ``epsilon = inf`` are compared on their other objectives.
* ``NaN`` means "not measured": a row with ``NaN`` in any objective is left out of every front
  (mask ``False``, rank ``-1``) and counted as invalid by :func:`pareto_front`.
* Point ``j`` dominates ``i`` when ``j`` is at least as good in every objective and strictly
  better in one, so identical points never dominate each other and are all kept.
* :func:`pareto_front` is the one function every front of a table of runs goes through (the
  CLI, the report, a sweep's summary), so it applies the rules of what may stand on a front:
  a run without a formal DP guarantee stands at ``epsilon = inf``
  (:mod:`analysis.guarantees`), and failed, pruned, early-stopped and unmeasured runs are left
  out and counted (:mod:`analysis.validity`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.guarantees import (
    DP_TAG_COLUMNS,
    apply_guarantees,
    is_epsilon,
    join_tags,
    relation_note,
)
from analysis.validity import count_reasons, exclusion_reasons

__all__ = [
    "Objective",
    "ParetoResult",
    "hypervolume",
    "non_dominated_mask",
    "parse_objectives",
    "pareto_front",
    "pareto_ranks",
]

Direction = Literal["max", "min"]
_DIRECTIONS = ("max", "min")
# Rows of the pairwise comparison done at once: bounds the n x n x k temporary to ~32 MiB.
_BLOCK_CELLS = 1 << 22


@dataclass(frozen=True)
class Objective:
    """A column to optimise and its direction (``"max"`` or ``"min"``)."""

    name: str
    direction: Direction

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"objective name must be a non-empty string, got {self.name!r}")
        if self.direction not in _DIRECTIONS:
            raise ValueError(
                f"objective {self.name!r}: direction must be 'max' or 'min', got {self.direction!r}"
            )

    def __str__(self) -> str:
        return f"{self.name}:{self.direction}"


def _objective(name: Any, direction: Any) -> Objective:
    """One objective from a name and a direction, with the offending part in the error."""
    if not isinstance(direction, str):
        raise ValueError(f"objective {name!r}: direction must be 'max' or 'min', got {direction!r}")
    return Objective(str(name).strip(), direction.strip().lower())  # type: ignore[arg-type]


def _parse_part(part: str) -> Objective:
    """``"accuracy:max"`` -> ``Objective("accuracy", "max")``."""
    name, sep, direction = part.strip().rpartition(":")
    if not sep:
        raise ValueError(
            f"objective {part.strip()!r} has no direction; write '{part.strip()}:max' "
            f"or '{part.strip()}:min'"
        )
    if not name.strip():
        raise ValueError(f"objective {part.strip()!r} has no name before ':'")
    return _objective(name, direction)


def parse_objectives(spec: str | Mapping[str, str] | Sequence[Any]) -> list[Objective]:
    """Objectives from ``"accuracy:max,epsilon:min"``, ``{"accuracy": "max"}`` or a list.

    A list may mix :class:`Objective` instances, ``"name:dir"`` strings, one-entry mappings and
    ``(name, direction)`` pairs. Directions are ``max`` or ``min`` (case and spaces ignored).

    Raises:
        ValueError: a part without a name or a direction, a direction other than max/min, a name
            given twice, or no objective at all. The message names the offending part.
    """
    objectives: list[Objective] = []
    if isinstance(spec, str):
        parts = spec.split(",")
        for part in parts:
            if not part.strip():
                raise ValueError(f"empty objective in {spec!r}")
            objectives.append(_parse_part(part))
    elif isinstance(spec, Mapping):
        objectives = [_objective(name, direction) for name, direction in spec.items()]
    elif isinstance(spec, Sequence):
        for item in spec:
            if isinstance(item, Objective):
                objectives.append(item)
            elif isinstance(item, str | Mapping):
                objectives.extend(parse_objectives(item))
            elif isinstance(item, Sequence) and len(item) == 2:
                objectives.append(_objective(item[0], item[1]))
            else:
                raise ValueError(
                    f"cannot read an objective from {item!r}; use 'name:max', "
                    "{'name': 'max'} or ('name', 'max')"
                )
    else:
        raise ValueError(f"cannot read objectives from a {type(spec).__name__}: {spec!r}")
    if not objectives:
        raise ValueError("no objectives given")
    names = [o.name for o in objectives]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"objective(s) given twice: {', '.join(duplicates)}")
    return objectives


def _as_minimisation(values: Any, directions: Sequence[str]) -> np.ndarray:
    """A float copy of ``values`` (n x k) with the ``max`` columns negated."""
    arr = np.array(values, dtype=float)
    if arr.ndim != 2:
        raise ValueError(f"values must be a 2-D array (n points x k objectives), got {arr.shape}")
    if len(directions) != arr.shape[1]:
        raise ValueError(
            f"{len(directions)} direction(s) given for {arr.shape[1]} objective column(s)"
        )
    for i, direction in enumerate(directions):
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction {i} must be 'max' or 'min', got {direction!r}")
        if direction == "max":
            arr[:, i] = -arr[:, i]
    return arr


def _dominated(points: np.ndarray) -> np.ndarray:
    """Which rows (minimisation, no NaN) some other row dominates; O(n^2 k), blocked."""
    n, k = points.shape
    out = np.zeros(n, dtype=bool)
    block = max(1, _BLOCK_CELLS // max(1, n * k))
    for start in range(0, n, block):
        rows = points[start : start + block, None, :]  # (b, 1, k): the candidates i
        no_worse = np.all(points[None, :, :] <= rows, axis=2)  # (b, n): j at least as good as i
        better = np.any(points[None, :, :] < rows, axis=2)  # (b, n): j strictly better somewhere
        out[start : start + block] = np.any(no_worse & better, axis=1)
    return out


def non_dominated_mask(values: Any, directions: Sequence[str]) -> np.ndarray:
    """Boolean mask of the points no other point dominates.

    Args:
        values: n x k array, one row per point, one column per objective.
        directions: ``"max"`` or ``"min"`` for each column.

    Returns:
        ``mask[i]`` is True iff row ``i`` has no NaN and no valid row dominates it. Rows with a
        NaN are ``False`` and take no part in the comparison; ``±inf`` compare as usual.
    """
    points = _as_minimisation(values, directions)
    valid = ~np.isnan(points).any(axis=1)
    mask = np.zeros(len(points), dtype=bool)
    idx = np.flatnonzero(valid)
    mask[idx] = ~_dominated(points[idx])
    return mask


def pareto_ranks(values: Any, directions: Sequence[str]) -> np.ndarray:
    """Non-domination rank of each row: 0 on the front, 1 on the front once it is removed, ...

    Rows with a NaN get ``-1``. Cost O(f n^2 k) for f fronts.
    """
    points = _as_minimisation(values, directions)
    ranks = np.full(len(points), -1, dtype=int)
    remaining = np.flatnonzero(~np.isnan(points).any(axis=1))
    rank = 0
    while remaining.size:
        front = ~_dominated(points[remaining])
        ranks[remaining[front]] = rank
        remaining = remaining[~front]
        rank += 1
    return ranks


def _front_min(points: np.ndarray) -> np.ndarray:
    """The distinct non-dominated rows of a minimisation array."""
    points = np.unique(points, axis=0)
    return points[~_dominated(points)]


def _hv_min(points: np.ndarray, ref: np.ndarray) -> float:
    """Hypervolume of finite points all strictly below ``ref`` (minimisation).

    Dominated and repeated points are allowed; in 3-D and up the slices are thinned to their
    front before recursing, which keeps the recursion small.
    """
    k = points.shape[1]
    if k == 1:
        return float(ref[0] - points[:, 0].min())
    if k == 2:
        # Sorted by x (then y), a point adds a rectangle iff it lowers the running minimum of y.
        order = np.lexsort((points[:, 1], points[:, 0]))
        x, y = points[order, 0], np.minimum.accumulate(points[order, 1])
        steps = np.r_[True, y[1:] < y[:-1]]
        x, y = x[steps], y[steps]
        return float(np.sum(np.diff(np.append(x, ref[0])) * (ref[1] - y)))
    # HSO: slice along the last objective; between two consecutive levels the dominated region
    # is the (k-1)-D hypervolume of the points at or below the lower level.
    points = points[np.argsort(points[:, -1], kind="stable")]
    levels = np.append(points[:, -1], ref[-1])
    total = 0.0
    for i in range(len(points)):
        depth = levels[i + 1] - levels[i]
        if depth > 0:
            slab = points[: i + 1, :-1]
            total += depth * _hv_min(_front_min(slab) if k > 3 else slab, ref[:-1])
    return total


def hypervolume(values: Any, directions: Sequence[str], reference: Sequence[float]) -> float:
    """Volume of the objective space the points dominate, bounded by ``reference``.

    All objectives are turned into minimisation; a point adds volume only where it is strictly
    better than the reference in every objective, and points with a NaN or an infinite value
    add nothing. Exact: a sweep over sorted points in 2-D (O(n log n)) and, for k >= 3, the
    HSO slicing recursion (While et al., "A Faster Algorithm for Calculating Hypervolume",
    2006) down to that sweep, O(n^(k-1) log n) plus the O(n^2 k) front filter of each slice:
    fine for n up to a few hundred with k <= 4 (n = 200, k = 4: seconds).

    Args:
        values: n x k array of objective values.
        directions: ``"max"`` or ``"min"`` for each column.
        reference: one finite value per objective, worse than the points of interest.

    Raises:
        ValueError: bad shapes, directions, or a non-finite reference.
    """
    points = _as_minimisation(values, directions)
    ref = np.array(reference, dtype=float)
    if ref.shape != (points.shape[1],):
        raise ValueError(
            f"reference must have one value per objective ({points.shape[1]}), got {ref.shape}"
        )
    if not np.all(np.isfinite(ref)):
        raise ValueError(f"reference must be finite, got {list(reference)}")
    ref = np.where(np.asarray(directions) == "max", -ref, ref)
    keep = np.all(np.isfinite(points), axis=1) & np.all(points < ref, axis=1)
    if not keep.any():
        return 0.0
    points = points[keep]
    return _hv_min(_front_min(points) if points.shape[1] > 2 else points, ref)


@dataclass
class ParetoResult:
    """What :func:`pareto_front` found.

    Attributes:
        front: the rows on the front, best first in the first objective (ties by the next).
        table: every valid row, with ``rank`` (0 = front) and ``on_front``; also
            ``on_group_front`` when ``by`` was given. With ``group_cols`` one row per
            configuration: objective means (an epsilon: the largest), ``<objective>_std`` and
            ``n_seeds`` (and ``run_ids``, ``run_id`` when the runs have ids).
        n_runs: rows in the input.
        n_failed: left-out rows that did not finish: an MLflow status or a trial status
            other than the ok status, or stopped early.
        n_invalid: every row (before seed aggregation) left out of the fronts: the
            ``n_failed`` ones and those lacking an objective value.
        objectives: the objectives used.
        by: the grouping column of the per-group fronts, if any.
        per_group: the front of each value of ``by`` (keys are ``str`` of the value).
        invalid_reasons: ``{reason: rows}`` of the ``n_invalid`` rows (see
            :mod:`analysis.validity`).
        notes: warnings about what the fronts compare (e.g. epsilons under different
            neighbouring relations), for every output to show.
    """

    front: pd.DataFrame
    table: pd.DataFrame
    n_runs: int
    n_failed: int
    n_invalid: int
    objectives: list[Objective]
    by: str | None = None
    per_group: dict[str, pd.DataFrame] = field(default_factory=dict)
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what} column(s) not in the table: {', '.join(missing)}; "
            f"columns are: {', '.join(map(str, df.columns))}"
        )


def _best_first(frame: pd.DataFrame, objectives: Sequence[Objective]) -> pd.DataFrame:
    return frame.sort_values(
        [o.name for o in objectives],
        ascending=[o.direction == "min" for o in objectives],
        kind="mergesort",
    )


def _aggregate_seeds(df: pd.DataFrame, names: list[str], keys: list[str]) -> pd.DataFrame:
    """One row per configuration: mean and sample std of each objective, and ``n_seeds``; an
    epsilon objective is the largest over the seeds (the configuration's guarantee is its worst
    seed's: a LoDMeta walk's busiest client differs by seed), with its std beside it.

    With a ``run_id`` column the row keeps its runs: ``run_ids`` (comma-separated, in input
    order) and ``run_id`` (the first of them, a handle for links and JSON). The DP tag columns
    (``dp_guarantee``, ``dp_relation``, ``client_sampling``) are kept: what the epsilon
    means.
    """
    groups = df.groupby(keys, dropna=False, sort=True)
    means = groups[names].mean()
    for name in names:
        if is_epsilon(name):
            means[name] = groups[name].max()
    parts = [
        means,
        groups[names].std(ddof=1).add_suffix("_std"),
        groups.size().rename("n_seeds"),
    ]
    if "run_id" in df.columns and "run_id" not in keys:
        ids = groups["run_id"]
        parts += [ids.agg(lambda s: ",".join(map(str, s))).rename("run_ids"), ids.first()]
    for col in DP_TAG_COLUMNS:
        if col in df.columns and col not in keys:
            parts.append(groups[col].agg(lambda s: join_tags(list(s))).rename(col))
    return pd.concat(parts, axis=1).reset_index()


def pareto_front(
    df: pd.DataFrame,
    objectives: Sequence[Objective],
    *,
    by: str | None = None,
    status_col: str = "status",
    ok_status: str = "FINISHED",
    group_cols: Sequence[str] | None = None,
) -> ParetoResult:
    """The Pareto front of a table of runs (one row per run).

    Steps: place the runs without a formal DP guarantee at ``epsilon = inf``
    (:func:`analysis.guarantees.apply_guarantees`); leave out, and count, the runs that may not
    stand on a front (:mod:`analysis.validity`: a ``status_col`` other than ``ok_status``, a
    trial FAILED or PRUNED, a trial stopped early: ``n_failed``; and a NaN objective: all of
    them ``n_invalid``, by reason in ``invalid_reasons``); with ``group_cols``,
    average the remaining seeds of each configuration (``by`` is added to the keys so it
    survives; missing values in the keys, e.g. a non-DP run's noise multiplier, form their own
    configuration); rank the rows.

    Args:
        df: the runs.
        objectives: e.g. ``parse_objectives("accuracy:max,epsilon:min")``.
        by: a column (e.g. ``"algorithm"``) whose values each get their own front.
        status_col: the run status column; ignored when absent.
        ok_status: the status of a usable run.
        group_cols: the configuration columns of a multi-seed sweep.

    Raises:
        ValueError: no objectives, or a named column is not in ``df``.
    """
    objectives = list(objectives)
    if not objectives:
        raise ValueError("no objectives given")
    names = [o.name for o in objectives]
    directions = [o.direction for o in objectives]
    _require_columns(df, names, "objective")
    if by is not None:
        _require_columns(df, [by], "group-by")
    if isinstance(group_cols, str):
        group_cols = [group_cols]
    if group_cols is not None:
        if not group_cols and by is None:
            raise ValueError("group_cols is empty: name the configuration columns")
        _require_columns(df, list(group_cols), "configuration")

    n_runs = len(df)
    df = apply_guarantees(df)
    for name in names:
        try:
            pd.to_numeric(df[name], errors="raise")
        except (TypeError, ValueError) as err:
            raise ValueError(f"objective column {name!r} is not numeric: {err}") from None
    reasons = exclusion_reasons(df, names, status_col=status_col, ok_status=ok_status)
    left_out = reasons.notna().to_numpy()
    unmeasured = reasons.str.startswith("not measured").fillna(False).to_numpy(dtype=bool)
    n_invalid = int(left_out.sum())
    n_failed = int((left_out & ~unmeasured).sum())
    df = df.loc[~left_out].copy()
    for name in names:
        df[name] = pd.to_numeric(df[name]).astype(float)

    if group_cols is not None:
        keys = list(group_cols) + ([by] if by is not None and by not in group_cols else [])
        df = _aggregate_seeds(df, names, keys)

    table = df.copy()
    table["rank"] = pareto_ranks(table[names].to_numpy(), directions)
    table["on_front"] = table["rank"] == 0
    per_group: dict[str, pd.DataFrame] = {}
    if by is not None:
        # Positions, not labels: the caller's index may repeat.
        values = table[names].to_numpy()
        on_group_front = np.zeros(len(table), dtype=bool)
        groups = table.groupby(by, dropna=False, sort=True).indices
        for positions in groups.values():
            on_group_front[positions] = non_dominated_mask(values[positions], directions)
        table["on_group_front"] = on_group_front
        for key, positions in groups.items():
            rows = table.iloc[positions[on_group_front[positions]]]
            per_group[str(key)] = _best_first(rows, objectives)
    front = _best_first(table.loc[table["on_front"].to_numpy()], objectives)
    note = relation_note(table, names)
    return ParetoResult(
        front=front,
        table=table,
        n_runs=n_runs,
        n_failed=n_failed,
        n_invalid=n_invalid,
        objectives=objectives,
        by=by,
        per_group=per_group,
        invalid_reasons=count_reasons(reasons),
        notes=[note] if note else [],
    )
