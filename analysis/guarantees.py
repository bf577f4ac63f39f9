"""What a run's ``epsilon`` guarantees, applied to tables of runs: the one place the rule lives.

A run is tagged ``dp_guarantee`` (``isrl``, ``client-level``, ``client-ldp``, ``shared-only``,
``weak-delta``, ``none``, ``no-release``). Only the first three (``client-ldp``: LoDMeta's local DP
of each client's whole data against every observer), and ``no-release`` (nothing leaves the
client), make its ``epsilon`` a formal guarantee:

* ``shared-only`` (PPSGD, CENTAUR under the paper's protocol): the personal part trains without
  noise on the same records, so what the shared part's DP-SGD steps spent bounds nothing. Its
  epsilon is ``inf``; the shared part's spend is kept as ``epsilon_shared``.
* ``weak-delta``: a mechanism run at a delta of at least 1 / (the units a party protects), which
  permits releasing one record outright (LoDMeta's delta 0.02 .. 0.4): epsilon ``inf``; the
  accountant's figure stays in ``epsilon_accountant``.
* ``none``: no mechanism, epsilon ``inf``.
* client-level DP made before its sampling and accounting agreed (flcore fb93cf3): the server
  drew a fixed ``m`` clients but the accountant composed Poisson sampling at ``m / N`` under
  add/remove, a bound that does not hold for fixed-size sampling (flcore.privacy.client_level).
  Such a run is tagged ``dp_guarantee: client-level`` with no ``client_sampling`` tag (or, made
  before the tags, is ``dp_fedavg_client`` with neither): epsilon ``inf``, its logged figure
  kept as ``epsilon_accountant``. Runs since carry ``client_sampling`` and keep their epsilon.

Runs made since flcore reports this itself already carry ``epsilon = inf`` and
``epsilon_shared``; runs already in users' stores carry the finite shared epsilon as
``epsilon``. :func:`apply_guarantees` turns both into the new form, so every front, plot,
table and report places them at ``epsilon = inf`` (the "no DP" band of the plots). It is
idempotent and is applied where runs enter the analysis from MLflow
(:func:`analysis.runs.runs_frame`) and again in :func:`analysis.pareto.pareto_front`, which
every front goes through (frames read from old Parquet exports or built by hand included).
The old finite value is never thrown away: it becomes ``epsilon_shared`` where that is missing.

Epsilons under different neighbouring relations (tag ``dp_relation``: ``add-remove``,
``replace-one``) are not comparable: a replace-one epsilon is roughly that of add/remove at
twice the sensitivity. :func:`relation_note` says so for a table that mixes them, and each
front, plot and report shows that note. Pure functions of DataFrames.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "DP_TAG_COLUMNS",
    "NO_FORMAL_DP",
    "apply_guarantees",
    "apply_guarantees_to_histories",
    "is_epsilon",
    "join_tags",
    "relation_note",
    "relations",
]

#: guarantees whose runs stand at epsilon = inf, whatever epsilon they logged
NO_FORMAL_DP = frozenset({"shared-only", "weak-delta", "none"})
#: the run tags (columns of a runs table) that say what a run's epsilon means
DP_TAG_COLUMNS = ("dp_guarantee", "dp_relation", "client_sampling")


def is_epsilon(name: str) -> bool:
    """Whether a column holds an epsilon (``epsilon``, ``epsilon_shared``, ``metrics.epsilon``)."""
    last = str(name).lower().split(".")[-1]
    return last.startswith("epsilon") or last in {"eps", "ε"}


#: the algorithm whose client-level DP runs predate the ``dp_guarantee`` tag
LEGACY_CLIENT_LEVEL_ALGORITHM = "dp_fedavg_client"


def _column(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series(None, index=df.index, dtype=object)


def _unsound_client_level(df: pd.DataFrame) -> np.ndarray:
    """Client-level DP runs made before sampling and accounting agreed: tagged
    ``client-level`` (or untagged ``dp_fedavg_client``) without a ``client_sampling`` tag."""
    guarantee, algorithm = _column(df, "dp_guarantee"), _column(df, "algorithm")
    client_level = (guarantee == "client-level") | (
        guarantee.isna() & (algorithm == LEGACY_CLIENT_LEVEL_ALGORITHM)
    )
    return (client_level & _column(df, "client_sampling").isna()).to_numpy()


def _no_formal(df: pd.DataFrame) -> np.ndarray:
    """The rows whose epsilon is no guarantee: :data:`NO_FORMAL_DP`, and unsound client-level
    runs (:func:`_unsound_client_level`)."""
    tagged = _column(df, "dp_guarantee").isin(NO_FORMAL_DP).to_numpy()
    return tagged | _unsound_client_level(df)


def apply_guarantees(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every run tagged ``shared-only``, ``weak-delta`` or ``none``, and every
    unsound client-level run (module docstring), at ``epsilon = inf``.

    For a ``shared-only`` row that logged a finite ``epsilon`` (a run made before flcore
    reported ``inf`` itself) and has no ``epsilon_shared``, that value moves to
    ``epsilon_shared`` (and ``epsilon_std`` to ``epsilon_shared_std``); an unsound client-level
    row's moves to ``epsilon_accountant``. ``epsilon_std`` of the rows set to inf becomes NaN: a
    spread of a value that is not the guarantee means nothing. Other rows without the tag are
    left alone. Returns a copy when it changes anything, else ``df``.
    """
    rows = _no_formal(df)
    if not rows.any() or "epsilon" not in df.columns:
        return df
    out = df.copy()
    eps = pd.to_numeric(out["epsilon"], errors="coerce").astype(float)
    shared = (_column(out, "dp_guarantee") == "shared-only").to_numpy()
    unsound = _unsound_client_level(out)
    for src, dst, of in (
        # A finite logged epsilon of a shared-only run is what its shared part spent; an
        # unsound client-level run's is what its (wrong-scheme) accountant said.
        ("epsilon", "epsilon_shared", shared),
        ("epsilon_std", "epsilon_shared_std", shared),
        ("epsilon", "epsilon_accountant", unsound),
    ):
        if src not in out.columns:
            continue
        value = pd.to_numeric(out[src], errors="coerce").astype(float)
        have = (
            pd.to_numeric(out[dst], errors="coerce").astype(float)
            if dst in out.columns
            else pd.Series(np.nan, index=out.index)
        )
        take = of & have.isna().to_numpy() & np.isfinite(value.to_numpy())
        if take.any():
            out[dst] = have.where(~take, value)
    out["epsilon"] = eps.where(~rows, np.inf)
    if "epsilon_std" in out.columns:
        std = pd.to_numeric(out["epsilon_std"], errors="coerce").astype(float)
        out["epsilon_std"] = std.where(~rows, np.nan)
    return out


