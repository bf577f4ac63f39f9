"""The meta-learning family through `fedsweep run` and `fedsweep sweep` (issue 26): a noised
LoDMeta walk end to end on real FMNIST few-shot clients into a real sqlite MLflow store, walks
as Ray Tune trials over the meta search space, and the bad input the issue names refused with
exit 2 before anything is written."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.sweep_helpers import child_runs, cli, cli_in_process, tiny_spec, write_spec
from tests.unit.algorithms.test_meta import _raw


def _walk(data_root: Path, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """The meta family's tiny LoDMeta walk (tests/unit/algorithms/test_meta.py: 6 clients on a
    3-regular graph, 5-way 2-shot), CONV4 of width 8, one inner step, into ``tmp_path``."""
    return (
        _raw(
            data_root,
            experiment="tests-meta",
            model_params={"hidden": 8},
            output_dir=str(tmp_path / "runs"),
            algorithm_params={"inner_steps": 1, "inner_lr": 0.1},
        )
        | extra
    )


def test_a_noised_walk_runs_end_to_end_at_the_default_clip(data_root: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "walk.yaml"
    privacy = {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 1e-5}  # no clip
    cfg.write_text(yaml.safe_dump(_walk(data_root, tmp_path, privacy=privacy)))
    out = cli_in_process(["run", str(cfg), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["rounds"] == 4 and doc["comm_units"] == 4.0  # one unit a hop: w alone
    assert 0 <= doc["accuracy"] <= 1 and 0 <= doc["unseen_accuracy"] <= 1
    assert doc["dp_guarantee"] == "client-ldp" and doc["dp_relation"] == "replace-one"
    assert 0 < doc["epsilon"] < doc["epsilon_paper"] < float("inf")

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(doc["run_id"])
    assert run.info.status == "FINISHED"
    # the measured default M (flcore.config.PERTURBATION_CLIP), not DP-SGD's 0.04
    assert run.data.params["privacy.clip"] == "0.6"
    assert run.data.tags["dp_guarantee"] == "client-ldp"
    assert 0 < run.data.metrics["graph_sigma2"] < 1
    assert run.data.metrics["epsilon"] == pytest.approx(doc["epsilon"])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        # 2-regular on 6 clients, drawn with seed 0: cycles that do not meet (the draw the run
        # would make; seed 1's is one 6-cycle)
        ({"graph": {"name": "regular", "degree": 2}, "seed": 0}, "disconnected"),
        (
            {"fewshot": {"n_way": 5, "k_shot": 5000, "query": 4, "test_query": 4}},
            "too few records",
        ),
        ({"privacy": {"mechanism": "perturbation", "release_epsilon": 0.0}}, "release_epsilon"),
        ({"privacy": {"mechanism": "perturbation", "release_epsilon": -1}}, "release_epsilon"),
        (
            {"privacy": {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 0.5}},
            "delta in (0, 1/2)",
        ),
        ({"privacy": {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 0}}, "delta"),
        ({"privacy": {"mechanism": "perturbation", "noise_multiplier": 1, "clip": 0}}, "clip"),
        ({"privacy": {"mechanism": "perturbation", "noise_multiplier": 1, "clip": -1}}, "clip"),
        ({"client_fraction": 0.5}, "client_fraction"),
        ({"full_last_round": True}, "full_last_round"),
    ],
)
def test_bad_walk_input_exits_2_and_writes_nothing(
    data_root: Path, tmp_path: Path, change: dict[str, Any], needle: str
) -> None:
    cfg = tmp_path / "walk.yaml"
    cfg.write_text(yaml.safe_dump(_walk(data_root, tmp_path, **change)))
    out = cli_in_process(["run", str(cfg), "--json"], tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert needle in out.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_a_weak_delta_warns_before_any_work(data_root: Path, tmp_path: Path) -> None:
    """The paper's delta 0.1 against 30 records a client trains on (5-way, 2 support and 4
    query a class): a warning before the MLflow run exists, and the run stands at epsilon
    inf."""
    cfg = tmp_path / "walk.yaml"
    privacy = {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 0.1}
    cfg.write_text(yaml.safe_dump(_walk(data_root, tmp_path, privacy=privacy, rounds=2)))
    seen: list[tuple[str, bool]] = []

    def show(message: Any, *args: Any, **kwargs: Any) -> None:
        seen.append((str(message), (tmp_path / "mlflow.db").exists()))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        out = cli_in_process(["run", str(cfg), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    weak = [store for text, store in seen if "weak-delta" in text and "1/30" in text]
    assert weak == [False]  # once, and before the store was written
    doc = json.loads(out.stdout)
    assert doc["dp_guarantee"] == "weak-delta" and doc["epsilon"] == "inf"  # JSON has no inf


def test_walks_are_sweep_trials_over_the_meta_search_space(data_root: Path, tmp_path: Path) -> None:
    """`fedsweep sweep` of LoDMeta and LoDMeta(basic) (search_spaces/meta.py: eta, alpha, K,
    the graph, the per-release epsilon, delta and M): each trial a finished MLflow child run
    with its sampled knobs, its local-DP epsilon and the walk's communication."""
    spec = tiny_spec(
        data_root,
        algorithms=["lodmeta", "lodmeta_basic"],
        objectives={"accuracy": "max", "epsilon": "min"},
        max_concurrent_trials=1,
        sampler={"name": "random", "seed": 0},
    )
    walk = _walk(data_root, tmp_path)
    spec["base"] = {
        k: walk[k]
        for k in ("dataset", "data_root", "model", "model_params", "num_clients", "rounds")
        + ("eval_every", "fewshot", "graph", "algorithm_params")
    } | {"experiment": "sweep-tests", "algorithm": "lodmeta"}
    out = cli(["sweep", str(write_spec(tmp_path, spec)), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert [t["status"] for t in doc["trials"]] == ["FINISHED", "FINISHED"]
    runs = child_runs(tmp_path)
    assert len(runs) == 2
    for run in runs:
        params, metrics = run.data.params, run.data.metrics
        assert params["algorithm"] in {"lodmeta", "lodmeta_basic"}
        assert params["privacy.mechanism"] == "perturbation"
        assert 0.3 <= float(params["privacy.release_epsilon"]) <= 0.95
        assert 0.05 <= float(params["privacy.clip"]) <= 5.0
        assert params["graph.name"] in {"regular", "watts_strogatz"}
        assert run.data.tags["dp_guarantee"] == "client-ldp"
        assert 0 < metrics["epsilon"] < metrics["epsilon_paper"]
        units = 4.0 * (3 if params["algorithm"] == "lodmeta_basic" else 1)
        assert metrics["comm_units"] == units
    # the HTML report of that store draws the walks' accuracy against the communication units
    # (the paper's Figures 1-4), from the runs' MLflow histories
    report = cli_in_process(["report", "-e", "sweep-tests", "--out", "report.html"], tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    html = (tmp_path / "report.html").read_text()
    assert '<img id="comm-png"' in html and 'src="data:image/png;base64,' in html
