"""``fedsweep sweep --resume`` refuses a changed spec: a real sweep, then a resume with other
settings through the console script (exit 2, the keys named, nothing written, Ray not started)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.sweep_helpers import cli, client, tiny_spec, write_spec


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_resume_with_changed_settings_exits_2_naming_them_and_writes_nothing(
    data_root: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(data_root, algorithms=["fedavg"], num_samples=1)
    spec["base"]["rounds"] = 1
    path = write_spec(tmp_path, spec)
    first = cli(["sweep", str(path), "--json"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    parent = json.loads(first.stdout)["parent_run_id"]
    record = json.loads((tmp_path / "sweeps_out" / "t.spec.json").read_text())
    assert record["spec"]["base"]["rounds"] == 1 and record["optuna"] == "sqlite"
    # the sweep's own Optuna store, not the shared optuna.db of earlier versions
    assert (tmp_path / "sweeps_out" / "t.optuna.db").is_file()
    assert not (tmp_path / "sweeps_out" / "optuna.db").exists()
    before = _files(tmp_path)

    refused = cli(
        [
            "sweep",
            str(path),
            "--resume",
            "--set",
            "base.rounds=2",
            "--set",
            "seeds=[0, 1]",
            "--set",
            "max_concurrent_trials=1",  # may differ: not named
            "--address",
            "auto",  # may differ (and would fail if Ray were reached: no cluster here)
        ],
        tmp_path,
        RAY_TMPDIR=str(tmp_path / "ray"),
    )

    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "base.rounds: 1 -> 2" in err and "seeds: [0] -> [0, 1]" in err
    assert "max_concurrent_trials:" not in err and "ray.address:" not in err
    assert _files(tmp_path) == before  # no store, state, record or MLflow row changed
    assert client(tmp_path).get_run(parent).info.status == "FINISHED"
