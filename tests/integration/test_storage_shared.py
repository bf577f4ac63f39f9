"""A storage path the cluster does not share is refused before any work, on a real two-node Ray
cluster: a head (no CPUs) and a worker started in its own mount namespace, where the sweep's
storage folder is an empty tmpfs, as on a host that does not mount the shared storage.

``fedsweep sweep --address`` exits 2 naming ``storage.path`` and the blind node; it leaves no
sweep folder, spec record, Optuna study or MLflow run, so the same name starts once the storage
is fixed. The check itself passes for a folder the worker does see. Needs root (``unshare``), as
CI has."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.ray_hosts import ray_env, start_head, start_worker, wait_for_nodes
from tests.integration.sweep_helpers import FEDSWEEP, env, free_port, tiny_spec, write_spec


@pytest.fixture
def cluster() -> Iterator[tuple[str, Path, Path, dict[str, str]]]:
    """(address, hidden folder, visible folder, env): the worker cannot see ``hidden``."""
    home = Path(tempfile.mkdtemp(prefix="fedsweep-cluster-"))
    hidden, visible, temp_dir = home / "hidden", home / "visible", home / "ray"
    for d in (hidden, visible, temp_dir):
        d.mkdir()
    port = free_port()
    head = start_head(temp_dir, port)
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        wait_for_nodes(address, ray_env(temp_dir), 1)
        nodes.append(start_worker(temp_dir, address, hide=(hidden,)))
        wait_for_nodes(address, ray_env(temp_dir), 2)
        yield address, hidden, visible, ray_env(temp_dir)
    finally:
        for node in reversed(nodes):
            node.kill()
        subprocess.run(["rm", "-rf", str(home)], check=False)


@pytest.mark.slow  # a 2-node cluster, with the fault-injection tier: `make slow` (README)
def test_a_storage_path_the_cluster_does_not_share_is_refused_before_any_work(
    cluster: tuple[str, Path, Path, dict[str, str]], data_root: Path, tmp_path: Path
) -> None:
    address, hidden, visible, ray_vars = cluster
    spec = tiny_spec(data_root, storage={"path": str(hidden / "sweeps")}, ray={})
    path = write_spec(tmp_path, spec)
    out = subprocess.run(
        [FEDSWEEP, "sweep", str(path), "--address", address],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env(**ray_vars),
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-3000:]
    said = " ".join(out.stderr.split())  # rich wraps the message
    assert "storage.path" in said and "not shared with the cluster" in said, said[-2000:]
    # nothing was started or written: no sweep, record or journal, no MLflow run
    store = hidden / "sweeps"
    assert not store.exists() or not any(store.iterdir()), list(store.iterdir())
    db = tmp_path / "mlflow.db"
    if db.exists():
        from mlflow.tracking import MlflowClient

        c = MlflowClient(tracking_uri=f"sqlite:///{db}")
        exps = c.search_experiments()
        assert not c.search_runs([e.experiment_id for e in exps])

    # a folder the worker sees passes the same check
    probe = (
        "import json, ray, sys; from pathlib import Path; "
        "from sweeps.preflight import check_storage_shared; "
        "ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(json.dumps(check_storage_shared(Path(sys.argv[2]))))"
    )
    seen = subprocess.run(
        [sys.executable, "-c", probe, address, str(visible / "sweeps")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(**ray_vars),
    )
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert len(json.loads(seen.stdout.strip().splitlines()[-1])) == 1  # the worker (head: 0 CPUs)
    assert not list((visible / "sweeps").iterdir())  # the marker is removed
