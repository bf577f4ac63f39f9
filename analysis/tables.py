"""Tables derived from runs and fronts: JSON records, display strings, best configurations,
communication per round. Pure functions of DataFrames.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.fronts import FrontAnalysis, config_columns
from analysis.guarantees import DP_TAG_COLUMNS
from analysis.pareto import Objective
from analysis.validity import exclusion_reasons

__all__ = [
    "best_configs",
    "communication",
    "fmt",
    "fmt_bytes",
    "front_records",
    "group_front_records",
    "mean_std",
    "run_ids_of",
    "shared_config",
    "varying_params",
]


def fmt(value: Any, digits: int = 4) -> str:
    """A table cell: ``∞`` for inf, ``–`` for a missing value, floats to ``digits`` figures."""
    if value is None:
        return "–"
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return f"{value:.{digits}g}"
    return str(value)


def fmt_bytes(value: float) -> str:
    """``3746112`` -> ``"3.75 MB"`` (decimal units)."""
    if value is None or not math.isfinite(value):
        return fmt(value)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def mean_std(row: pd.Series | dict[str, Any], name: str) -> str:
    """``"0.812 ± 0.01"`` when the row has a finite ``<name>_std``, else the value alone."""
    value = row.get(name)
    std = row.get(f"{name}_std")
    text = fmt(value)
    if std is not None and isinstance(std, float | np.floating) and math.isfinite(std):
        text += f" ± {fmt(std, 2)}"
    return text


def run_ids_of(row: pd.Series | dict[str, Any]) -> list[str]:
    """The runs a table row stands for: its ``run_ids`` (averaged seeds) or its ``run_id``."""
    ids = row.get("run_ids")
    if isinstance(ids, str) and ids:
        return ids.split(",")
    run_id = row.get("run_id")
    return [str(run_id)] if run_id is not None and run_id == run_id else []


def _record(row: pd.Series, objectives: Sequence[Objective], by: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"run_id": row.get("run_id")}
    if "algorithm" in row.index:
        out["algorithm"] = row["algorithm"]
    if by is not None and by != "algorithm":
        out[by] = row[by]
    # What the row's epsilon means: always there, null for runs made before the tags existed.
    for col in DP_TAG_COLUMNS:
        value = row.get(col)
        out[col] = value if isinstance(value, str) and value else None
    for o in objectives:
        out[o.name] = float(row[o.name])
        std = row.get(f"{o.name}_std")
        if std is not None and isinstance(std, float | np.floating) and not math.isnan(std):
            out[f"{o.name}_std"] = float(std)
    if "n_seeds" in row.index:
        out["n_seeds"] = int(row["n_seeds"])
        out["run_ids"] = run_ids_of(row)
    return out


def front_records(analysis: FrontAnalysis, by: str | None = "algorithm") -> list[dict[str, Any]]:
    """The overall front as JSON-ready dicts: ``run_id``, ``algorithm``, ``dp_guarantee``,
    ``dp_relation``, ``client_sampling`` (null where the run has no such tag), each objective
    (and ``<objective>_std``, ``n_seeds``, ``run_ids`` where seeds were averaged)."""
    objectives = analysis.result.objectives
    return [_record(row, objectives, by) for _, row in analysis.result.front.iterrows()]


def group_front_records(
    analysis: FrontAnalysis, by: str | None = "algorithm"
) -> dict[str, list[dict[str, Any]]]:
    """Each group's own front, as :func:`front_records`, with ``on_overall_front``."""
    objectives = analysis.result.objectives
    overall = set(analysis.result.front.get("run_id", pd.Series(dtype=object)))
    return {
        group: [
            _record(row, objectives, by) | {"on_overall_front": row.get("run_id") in overall}
            for _, row in front.iterrows()
        ]
        for group, front in analysis.result.per_group.items()
    }


def varying_params(df: pd.DataFrame) -> list[str]:
    """The configuration columns whose value differs between the rows of ``df``."""
    return [
        c
        for c in config_columns(df)
        if df[c].astype(str).nunique(dropna=False) > 1  # str: NaN and None read alike
    ]


