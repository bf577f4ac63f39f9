"""Which runs may stand on a front, and why the others may not. Pure functions of DataFrames.

A run is left out of every front, and counted as invalid, when

* its MLflow status is not FINISHED (a failed, killed or still running run);
* its tag ``status`` (column ``trial_status``: a sweep trial's outcome) is set and is not
  FINISHED (FAILED, PRUNED);
* it was stopped early (tag ``stopped_early``, column ``stopped_early``): a trial ASHA stopped
  trained fewer rounds, so its epsilon is lower only because it trained less;
* it lacks a value (NaN) for one of the objectives: nothing is invented for it.

Sweeps made before trials were tagged ``stopped_early`` closed an ASHA-stopped trial as
FINISHED. Such a run is recognised by what it logged: a sweep trial (it has a ``trial_id``)
whose last ``round`` is below its configured ``params.rounds``. A trial that ran all its rounds
reports ``round == rounds``; one that diverged or failed has a failed status anyway.

Each left-out run counts once, under the first reason that applies, in the order above with
the sweep's own verdict first: ``stopped early``, then the trial's status (``FAILED``,
``PRUNED``), then the MLflow status (``KILLED`` ...), then ``not measured: <objectives>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = [
    "ROUNDS_COMPLETED_COL",
    "STOPPED_EARLY_COL",
    "TRIAL_STATUS_COL",
    "count_reasons",
    "exclusion_reasons",
    "stopped_early",
]

#: the sweep trial's outcome (tag ``status``), beside MLflow's own ``status`` column
TRIAL_STATUS_COL = "trial_status"
STOPPED_EARLY_COL = "stopped_early"
ROUNDS_COMPLETED_COL = "rounds_completed"
_TRUE = frozenset({"true", "1", "yes"})


def _flag(values: pd.Series) -> np.ndarray:
    """A tag column read as booleans: ``true``/``True``/``1`` are true, anything else false."""
    return np.array([str(v).strip().lower() in _TRUE for v in values], dtype=bool)


def _unset(reasons: np.ndarray) -> np.ndarray:
    return np.array([r is None for r in reasons], dtype=bool)


def stopped_early(df: pd.DataFrame) -> np.ndarray:
    """Which rows are trials stopped before their last round.

    True where the ``stopped_early`` tag says so, or, for a row without that tag that is a
    sweep trial (a ``trial_id``), where its ``round`` metric is below ``params.rounds``.
    """
    out = np.zeros(len(df), dtype=bool)
    tagged = np.zeros(len(df), dtype=bool)
    if STOPPED_EARLY_COL in df.columns:
        out |= _flag(df[STOPPED_EARLY_COL])
        tagged = df[STOPPED_EARLY_COL].notna().to_numpy()
    if {"trial_id", "round", "params.rounds"} <= set(df.columns):
        done = pd.to_numeric(df["round"], errors="coerce").to_numpy(dtype=float)
        planned = pd.to_numeric(df["params.rounds"], errors="coerce").to_numpy(dtype=float)
        trial = df["trial_id"].notna().to_numpy()
        with np.errstate(invalid="ignore"):
            short = done < planned  # NaN on either side compares False
        out |= trial & ~tagged & short
    return out


def exclusion_reasons(
    df: pd.DataFrame,
    objectives: Sequence[str],
    *,
    status_col: str = "status",
    ok_status: str = "FINISHED",
) -> pd.Series:
    """Why each row is left out of the fronts (a string), or None for a usable row.

    Args:
        df: one row per run.
        objectives: the objective columns; a NaN in one leaves the row out.
        status_col: MLflow's run status column (when present).
        ok_status: the status of a usable run.

    Returns:
        A Series aligned with ``df``: ``"stopped early"``, a trial status (``"FAILED"``,
        ``"PRUNED"``), an MLflow status (``"KILLED"``), ``"not measured: <names>"``, or None.
    """
    n = len(df)
    reasons = np.full(n, None, dtype=object)
    early = stopped_early(df)
    reasons[early] = "stopped early"
    for col in (TRIAL_STATUS_COL, status_col):
        if col not in df.columns:
            continue
        status = df[col].to_numpy(dtype=object)
        # MLflow always has a status: a run without one is not a usable run; the trial's tag
        # exists only for sweep trials.
        bad = np.array(
            [
                str(s) != ok_status if s is not None and s == s else col == status_col
                for s in status
            ],
            dtype=bool,
        )
        take = bad & _unset(reasons)
        reasons[take] = [str(s) if s is not None and s == s else "no status" for s in status[take]]
    values = (
        df[list(objectives)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        if n
        else np.zeros((0, len(objectives)))
    )
    lacking = np.isnan(values)
    for i in np.flatnonzero(lacking.any(axis=1) & _unset(reasons)):
        names = [o for o, miss in zip(objectives, lacking[i], strict=True) if miss]
        reasons[i] = "not measured: " + ", ".join(names)
    return pd.Series(reasons, index=df.index, dtype=object)


def count_reasons(reasons: pd.Series) -> dict[str, int]:
    """``{reason: rows}`` of the left-out rows, most frequent first (ties by name)."""
    counts = reasons.dropna().value_counts()
    return {str(k): int(v) for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))}
