"""The spec a sweep started with, and ``--resume`` refusing settings that change results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flcore.errors import ConfigError
from sweeps.spec import SweepSpec, validate_spec
from sweeps.spec_record import (
    SpecChangedError,
    check_resume,
    read_record,
    resolved_spec,
    spec_hash,
    write_record,
)
from sweeps.sweep import SweepPaths, experiment_name, run_sweep, sweep_tracking_uri


def _raw(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return {
        "name": "s",
        "base": {"rounds": 2},
        "algorithms": ["fedavg", "local"],
        "objectives": {"accuracy": "max", "bytes_up": "min"},
        "storage": {"path": str(tmp_path / "out")},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    } | over


def _tree(spec: SweepSpec) -> dict[str, Any]:
    return resolved_spec(
        spec, tracking_uri=sweep_tracking_uri(spec), experiment=experiment_name(spec)
    )


def _started(tmp_path: Path, **over: Any) -> tuple[SweepSpec, Path]:
    """A sweep as its start leaves it: the record, and the driver's state file."""
    spec = validate_spec(_raw(tmp_path, **over))
    paths = SweepPaths(spec)
    write_record(paths.spec_record, _tree(spec), "sqlite")
    paths.state.write_text(json.dumps({"parent_run_id": "0" * 32, "trials": {}}))
    return spec, paths.spec_record


def test_every_key_that_changes_results_is_named_old_to_new(tmp_path: Path) -> None:
    spec, record = _started(tmp_path)
    changed = validate_spec(
        _raw(
            tmp_path,
            base={"rounds": 3},
            seeds=[0, 1],
            objectives={"accuracy": "max", "bytes_up": "max"},
        )
    )

    with pytest.raises(SpecChangedError) as info:
        check_resume("s", record, _tree(changed))

    assert set(info.value.changes) == {"base.rounds", "seeds", "objectives.1.direction"}
    assert info.value.changes["base.rounds"] == (2, 3)
    message = str(info.value)
    assert info.value.key == "--resume"
    assert "base.rounds: 2 -> 3" in message and "seeds: [0] -> [0, 1]" in message
    assert 'objectives.1.direction: "min" -> "max"' in message


def test_where_and_how_wide_the_sweep_runs_may_differ(tmp_path: Path) -> None:
    spec, record = _started(tmp_path)
    elsewhere = validate_spec(
        _raw(
            tmp_path,
            ray={"address": "auto", "num_cpus": 64, "num_gpus": 8},
            max_concurrent_trials=16,
            resources={"cpu": 2, "gpu": 0.25},
        )
    )

    kept = check_resume("s", record, _tree(elsewhere))

    assert kept is not None and kept.spec == _tree(spec) and kept.optuna == "sqlite"


def test_the_resolved_tracking_store_must_not_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, record = _started(tmp_path, tracking={})  # resolved from $MLFLOW_TRACKING_URI
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    # the same text, resolved differently: the sweep's runs are in the first store
    moved = validate_spec(_raw(tmp_path, tracking={}))

    with pytest.raises(SpecChangedError) as info:
        check_resume("s", record, _tree(moved))

    assert set(info.value.changes) == {"tracking.uri"}


def test_a_key_added_to_the_spec_later_is_no_change(tmp_path: Path) -> None:
    spec, record = _started(tmp_path)
    doc = json.loads(record.read_text())
    del doc["spec"]["sampler"]["population_size"]  # as recorded before the key existed
    doc["sha256"] = spec_hash(doc["spec"])
    record.write_text(json.dumps(doc))

    assert check_resume("s", record, _tree(spec)) is not None


def test_an_altered_record_is_refused(tmp_path: Path) -> None:
    spec, record = _started(tmp_path)
    doc = json.loads(record.read_text())
    doc["spec"]["base"]["rounds"] = 3  # hand-edited to match a changed --set
    record.write_text(json.dumps(doc))

    with pytest.raises(ConfigError, match="was altered after the sweep started"):
        read_record(record)


def test_a_sweep_without_a_record_resumes_with_a_warning(tmp_path: Path) -> None:
    spec = validate_spec(_raw(tmp_path))

    with pytest.warns(UserWarning, match="without checking that its settings are unchanged"):
        assert check_resume("s", SweepPaths(spec).spec_record, _tree(spec)) is None


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_run_sweep_refuses_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _started(tmp_path)
    before = _files(tmp_path)

    with pytest.raises(SpecChangedError, match="base.rounds: 2 -> 5"):
        run_sweep(validate_spec(_raw(tmp_path, base={"rounds": 5})), resume=True)

    assert _files(tmp_path) == before  # no MLflow store, no Optuna store, no Tune directory


def test_a_new_sweep_records_its_spec_and_store(tmp_path: Path) -> None:
    from sweeps.sweep import study_storage

    spec = validate_spec(_raw(tmp_path, ray={"address": "auto"}))
    paths = SweepPaths(spec)
    # what run_sweep does before Ray starts (run_sweep itself would go on to start Ray)
    write_record(paths.spec_record, _tree(spec), "journal")

    record = read_record(paths.spec_record)

    assert record is not None and record.spec == _tree(spec) and record.optuna == "journal"
    assert type(study_storage(spec, paths, None)).__name__ == "JournalStorage"


def test_a_new_sweep_refuses_a_study_of_its_name_left_in_its_store(tmp_path: Path) -> None:
    import optuna

    from sweeps.sweep import study_storage

    spec = validate_spec(_raw(tmp_path))
    paths = SweepPaths(spec)
    optuna.create_study(study_name="s", storage=study_storage(spec, paths))  # a deleted sweep's

    with pytest.raises(ConfigError, match="already holds a study 's'") as info:
        run_sweep(spec)

    assert info.value.key == "name" and not paths.spec_record.exists()
