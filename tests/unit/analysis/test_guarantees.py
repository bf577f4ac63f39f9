"""A run's epsilon on a front is its guarantee (issue 23 §1.2), and a front that compares
epsilons under different neighbouring relations says so (§1.1)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from analysis.fronts import analyse_front
from analysis.guarantees import (
    apply_guarantees,
    apply_guarantees_to_histories,
    relation_note,
)
from analysis.interactive import pareto_figure
from analysis.pareto import Objective, pareto_front
from analysis.plots import plot_pareto_2d
from analysis.tables import front_records

ACC, EPS = Objective("accuracy", "max"), Objective("epsilon", "min")
INF = math.inf


def runs(rows: list[tuple]) -> pd.DataFrame:
    """(run_id, algorithm, dp_guarantee, dp_relation, accuracy, epsilon) rows, all FINISHED;
    a client-level row carries the ``client_sampling`` tag of its relation, as flcore tags
    every client-level run."""
    cols = ["run_id", "algorithm", "dp_guarantee", "dp_relation", "accuracy", "epsilon"]
    df = pd.DataFrame(rows, columns=cols)
    df["status"] = "FINISHED"
    sampling = {"add-remove": "poisson", "replace-one": "fixed"}
    df["client_sampling"] = [
        sampling[r] if g == "client-level" else None
        for g, r in zip(df["dp_guarantee"], df["dp_relation"], strict=True)
    ]
    return df


def test_a_shared_only_run_from_an_old_store_lands_at_inf_on_the_front() -> None:
    # CENTAUR as an old store holds it: its shared part's 1.0 logged as epsilon, no
    # epsilon_shared. Read as a guarantee it would dominate the ISRL run.
    df = runs(
        [
            ("c", "centaur", "shared-only", "add-remove", 0.90, 1.0),
            ("d", "dp_fedavg", "isrl", "add-remove", 0.80, 2.0),
        ]
    )

    result = pareto_front(df, [ACC, EPS], by="algorithm")

    front = result.front.set_index("run_id")
    assert set(front.index) == {"c", "d"}  # neither dominates the other now
    assert front.loc["c", "epsilon"] == INF
    assert front.loc["c", "epsilon_shared"] == 1.0  # what the shared part spent, kept
    assert result.per_group["centaur"]["epsilon"].tolist() == [INF]


def test_a_weak_delta_run_lands_at_inf_and_a_client_ldp_run_keeps_its_epsilon() -> None:
    # LoDMeta at the paper's delta 0.3 (weak) and at 1e-5 (client-ldp): only the second has
    # a guarantee, so the first cannot dominate it on the epsilon axis
    df = runs(
        [
            ("w", "lodmeta", "weak-delta", "replace-one", 0.90, 0.8),
            ("g", "lodmeta", "client-ldp", "replace-one", 0.85, 3.0),
        ]
    )

    result = pareto_front(df, [ACC, EPS], by="algorithm")

    front = result.front.set_index("run_id")
    assert front["epsilon"].to_dict() == {"w": INF, "g": 3.0}


def test_new_runs_and_runs_without_dp_keep_their_values() -> None:
    df = runs(
        [
            ("p", "ppsgd", "shared-only", "add-remove", 0.9, INF),  # flcore's new form
            ("f", "fedavg", "none", None, 0.8, 3.0),  # a none run never has a finite epsilon
            ("l", "local", "no-release", None, 0.7, 0.0),
            ("o", "dp_fedavg", None, None, 0.6, 2.0),  # made before the tag existed
        ]
    )
    df["epsilon_shared"] = [4.0, np.nan, np.nan, np.nan]

    out = apply_guarantees(df).set_index("run_id")

    assert out["epsilon"].to_dict() == {"p": INF, "f": INF, "l": 0.0, "o": 2.0}
    assert out.loc["p", "epsilon_shared"] == 4.0  # the logged one is not overwritten
    assert np.isnan(out.loc["f", "epsilon_shared"])
    assert apply_guarantees(apply_guarantees(df)).equals(apply_guarantees(df))  # idempotent
    assert df.loc[1, "epsilon"] == 3.0  # the input frame is not changed


def test_a_client_level_run_from_before_sampling_and_accounting_agreed_lands_at_inf() -> None:
    # flcore before fb93cf3: a fixed m clients a round, accounted as Poisson sampling at m / N
    # (add/remove), which under-reports; such runs have no client_sampling tag, and the
    # oldest no dp_guarantee either
    df = runs(
        [
            ("old", "dp_fedavg_client", "client-level", "add-remove", 0.80, 1.5),
            ("older", "dp_fedavg_client", None, None, 0.82, 1.2),
            ("new", "dp_fedavg_client", "client-level", "replace-one", 0.78, 6.0),
            ("isrl", "dp_fedavg", None, None, 0.75, 2.0),  # untagged record-level: left alone
        ]
    )
    df.loc[df["run_id"].isin(["old", "older"]), "client_sampling"] = None
    df["epsilon_std"] = [0.1, 0.2, 0.3, 0.4]

    out = apply_guarantees(df).set_index("run_id")

    assert out["epsilon"].to_dict() == {"old": INF, "older": INF, "new": 6.0, "isrl": 2.0}
    assert out.loc["old", "epsilon_accountant"] == 1.5  # the logged figure, under its name
    assert out.loc["older", "epsilon_accountant"] == 1.2
    assert np.isnan(out.loc["new", "epsilon_accountant"])
    assert np.isnan(out.loc["old", "epsilon_std"]) and out.loc["new", "epsilon_std"] == 0.3
    assert apply_guarantees(apply_guarantees(df)).equals(apply_guarantees(df))  # idempotent
    # on a front the unsound 1.5 no longer dominates the sound 6.0 at lower accuracy
    result = pareto_front(df, [ACC, EPS])
    assert result.table.set_index("run_id").loc["old", "epsilon"] == INF
    assert {"new", "older", "isrl"} == set(result.front["run_id"])
    # and its round-by-round epsilon is not drawn as a guarantee either
    history = pd.DataFrame(
        {"run_id": ["old", "new"], "metric": "epsilon", "step": 1, "value": [1.5, 6.0]}
    )
    values = apply_guarantees_to_histories(history, df).set_index("run_id")["value"]
    assert values.to_dict() == {"old": INF, "new": 6.0}


def test_seed_spread_of_a_shared_epsilon_moves_with_it() -> None:
    df = runs([("c", "centaur", "shared-only", None, 0.9, 2.5)])
    df["epsilon_std"] = 0.1

    out = apply_guarantees(df)

    assert out["epsilon"].iloc[0] == INF and np.isnan(out["epsilon_std"].iloc[0])
    assert out["epsilon_shared_std"].iloc[0] == pytest.approx(0.1)


def test_json_rows_carry_what_epsilon_guarantees_also_over_averaged_seeds() -> None:
    df = runs(
        [
            ("c0", "centaur", "shared-only", "add-remove", 0.90, 1.0),
            ("c1", "centaur", "shared-only", "add-remove", 0.92, 1.0),
            ("d0", "dp_fedavg_client", "client-level", "replace-one", 0.80, 2.0),
            ("d1", "dp_fedavg_client", "client-level", "replace-one", 0.82, 2.0),
        ]
    )
    df["params.lr"] = 0.1
    df["params.seed"] = [0, 1, 0, 1]
    df["client_sampling"] = [None, None, "fixed", "fixed"]

    analysis = analyse_front(df, [ACC, EPS])
    records = {r["algorithm"]: r for r in front_records(analysis)}

    assert analysis.seeds_averaged
    assert records["centaur"]["epsilon"] == INF
    assert records["centaur"]["dp_guarantee"] == "shared-only"
    assert records["dp_fedavg_client"]["dp_relation"] == "replace-one"
    assert records["dp_fedavg_client"]["client_sampling"] == "fixed"


def test_a_front_mixing_neighbouring_relations_says_so() -> None:
    df = runs(
        [
            ("a", "dp_fedavg", "isrl", "add-remove", 0.80, 2.0),
            ("r", "dp_fedavg_client", "client-level", "replace-one", 0.70, 1.0),
            ("f", "fedavg", "none", None, 0.90, INF),
        ]
    )
    one_relation = df[df["run_id"] != "r"]

    mixed = pareto_front(df, [ACC, EPS])
    single = pareto_front(one_relation, [ACC, EPS])
    no_epsilon = pareto_front(df, [ACC])

    assert len(mixed.notes) == 1
    assert "add-remove (1), replace-one (1)" in mixed.notes[0]
    assert "not comparable" in mixed.notes[0]
    assert single.notes == [] and no_epsilon.notes == []  # nothing to warn about


def test_the_relation_note_ignores_left_out_runs() -> None:
    df = runs(
        [
            ("a", "dp_fedavg", "isrl", "add-remove", 0.80, 2.0),
            ("r", "dp_fedavg_client", "client-level", "replace-one", 0.70, 1.0),
        ]
    )
    df.loc[1, "status"] = "FAILED"

    assert pareto_front(df, [ACC, EPS]).notes == []


def test_plots_carry_the_relation_note(tmp_path) -> None:  # type: ignore[no-untyped-def]
    df = runs(
        [
            ("a", "dp_fedavg", "isrl", "add-remove", 0.80, 2.0),
            ("r", "dp_fedavg_client", "client-level", "replace-one", 0.70, 1.0),
            ("c", "centaur", "shared-only", "add-remove", 0.90, 0.5),
        ]
    )
    table = pareto_front(df, [EPS, ACC]).table

    png = plot_pareto_2d(table, EPS, ACC, path=tmp_path / "mixed.png")
    plain = plot_pareto_2d(table.iloc[[0, 2]], EPS, ACC, path=tmp_path / "plain.png")
    fig = pareto_figure(table, EPS, ACC)

    assert "not comparable" in Image.open(png).text["Description"]
    assert "Description" not in Image.open(plain).text
    assert any("not comparable" in a.text for a in fig.layout.annotations)
    shown = {row[3] for t in fig.data if t.customdata is not None for row in t.customdata}
    assert "shared-only" in shown  # hover says what each epsilon guarantees
    assert table.set_index("run_id").loc["c", "epsilon"] == INF  # drawn in the "no DP" band


def test_histories_of_a_run_without_a_guarantee() -> None:
    runs_ = pd.DataFrame(
        {"run_id": ["c", "d", "f"], "dp_guarantee": ["shared-only", "isrl", "none"]}
    )
    history = pd.DataFrame(
        {
            "run_id": ["c", "c", "d", "f"],
            "metric": ["epsilon"] * 4,
            "step": [1, 2, 1, 1],
            "value": [0.5, 1.0, 0.7, 9.0],
        }
    )

    out = apply_guarantees_to_histories(history, runs_)

    eps = out[out["metric"] == "epsilon"].set_index(["run_id", "step"])["value"]
    assert eps.to_dict() == {("c", 1): INF, ("c", 2): INF, ("d", 1): 0.7, ("f", 1): INF}
    shared = out[out["metric"] == "epsilon_shared"]
    assert shared[["run_id", "step", "value"]].values.tolist() == [["c", 1, 0.5], ["c", 2, 1.0]]


def test_relation_note_counts_each_relation() -> None:
    df = pd.DataFrame({"dp_relation": ["add-remove", "add-remove", "replace-one", None]})

    note = relation_note(df)

    assert note is not None and "add-remove (2), replace-one (1)" in note
    assert relation_note(df.iloc[:2]) is None
    assert relation_note(df, ["accuracy", "bytes_up"]) is None


def test_a_run_at_epsilon_inf_brings_no_relation_into_the_note() -> None:
    """A shared-only run was accounted add/remove for its shared part, but its epsilon is inf:
    beside a replace-one run it compares no guarantee, so no note."""
    df = runs(
        [
            ("r", "dp_fedavg_client", "client-level", "replace-one", 0.70, 1.0),
            ("c", "centaur", "shared-only", "add-remove", 0.90, 0.5),
            ("n", "fedavg", "none", None, 0.92, INF),
        ]
    )

    assert pareto_front(df, [ACC, EPS]).notes == []
