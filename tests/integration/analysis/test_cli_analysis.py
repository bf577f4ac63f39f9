"""``fedsweep pareto | query | report | curves`` on a real store: the console script for the
JSON contract and an exit code, the Typer app in-process for the rest (same code, no new
interpreter per call)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.tables import fmt
from sweeps.cli import app
from sweeps.tracking import mlflow_client
from tests.integration.analysis.store import SWEEP_NAME, Store
from tests.integration.sweep_helpers import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def invoke(store: Store, args: list[str]) -> object:
    return CliRunner().invoke(app, args, env={"MLFLOW_TRACKING_URI": store.uri})


def test_pareto_json_front_counts_and_files(store: Store, tmp_path: Path) -> None:
    out = cli(
        ["pareto", "--experiment", "fl-runs", "--out", "figs", "--json", "--reference", "0,10"],
        tmp_path,
        MLFLOW_TRACKING_URI=store.uri,
    )

    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert (doc["n_runs"], doc["n_failed"], doc["n_invalid"]) == (6, 1, 1)  # the FAILED run
    assert doc["invalid_reasons"] == {"FAILED": 1} and doc["notes"] == []
    assert doc["statuses"] == {"FINISHED": 5, "FAILED": 1}
    assert doc["seeds_averaged"] is True  # Local-only ran seeds 0 and 1
    assert doc["objectives"] == ["accuracy:max", "epsilon:min"]
    front_ids = {r["run_id"] for r in doc["front"]}
    assert store.runs["failed"] not in front_ids  # 0.99 at epsilon 0, but FAILED
    for row in doc["front"]:
        assert {"run_id", "algorithm", "accuracy", "epsilon"} <= set(row)
    local = next(r for r in doc["fronts_by_group"]["local"])
    assert local["n_seeds"] == 2 and set(local["run_ids"]) == {
        store.runs["local-s0"],
        store.runs["local-s1"],
    }
    assert "accuracy_std" in local
    fedavg = doc["fronts_by_group"]["fedavg"][0]
    assert fedavg["epsilon"] == "inf"  # JSON has no inf: a string says so
    assert set(doc["fronts_by_group"]) == {"fedavg", "local", "hyperfl", "dp_fedavg"}
    assert doc["hypervolume"]["all"] > 0 and doc["hypervolume"]["fedavg"] == 0.0
    files = {k: Path(v) for k, v in doc["files"].items()}
    assert files["png"].read_bytes()[:8] == PNG_MAGIC
    with files["csv"].open() as f:
        rows = list(csv.DictReader(f))
    assert {r["run_id"] for r in rows} == front_ids and "rank" in rows[0]
    assert len(pd.read_csv(files["ranks_csv"])) == 4  # 5 finished runs, 2 seeds averaged
    assert "Plotly.newPlot" in files["html"].read_text()


def test_pareto_table_by_none_and_from_parquet(store: Store, tmp_path: Path) -> None:
    table = invoke(store, ["pareto", "-e", "fl-runs", "--out", str(tmp_path), "--by", "none"])
    export = invoke(
        store, ["export", "--experiment", "fl-runs", "--out", str(tmp_path / "r.parquet")]
    )
    parquet = invoke(
        store,
        ["pareto", "--parquet", str(tmp_path / "r.parquet"), "--out", str(tmp_path), "--json"],
    )

    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert "Pareto fronts of fl-runs" in text and "1 left out as invalid: 1 FAILED" in text
    assert (tmp_path / "fl-runs_pareto.png").is_file()
    assert export.exit_code == 0 and parquet.exit_code == 0, parquet.output
    doc = json.loads(parquet.stdout)
    assert doc["n_runs"] == 6 and doc["n_failed"] == 1 and doc["parquet"].endswith("r.parquet")
    assert (tmp_path / "r_pareto.csv").is_file()


def test_pareto_other_objectives_and_a_sweep(store: Store, tmp_path: Path) -> None:
    result = invoke(
        store,
        [
            "pareto",
            "-e",
            "fl-runs",
            "-e",
            "fl-sweep",
            "--sweep",
            SWEEP_NAME,
            "--objectives",
            "accuracy:max,bytes_up:min",
            "--out",
            str(tmp_path),
            "--json",
        ],
    )

    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["n_runs"] == 2 and {r["algorithm"] for r in doc["front"]} == {"local"}
    assert (tmp_path / f"fl-runs+fl-sweep-{SWEEP_NAME}_pareto.png").is_file()


def test_unknown_experiment_exits_2_from_the_console_script(store: Store, tmp_path: Path) -> None:
    out = cli(
        ["pareto", "--experiment", "nope", "--out", "o"], tmp_path, MLFLOW_TRACKING_URI=store.uri
    )

    assert out.returncode == 2
    assert "unknown MLflow experiment(s) 'nope'" in out.stderr and "fl-runs" in out.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--objectives", "attack_mse:min,accuracy:max"], "no run reports objective(s)"),
        (["--objectives", "accuracy"], "has no direction"),
        (["--filter", "metrics.accuracy >"], "malformed filter"),
        (["--filter", "params.algorithm == 'x'"], "Invalid comparator"),
        (["--reference", "0"], "--reference"),
        (["--by", "method"], "group-by column 'method'"),
        (["--filter", "params.algorithm = 'nothing'"], "no runs to analyse"),
        (["--parquet", "x.parquet"], "--experiment NAME"),  # both sources
    ],
)
def test_pareto_bad_input_exits_2_and_writes_nothing(
    store: Store, tmp_path: Path, args: list[str], needle: str
) -> None:
    result = invoke(store, ["pareto", "-e", "fl-runs", "--out", str(tmp_path / "o"), *args])

    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.stderr.split())  # rich wraps long lines
    assert not (tmp_path / "o").exists()


def test_query_formats(store: Store, tmp_path: Path) -> None:
    where = "metrics.accuracy > 0 and params.algorithm = 'local'"
    pq_path = str(tmp_path / "q.parquet")
    table = invoke(store, ["query", where, "-e", "fl-runs"])
    as_csv = invoke(store, ["query", where, "-e", "fl-runs", "--format", "csv"])
    some = invoke(
        store, ["query", "", "-e", "fl-runs", "--format", "csv", "--columns", "run_id,epsilon"]
    )
    pq = invoke(
        store,
        ["query", "", "-e", "fl-runs", "-e", "fl-sweep", "--format", "parquet", "--out", pq_path],
    )

    local = {store.runs["local-s0"], store.runs["local-s1"]}
    assert table.exit_code == 0 and all(i in table.stdout for i in local)
    assert "2 run(s) match" in table.stderr
    assert set(pd.read_csv(io.StringIO(as_csv.stdout))["run_id"]) == local
    eps = pd.read_csv(io.StringIO(some.stdout)).set_index("run_id")["epsilon"]
    assert list(eps.index.names) == ["run_id"] and eps[store.runs["fedavg"]] == math.inf
    assert pq.exit_code == 0, pq.output
    frame = pd.read_parquet(pq_path)
    assert len(frame) == 8 and set(frame["experiment"]) == {"fl-runs", "fl-sweep"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["params.algorithm == 'x'", "-e", "fl-runs"], "Invalid comparator"),
        (["metrics.accuracy >", "-e", "fl-runs"], "malformed filter"),
        (["", "-e", "nope"], "unknown MLflow experiment"),
        (["", "-e", "fl-runs", "--format", "parquet"], "needs --out"),
        (["", "-e", "fl-runs", "--columns", "run_id,bogus"], "no column(s) bogus"),
        # a user's value with brackets is printed as written, not read as markup
        (["", "-e", "nope[red]"], "unknown MLflow experiment(s) 'nope[red]'"),
        (["", "-e", "[/x]"], "'[/x]'"),
    ],
)
def test_query_bad_input_exits_2(store: Store, args: list[str], needle: str) -> None:
    result = invoke(store, ["query", *args])

    assert result.exit_code == 2, result.output
    assert needle in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "command",
    [
        ["query", "", "-e", "fl-runs", "--format", "csv"],
        ["query", "", "-e", "fl-runs", "--format", "parquet"],
        ["export", "--experiment", "fl-runs"],
        ["report", "-e", "fl-runs"],
    ],
)
def test_an_out_that_is_a_folder_exits_2_before_any_run_is_read(
    store: Store, tmp_path: Path, command: list[str]
) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()

    result = invoke(store, [*command, "--out", str(folder)])

    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert "is a folder; give a file name such as" in message
    assert "match" not in message  # no run was read before the refusal
    assert list(folder.iterdir()) == []


def test_report_on_runs_without_a_sweep(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "r" / "report.html"

    result = invoke(store, ["report", "-e", "fl-runs", "--out", str(out)])

    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "not started by a sweep" in html
    assert f"/#/experiments/1/runs/{store.runs['local-s0']}" in html
    assert "attack reconstructions of fedavg" in html  # the logged grid is shown
    psnr = mlflow_client(store.uri).get_run(store.runs["fedavg"]).data.metrics["leak_psnr"]
    assert f"leak_psnr {fmt(psnr)}" in html and "labels given" in html
    assert "no LPIPS" in html or "leak_lpips –" not in html
    assert "No run matches a Table 1 setting" in html
    assert "reports no attack figure for fmnist" in html
    assert "upload × FedAvg" in html and "hyperfl" in html


def test_report_of_a_sweep_shows_its_spec(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "sweep.html"

    result = invoke(
        store,
        ["report", "-e", "fl-sweep", "--out", str(out), "--mlflow-url", "http://h:1"],
    )

    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert f"Sweep <code>{SWEEP_NAME}</code>" in html and "sweep.algorithms" in html
    assert "sweep_spec.json" in html and "&#34;num_samples&#34;: 2" in html
    assert f"http://h:1/#/experiments/2/runs/{store.parent_run_id}" in html
    assert "No run of these experiments ran a privacy attack" in html


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-e", "nope"], "unknown MLflow experiment"),
        (["-e", "fl-runs", "--objectives", "attack_mse:min,accuracy:max"], "no run reports"),
        (["-e", "fl-runs", "--filter", "metrics.x >"], "malformed filter"),
    ],
)
def test_report_bad_input_exits_2_and_writes_nothing(
    store: Store, tmp_path: Path, args: list[str], needle: str
) -> None:
    out = tmp_path / "report.html"

    result = invoke(store, ["report", *args, "--out", str(out)])

    assert result.exit_code == 2 and needle in " ".join(result.stderr.split())
    assert not out.exists()


def test_curves_of_chosen_runs(store: Store, tmp_path: Path) -> None:
    ids = [store.runs["fedavg"], store.runs["hyperfl"]]

    ok = invoke(
        store,
        [
            "curves",
            *ids,
            "-m",
            "train_loss",
            "-m",
            "round_bytes_up",
            "--out",
            str(tmp_path / "c.png"),
        ],
    )
    bad = invoke(store, ["curves", "nope", "--out", str(tmp_path / "x.png")])
    unlogged = invoke(store, ["curves", ids[0], "-m", "never", "--out", str(tmp_path / "y.png")])

    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    assert bad.exit_code == 2 and "no run 'nope'" in bad.stderr
    assert unlogged.exit_code == 2 and "none of these runs logged never" in unlogged.stderr
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()