def apply_guarantees_to_histories(history: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Round-by-round rows (``run_id``, ``metric``, ``step``, ``value``) with the rule applied.

    The ``epsilon`` rows of a run :func:`apply_guarantees` puts at ``inf`` become ``inf`` (the
    curves then say they are not drawn). A ``shared-only`` run that logged finite ``epsilon``
    rows but no ``epsilon_shared`` history (made before flcore logged it) gets those values as
    ``epsilon_shared`` rows: what its shared part spent, under its true name. ``runs`` gives
    each run's ``dp_guarantee`` (and ``algorithm``, ``client_sampling``).
    """
    if not len(history) or not len(runs):
        return history
    guarantee = dict(zip(runs["run_id"], _column(runs, "dp_guarantee"), strict=False))
    at_inf = dict(zip(runs["run_id"], _no_formal(runs), strict=False))
    of_row = history["run_id"].map(guarantee)
    eps = (history["metric"] == "epsilon").to_numpy()
    finite = np.isfinite(history["value"].to_numpy(dtype=float))
    has_shared = set(history.loc[history["metric"] == "epsilon_shared", "run_id"])
    shared = (of_row == "shared-only").to_numpy() & ~history["run_id"].isin(has_shared).to_numpy()
    moved = history.loc[eps & finite & shared].assign(metric="epsilon_shared")
    out = history.copy()
    out.loc[eps & history["run_id"].map(at_inf).fillna(False).to_numpy(dtype=bool), "value"] = (
        np.inf
    )
    out = pd.concat([out, moved], ignore_index=True)
    return out.sort_values(["run_id", "metric", "step"], kind="mergesort", ignore_index=True)


def relations(df: pd.DataFrame) -> list[str]:
    """The neighbouring relations (``dp_relation`` values) of the rows, sorted; a value
    joined over seeds (``"add-remove,replace-one"``) counts as each of its parts."""
    if "dp_relation" not in df.columns:
        return []
    found: set[str] = set()
    for value in df["dp_relation"].dropna():
        found.update(p.strip() for p in str(value).split(",") if p.strip())
    return sorted(found)


def relation_note(df: pd.DataFrame, objectives: Iterable[str] | None = None) -> str | None:
    """A warning when the rows compare epsilons under different neighbouring relations.

    Args:
        df: the rows a front or plot compares (e.g. ``ParetoResult.table``).
        objectives: the columns compared; the note is given only when one is an epsilon.
            None: always check.

    Returns:
        The note, or None when the rows with a finite epsilon use at most one relation.
    """
    if objectives is not None and not any(is_epsilon(o) for o in objectives):
        return None
    if "epsilon" in df.columns:
        # a run at epsilon = inf (no DP, or shared-only) has no guarantee to compare, whatever
        # relation its shared part was accounted under
        eps = pd.to_numeric(df["epsilon"], errors="coerce")
        df = df[eps.abs() != float("inf")]
    found = relations(df)
    if len(found) < 2:
        return None
    counts = {r: 0 for r in found}
    for value in df["dp_relation"].dropna():
        for part in {p.strip() for p in str(value).split(",") if p.strip()}:
            counts[part] += 1
    listed = ", ".join(f"{r} ({counts[r]})" for r in found)
    return (
        f"epsilons under different neighbouring relations are compared here ({listed}): "
        "they are not comparable (replace-one neighbours differ by one changed record or "
        "client, add-remove neighbours by one added or removed); compare each relation's "
        "runs on their own"
    )


def join_tags(values: Sequence[object]) -> object:
    """One value for a column of run tags over several seeds: the value, or the distinct
    values joined by ',' (None when no seed has one)."""
    distinct = sorted({str(v) for v in values if v is not None and v == v})
    return ",".join(distinct) if distinct else None
