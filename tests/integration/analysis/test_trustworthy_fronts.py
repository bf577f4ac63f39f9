"""What lands on a front, read from a real sqlite MLflow store through the CLI (issue 23: §1.1
mixed relations, §1.2 epsilon is the guarantee, §3 invalid runs left out and counted, §5.4 the
sweep's own objectives). The runs are described in store.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from sweeps.cli import app
from tests.integration.analysis.store import SWEEP_NAME, TRUST_SWEEP, Store

INVALID_TRIALS = {"trial-failed", "trial-stopped", "trial-unmeasured", "trial-old-asha"}


def invoke(store: Store, args: list[str]) -> object:
    return CliRunner().invoke(app, args, env={"MLFLOW_TRACKING_URI": store.uri})


def test_shared_only_runs_stand_at_inf_and_mixed_relations_are_noted(
    store: Store, tmp_path: Path
) -> None:
    as_json = invoke(store, ["pareto", "-e", "fl-trust", "--out", str(tmp_path), "--json"])
    table = invoke(store, ["pareto", "-e", "fl-trust", "--out", str(tmp_path)])

    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    assert doc["objectives"] == ["accuracy:max", "epsilon:min"]  # no sweep: the default
    rows = {r["run_id"]: r for g in doc["fronts_by_group"].values() for r in g}
    old = rows[store.runs["centaur-old"]]  # logged epsilon 0.01: now its guarantee, inf
    assert old["epsilon"] == "inf" and old["dp_guarantee"] == "shared-only"
    ppsgd = rows[store.runs["ppsgd-shared"]]  # a real run under the paper's protocol
    assert ppsgd["epsilon"] == "inf" and ppsgd["dp_guarantee"] == "shared-only"
    # At 0.01 the old CENTAUR run would have dominated both DP runs off the overall front.
    front = {r["run_id"]: r for r in doc["front"]}
    assert store.runs["client-replace-one"] in front
    assert front[store.runs["client-replace-one"]]["dp_relation"] == "replace-one"
    assert front[store.runs["client-replace-one"]]["client_sampling"] == "fixed"
    assert len(doc["notes"]) == 1 and "add-remove (1), replace-one (1)" in doc["notes"][0]
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert "note:" in text and "not comparable" in text


def test_invalid_trials_never_reach_a_front_and_are_counted(store: Store, tmp_path: Path) -> None:
    result = invoke(store, ["pareto", "-e", "fl-trust-sweep", "--out", str(tmp_path), "--json"])
    table = invoke(store, ["pareto", "-e", "fl-trust-sweep", "--out", str(tmp_path)])

    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["run_id"] for r in doc["front"]] == [store.runs["trial-ok"]]
    assert (doc["n_runs"], doc["n_invalid"]) == (5, 4)
    assert doc["invalid_reasons"] == {
        "stopped early": 2,  # tagged, and an old sweep's trial that stopped at round 1 of 2
        "FAILED": 1,
        "not measured: bytes_up": 1,
    }
    ranked = pd.read_csv(doc["files"]["ranks_csv"])
    assert set(ranked["run_id"]) == {store.runs["trial-ok"]}
    assert table.exit_code == 0, table.output
    assert "4 left out as invalid" in " ".join(table.stdout.split())


def test_fronts_default_to_the_sweeps_objectives(store: Store, tmp_path: Path) -> None:
    own = invoke(store, ["pareto", "-e", "fl-trust-sweep", "--out", str(tmp_path), "--json"])
    given = invoke(
        store,
        [
            "pareto",
            *("-e", "fl-trust-sweep", "--out", str(tmp_path), "--json"),
            *("--objectives", "accuracy:max,epsilon:min"),
        ],
    )
    mixed = invoke(
        store, ["pareto", "-e", "fl-sweep", "-e", "fl-trust-sweep", "--out", str(tmp_path / "m")]
    )
    picked = invoke(
        store,
        ["pareto", "-e", "fl-trust-sweep", "-e", "fl-sweep", "--sweep", SWEEP_NAME, "--json"]
        + ["--out", str(tmp_path)],
    )

    doc = json.loads(own.stdout)
    assert doc["objectives"] == ["accuracy:max", "bytes_up:min"]
    assert TRUST_SWEEP in doc["objectives_from"]
    assert json.loads(given.stdout)["objectives"] == ["accuracy:max", "epsilon:min"]
    assert mixed.exit_code == 2, mixed.output
    message = " ".join(mixed.stderr.split())
    assert "different objectives" in message and "--objectives" in message
    assert not (tmp_path / "m").exists()
    assert json.loads(picked.stdout)["objectives"] == ["accuracy:max", "epsilon:min"]


def test_the_report_shows_the_invalid_runs_the_note_and_the_sweeps_objectives(
    store: Store, tmp_path: Path
) -> None:
    sweep_out, trust_out = tmp_path / "sweep.html", tmp_path / "trust.html"

    sweep = invoke(store, ["report", "-e", "fl-trust-sweep", "--out", str(sweep_out)])
    trust = invoke(store, ["report", "-e", "fl-trust", "--out", str(trust_out)])

    assert sweep.exit_code == 0 and trust.exit_code == 0, sweep.output + trust.output
    html = " ".join(sweep_out.read_text().split())
    assert "<code>bytes_up:min</code>" in html and f"sweep {TRUST_SWEEP}" in html
    assert "4 run(s) are left out of the fronts as invalid: 2 stopped early" in html
    trust_html = " ".join(trust_out.read_text().split())
    assert trust_html.count('class="note front-note"') == 2  # above the plot, under the table
    assert "<td>shared-only</td>" in trust_html
    assert "<td>client-level (replace-one)</td>" in trust_html


def test_export_and_query_carry_the_new_columns(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "trust.parquet"

    export = invoke(store, ["export", "--experiment", "fl-trust-sweep", "--out", str(out)])
    query = invoke(store, ["query", "", "-e", "fl-trust", "--format", "csv"])

    assert export.exit_code == 0, export.output
    trials = pd.read_parquet(out).set_index("run_id")
    stopped = trials.loc[store.runs["trial-stopped"]]
    assert stopped["stopped_early"] == True  # noqa: E712 - a nullable column
    assert stopped["rounds_completed"] == 1 and stopped["trial_status"] == "PRUNED"
    assert trials.loc[store.runs["trial-ok"], "optuna_trial"] == 0
    assert pd.isna(trials.loc[store.runs["trial-ok"], "stopped_early"])  # untagged: null
    runs = pd.read_csv(__import__("io").StringIO(query.stdout)).set_index("run_id")
    old = runs.loc[store.runs["centaur-old"]]
    assert old["epsilon"] == math.inf and old["epsilon_shared"] == 0.01
    assert runs.loc[store.runs["client-replace-one"], "client_sampling"] == "fixed"
