"""Loading runs from a real sqlite MLflow store and from Parquet; the artifact helpers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.artifacts import ATTACK_GRID, attack_grid, sweep_spec
from analysis.load import LoadError, load_histories, load_parquet, load_run_ids, load_runs
from sweeps.tracking import mlflow_client
from tests.integration.analysis.store import SWEEP_NAME, Store

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_one_experiment_is_one_row_per_run_with_failed_runs_kept(store: Store) -> None:
    df = load_runs("fl-runs", uri=store.uri)

    assert len(df) == 6 and df["run_id"].is_unique
    assert set(df["experiment"]) == {"fl-runs"}
    by_id = df.set_index("run_id")
    assert by_id.loc[store.runs["failed"], "status"] == "FAILED"
    assert (by_id.drop(store.runs["failed"])["status"] == "FINISHED").all()
    assert by_id.loc[store.runs["fedavg"], "epsilon"] == math.inf  # float max read back
    assert by_id.loc[store.runs["local-s0"], "epsilon"] == 0.0
    assert 0 < by_id.loc[store.runs["dp_fedavg"], "epsilon"] < math.inf
    logged = mlflow_client(store.uri).get_run(store.runs["fedavg"]).data.metrics["leak_psnr"]
    assert by_id.loc[store.runs["fedavg"], "leak_psnr"] == logged > 0  # a real attack's
    for col in ("params.num_clients", "params.seed", "accuracy", "bytes_up", "dp_guarantee"):
        assert col in df.columns, col
    real = df[df["run_id"] != store.runs["failed"]]  # made by run_experiment: provenance
    assert real["tags.fedsweep.git_commit"].notna().all()
    assert real["tags.torch.version"].notna().all()


def test_several_experiments_load_into_one_frame_and_sweep_parents_are_optional(
    store: Store,
) -> None:
    both = load_runs(["fl-runs", "fl-sweep"], uri=store.uri)
    with_parent = load_runs(["fl-sweep"], uri=store.uri, include_parents=True)

    assert len(both) == 8 and set(both["experiment"]) == {"fl-runs", "fl-sweep"}
    assert store.parent_run_id not in set(both["run_id"])
    parent = with_parent[with_parent["run_id"] == store.parent_run_id].iloc[0]
    assert parent["kind"] == "sweep" and parent["params.sweep.name"] == SWEEP_NAME


def test_filters_and_the_sweep_option_select_runs(store: Store) -> None:
    dp = load_runs("fl-runs", filter_string="params.algorithm = 'dp_fedavg'", uri=store.uri)
    good = load_runs("fl-runs", filter_string="metrics.accuracy > 0.95", uri=store.uri)
    sweep = load_runs(["fl-runs", "fl-sweep"], sweep=SWEEP_NAME, uri=store.uri)
    none = load_runs("fl-runs", filter_string="params.algorithm = 'nothing'", uri=store.uri)

    assert dp["run_id"].tolist() == [store.runs["dp_fedavg"]]
    assert good["run_id"].tolist() == [store.runs["failed"]]  # filters see failed runs too
    assert set(sweep["run_id"]) == {store.runs["sweep-local-0"], store.runs["sweep-local-1"]}
    assert len(none) == 0 and "run_id" in none.columns


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"experiments": "nope"}, "unknown MLflow experiment(s) 'nope'"),
        ({"experiments": "fl-runs", "filter_string": "metrics.accuracy >"}, "malformed filter"),
        ({"experiments": "fl-runs", "filter_string": "params.x == 'a'"}, "Invalid comparator"),
        ({"experiments": "fl-runs", "sweep": "a'b"}, "sweep name"),
        ({"experiments": []}, "at least one experiment"),
    ],
)
def test_bad_input_is_named(store: Store, kwargs: dict, needle: str) -> None:
    with pytest.raises(LoadError) as err:
        load_runs(uri=store.uri, **kwargs)

    assert needle in str(err.value)
    if kwargs["experiments"] == "nope":
        assert "fl-runs" in str(err.value)  # the known experiments are listed


def test_a_missing_store_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no MLflow store"):
        load_runs("x", uri=f"sqlite:///{tmp_path / 'typo.db'}")

    assert not (tmp_path / "typo.db").exists()


def test_parquet_round_trip_and_bad_files(store: Store, tmp_path: Path) -> None:
    df = load_runs("fl-runs", uri=store.uri)
    df.to_parquet(tmp_path / "runs.parquet", index=False)
    (tmp_path / "junk.parquet").write_text("not parquet")
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "norun.parquet")

    back = load_parquet(tmp_path / "runs.parquet")

    assert back.columns.tolist() == df.columns.tolist()
    metrics = ["run_id", "status", "accuracy", "epsilon", "bytes_up", "params.seed"]
    pd.testing.assert_frame_equal(back[metrics], df[metrics])  # inf survives Parquet
    with pytest.raises(LoadError, match="no Parquet file"):
        load_parquet(tmp_path / "missing.parquet")
    with pytest.raises(LoadError, match="cannot read"):
        load_parquet(tmp_path / "junk.parquet")
    with pytest.raises(LoadError, match="no run_id column"):
        load_parquet(tmp_path / "norun.parquet")


def test_histories_are_round_by_round_and_inf_survives(store: Store) -> None:
    ids = [store.runs["fedavg"], store.runs["dp_fedavg"]]

    h = load_histories(ids, ["round_bytes_up", "epsilon", "never_logged"], uri=store.uri)

    up = h[(h["metric"] == "round_bytes_up") & (h["run_id"] == ids[0])]
    assert up["step"].tolist() == [1, 2] and (up["value"] > 0).all()
    eps = h[h["metric"] == "epsilon"].set_index(["run_id", "step"])["value"]
    assert eps[(ids[0], 2)] == math.inf and 0 < eps[(ids[1], 2)] < math.inf
    assert not (h["metric"] == "never_logged").any()
    assert not h.duplicated(["run_id", "metric", "step"]).any()


def test_run_ids_load_and_an_unknown_id_is_named(store: Store) -> None:
    df = load_run_ids([store.runs["hyperfl"]], uri=store.uri)

    assert df["algorithm"].tolist() == ["hyperfl"]
    with pytest.raises(LoadError, match="no run 'f00'"):
        load_run_ids(["f00"], uri=store.uri)


def test_attack_grid_is_found_where_logged_and_none_elsewhere(store: Store, tmp_path: Path) -> None:
    found = attack_grid(store.runs["fedavg"], tmp_path, uri=store.uri)
    absent = attack_grid(store.runs["hyperfl"], tmp_path, uri=store.uri)

    assert found is not None and found.name == Path(ATTACK_GRID).name
    assert found.read_bytes()[:8] == PNG_MAGIC
    logged = store.root / "runs" / store.runs["fedavg"] / "attack" / "reconstructions.png"
    assert found.read_bytes() == logged.read_bytes()
    assert absent is None


def test_the_sweep_parent_gives_back_its_spec(store: Store) -> None:
    spec = sweep_spec(store.parent_run_id, uri=store.uri)

    assert spec is not None and spec["name"] == SWEEP_NAME
    assert spec["algorithms"] == ["local"] and spec["base"]["num_clients"] == 4
    assert sweep_spec(store.runs["local-s0"], uri=store.uri) is None
