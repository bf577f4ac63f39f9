"""The objectives a front defaults to: the sweep's own, when the runs come from sweeps.

A sweep's parent run records its objectives as the param ``sweep.objectives``
(``name:direction,...``, logged by :func:`sweeps.sweep._log_spec`). ``fedsweep pareto`` and
``fedsweep report`` without ``--objectives`` use them:

* the runs come from no sweep (single ``fedsweep run`` runs, or parents that record no
  objectives): ``accuracy:max,epsilon:min``, as before;
* from one sweep, or several sweeps with the same objectives: those (the order of the first
  sweep by name: its first two objectives are the plot's axes). Runs outside any sweep among
  them are ranked on the same objectives; one lacking a value is left out and counted;
* from sweeps whose objectives differ: an :class:`~analysis.fronts.ObjectiveError` naming each
  sweep's objectives and asking for ``--objectives``. Picking one sweep's, or the old default,
  would silently rank the other sweep's trials on objectives it did not optimise.

:func:`sweep_objectives` reads the parent runs from the store (an edge, like
:mod:`analysis.load`); :func:`choose_objectives` is the pure decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.fronts import ObjectiveError
from analysis.pareto import Objective, parse_objectives

__all__ = [
    "DEFAULT_OBJECTIVES",
    "SweepObjectives",
    "choose_objectives",
    "default_objectives",
    "objectives_text",
    "sweep_objectives",
]

#: what a front ranks runs on when they come from no sweep
DEFAULT_OBJECTIVES = "accuracy:max,epsilon:min"


@dataclass(frozen=True)
class SweepObjectives:
    """A sweep parent run and the objectives it records (``None``: it records none)."""

    name: str
    run_id: str
    objectives: str | None


def _parent_ids(runs: pd.DataFrame) -> list[str]:
    ids: list[str] = []
    if "parent_run_id" in runs.columns:
        ids += [str(v) for v in runs["parent_run_id"].dropna() if str(v)]
    if {"kind", "run_id"} <= set(runs.columns):
        ids += [str(v) for v in runs.loc[runs["kind"] == "sweep", "run_id"]]
    return list(dict.fromkeys(ids))


def sweep_objectives(runs: pd.DataFrame, client: Any) -> list[SweepObjectives]:
    """The sweep parents of ``runs`` (their ``parent_run_id``s, and rows of kind ``sweep``) as
    recorded in the store ``client`` reads; a parent the store lacks, or a nested run's parent
    that is not a sweep, is skipped."""
    from mlflow.exceptions import MlflowException

    found = []
    for run_id in _parent_ids(runs):
        try:
            run = client.get_run(run_id)
        except MlflowException:
            continue
        tags, params = run.data.tags, run.data.params
        if tags.get("fedsweep.kind") != "sweep" and "sweep.objectives" not in params:
            continue
        name = params.get("sweep.name") or tags.get("fedsweep.sweep") or run_id
        found.append(SweepObjectives(str(name), run_id, params.get("sweep.objectives")))
    return found


def _key(objectives: list[Objective]) -> frozenset[str]:
    return frozenset(str(o) for o in objectives)


def choose_objectives(sweeps: list[SweepObjectives]) -> tuple[list[Objective], str]:
    """The default objectives for runs from ``sweeps``, and where they came from (a phrase).

    Raises:
        ObjectiveError: the sweeps' objectives differ, or one cannot be read.
    """
    known: dict[str, tuple[SweepObjectives, list[Objective]]] = {}
    for s in sorted(sweeps, key=lambda s: (s.name, s.run_id)):
        if s.objectives is None:
            continue
        try:
            known[s.run_id] = (s, parse_objectives(s.objectives))
        except ValueError as err:
            raise ObjectiveError(
                f"sweep {s.name!r} (parent run {s.run_id}) records objectives "
                f"{s.objectives!r} that cannot be read ({err}); choose them with --objectives"
            ) from None
    if not known:
        return parse_objectives(DEFAULT_OBJECTIVES), "default: the runs come from no sweep"
    distinct: dict[frozenset[str], list[str]] = {}
    for s, objectives in known.values():
        distinct.setdefault(_key(objectives), []).append(f"{s.name} ({s.objectives})")
    if len(distinct) > 1:
        listed = "; ".join(", ".join(names) for names in distinct.values())
        raise ObjectiveError(
            f"the runs come from sweeps with different objectives: {listed}; choose the "
            "objectives to compare them on with --objectives"
        )
    first, objectives = next(iter(known.values()))
    names = sorted({s.name for s, _ in known.values()})
    source = f"sweep{'s' if len(names) > 1 else ''} {', '.join(names)}"
    return objectives, f"{source} (param sweep.objectives of parent run {first.run_id})"


def default_objectives(runs: pd.DataFrame, client: Any | None) -> tuple[list[Objective], str]:
    """:func:`choose_objectives` over the sweeps of ``runs``; without a store (``client``
    None) the runs' sweeps cannot be read and the default is used."""
    if client is None:
        if _parent_ids(runs):
            return (
                parse_objectives(DEFAULT_OBJECTIVES),
                "default: no MLflow store to read the runs' sweep objectives from",
            )
        return parse_objectives(DEFAULT_OBJECTIVES), "default: the runs come from no sweep"
    return choose_objectives(sweep_objectives(runs, client))


def objectives_text(objectives: list[Objective]) -> str:
    """``"accuracy:max,epsilon:min"``."""
    return ",".join(str(o) for o in objectives)