def shared_config(df: pd.DataFrame) -> dict[str, Any]:
    """The config keys every run shares, ``{"lr": 0.05, ...}`` (``params.`` dropped)."""
    out = {}
    for c in config_columns(df):
        values = df[c].astype(str).unique()
        if len(values) == 1 and len(df):
            out[c[len("params.") :]] = df[c].iloc[0]
    return out


def best_configs(
    runs: pd.DataFrame, analysis: FrontAnalysis, *, by: str = "algorithm", top: int = 5
) -> dict[str, pd.DataFrame]:
    """Each group's best configurations: its own front (at most ``top`` rows, best first in
    the first objective), with the objectives as ``mean ± std`` strings (an epsilon: the largest
    over the seeds, :func:`analysis.pareto.pareto_front`), the seed count where
    seeds were averaged, the run ids, and the params that vary inside that group."""
    objectives = analysis.result.objectives
    ok = runs.loc[exclusion_reasons(runs, []).isna().to_numpy()]
    out: dict[str, pd.DataFrame] = {}
    for group, front in analysis.result.per_group.items():
        mine = ok[ok[by].astype(str) == group] if by in ok.columns else ok
        params = [c for c in varying_params(mine) if c in front.columns]
        rows = []
        for _, row in front.head(top).iterrows():
            cells: dict[str, Any] = {o.name: mean_std(row, o.name) for o in objectives}
            if "n_seeds" in front.columns:
                cells["seeds"] = int(row["n_seeds"])
            cells.update({p[len("params.") :]: fmt(row[p]) for p in params})
            cells["runs"] = run_ids_of(row)
            rows.append(cells)
        out[group] = pd.DataFrame(rows)
    return out


def _rounds(df: pd.DataFrame) -> pd.Series:
    """Rounds each run completed: its ``rounds`` metric, else its configured ``params.rounds``."""
    nan = pd.Series(np.nan, index=df.index)
    planned = pd.to_numeric(df["params.rounds"], errors="coerce") if "params.rounds" in df else nan
    if "rounds" in df:
        return pd.to_numeric(df["rounds"], errors="coerce").fillna(planned)
    return planned


def communication(df: pd.DataFrame, *, reference: str = "fedavg") -> pd.DataFrame:
    """Mean bytes per round per algorithm and setting, and the upload relative to ``reference``.

    One row per (algorithm, dataset, num_clients, client_fraction) among the runs that may stand
    on a front (finished, not pruned, not stopped early) with ``bytes_up``: ``runs``,
    ``up_per_round`` and ``down_per_round`` (medians over runs of bytes / rounds), and
    ``up_vs_<reference>``, the ratio to the reference algorithm's upload in the same setting
    (NaN where the setting has no reference run).
    """
    needed = {"bytes_up", "bytes_down", "algorithm"}
    if not needed <= set(df.columns):
        return pd.DataFrame()
    # A stopped or failed run's bytes over its planned rounds would be a made-up figure.
    ok = df.loc[exclusion_reasons(df, []).isna().to_numpy()]
    ok = ok[ok["bytes_up"].notna()]
    if not len(ok):
        return pd.DataFrame()
    rounds = _rounds(ok)
    setting = [
        c for c in ("dataset", "params.num_clients", "params.client_fraction") if c in ok.columns
    ]
    frame = ok[["algorithm", *setting]].copy()
    frame["up_per_round"] = ok["bytes_up"].astype(float) / rounds
    frame["down_per_round"] = ok["bytes_down"].astype(float) / rounds
    keys = ["algorithm", *setting]
    table = (
        frame.groupby(keys, dropna=False, sort=True)
        .agg(
            runs=("up_per_round", "size"),
            up_per_round=("up_per_round", "median"),
            down_per_round=("down_per_round", "median"),
        )
        .reset_index()
    )
    ref = table[table["algorithm"] == reference].set_index(setting)["up_per_round"]
    ratio_col = f"up_vs_{reference}"
    if setting and len(ref):
        base = table.set_index(setting).index.map(lambda k: ref.get(k, np.nan))
        table[ratio_col] = table["up_per_round"].to_numpy() / np.asarray(base, dtype=float)
    else:
        table[ratio_col] = np.nan
    return table.rename(columns={c: c.removeprefix("params.") for c in setting})
