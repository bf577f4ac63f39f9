"""Issue 24: every method of the Pa3dFL family runs as a sweep trial under a capacity setting.

Each sweep starts from the method's ready Hetero config (``sweeps/configs/pa3dfl/``) as its
``base``, shrunk with ``--set`` as a user would, draws one trial from the method's search space
on the embedded Ray with a real MLflow store, and its child run must hold what a capacity run
reports: the per-width accuracies, bytes, FLOPs and peak memory, and ``client_costs.json`` with
each client's width and bytes. (``local``'s trial is in test_sweep.py.) Slow: one Ray start a
method, about half a minute each on 2 cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.integration.sweep_helpers import ROOT, child_runs, cli, client, tiny_spec

METHODS = [
    "pa3dfl",
    "flanc",
    "fjord",
    "heterofl",
    "fedrolex",
    "tailorfl",
    "pfedgate",
    "lg_fedavg",
    "ditto",
    "fedavg",
    "pfedhn",
]
RATIOS = [1.0, 0.25, 0.25, 0.0625]  # widths 1, 1/2, 1/2, 1/4
AWARE = {"pa3dfl", "flanc", "fjord", "heterofl", "fedrolex", "tailorfl", "pfedgate", "lg_fedavg"}


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_each_method_runs_as_a_capacity_trial_from_its_ready_config(
    data_root: Path, tmp_path: Path, method: str
) -> None:
    spec = tiny_spec(  # the spec's base is the ready config's path, shrunk with --set below
        data_root,
        name=f"cap-{method}",
        base=str(ROOT / "sweeps" / "configs" / "pa3dfl" / f"fmnist_hetero_{method}.yaml"),
        algorithms=[method],
        num_samples=1,
        max_concurrent_trials=1,
        sampler={"name": "random", "seed": 2},
    )
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    sets = {
        "base.experiment": "sweep-tests",
        "base.data_root": str(data_root),
        "base.num_clients": 4,
        "base.samples_per_client": 60,
        "base.global_test_per_class": 20,
        "base.capacity": json.dumps({"name": "fixed", "ratios": RATIOS}),
        "base.client_fraction": 1.0,
        "base.rounds": 2,
        "base.local_epochs": 1,
        "base.batch_size": 20,
    }
    args = ["sweep", "sweep.yaml", "--json"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    out = cli(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = child_runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm"] == method
    m = run.data.metrics
    costs_path = client(tmp_path).download_artifacts(
        run.info.run_id, "client_costs.json", str(tmp_path)
    )
    costs = json.loads(Path(costs_path).read_text())
    assert [costs[str(i)]["capacity_width"] for i in range(4)] == [1.0, 0.5, 0.5, 0.25]
    trained = [costs[str(i)]["trained_width"] for i in range(4)]
    if method in AWARE:  # each client its own width
        assert trained == [1.0, 0.5, 0.5, 0.25]
    else:  # the largest model every client can compute
        assert trained == [0.25] * 4
    for cid in map(str, range(4)):
        assert costs[cid]["flops"] > 0 and costs[cid]["params"] > 0
        assert costs[cid]["bytes_up"] > 0 and costs[cid]["bytes_down"] > 0
    for width in ("1", "0.5", "0.25"):  # measured once per width, on every client
        assert m[f"flops_width_{width}"] > 0 and m[f"peak_memory_width_{width}"] > 0
    # accuracies per capacity cluster among the round's clients (FedAvg's space draws the
    # client fraction: a trial may see one or two clusters)
    seen = {k.rsplit("_", 1)[1] for k in m if k.startswith("accuracy_width_")}
    assert seen and seen <= {"1", "0.5", "0.25"}, sorted(m)
    assert {k.rsplit("_", 1)[1] for k in m if k.startswith("bytes_down_width_")} >= seen
    assert all(0.0 <= m[f"accuracy_width_{w}"] <= 1.0 for w in seen)
    assert m["accuracy_worst_width"] == min(m[f"accuracy_width_{w}"] for w in seen)
    assert run.data.tags["rounds_completed"] == "2"  # (a tag of every trial run)
