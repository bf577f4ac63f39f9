"""benchmarks/gpu_session.sh packs what it leaves in $OUT into what a device call can bring
back (at most 8 files of at most 16 MiB, no deeper than two folders): one results archive and
15 MiB pieces of stage 7's run folders, which unpack to the original files."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_session.sh"


def test_the_outputs_come_back_in_few_small_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    runs = out / "pa3dfl-t1" / "hetero-pa3dfl-r500-s0"
    runs.mkdir(parents=True)
    checkpoint = os.urandom(40 * 2**20)  # three pieces' worth, incompressible
    (runs / "checkpoint.pt").write_bytes(checkpoint)
    (runs / "metrics.jsonl").write_text('{"round": 1}\n')
    (out / "table3").mkdir()
    (out / "table3" / "ig-hyperfl-r1.json").write_text("{}")
    for i in range(9):  # more loose files than a call returns
        (out / f"stage{i}.log").write_text(f"log {i}\n")
    env = os.environ | {"OUT": str(out), "STAGES": "none"}
    subprocess.run(["bash", str(SCRIPT)], env=env, check=True, capture_output=True, timeout=120)
    back = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(back) <= 8
    assert all(p.parent == out and p.stat().st_size <= 16 * 2**20 for p in back)
    pieces = sorted(p for p in back if p.name.startswith("pa3dfl-t1.tgz."))
    assert len(pieces) == 3
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with tarfile.open(out / "results.tgz") as tar:
        tar.extractall(unpacked, filter="data")
    joined = tmp_path / "runs.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(joined) as tar:
        tar.extractall(unpacked, filter="data")
    got = unpacked / "pa3dfl-t1" / "hetero-pa3dfl-r500-s0"
    assert (got / "checkpoint.pt").read_bytes() == checkpoint
    assert (got / "metrics.jsonl").read_text() == '{"round": 1}\n'
    assert (unpacked / "table3" / "ig-hyperfl-r1.json").read_text() == "{}"
    assert (unpacked / "stage8.log").read_text() == "log 8\n"


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_side_by_side_runs_come_back_without_checkpoints(tmp_path: Path, data_root: Path) -> None:
    """Stage 12's runs (one round of FedHKD's setup, made small, on the CPU) run as their own
    processes and come back as run folders without checkpoints, with each run's JSON."""
    import json
    import sys

    out = tmp_path / "out"
    env = os.environ | {
        "OUT": str(out),
        "STAGES": "12",
        "F12_SETTINGS": "n10-b0.5",
        "F12_METHODS": "fedavg fedproto",
        # one local epoch, 500 global test images: the plumbing is under test, not the training
        "F12_EXTRA": "--rounds 1 --set local_epochs=1 --set global_test_per_class=50 --label quick",
        "SBS_DEVICE": "cpu",
        "JOBS": "2",
        "T_END": "600",
        "FEDSWEEP_DATA_ROOT": str(data_root),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    subprocess.run(["bash", str(SCRIPT)], env=env, check=True, capture_output=True, timeout=600)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with tarfile.open(out / "results.tgz") as tar:
        tar.extractall(unpacked, filter="data")
    folders = sorted((unpacked / "fedhkd").iterdir())
    assert [f.name.split("-")[2] for f in folders] == ["fedavg", "fedproto"]
    for f in folders:
        assert json.loads((f / "summary.json").read_text())["rounds"] == 1
        assert not list(f.glob("checkpoint*"))
    records = [json.loads((unpacked / f"fedhkd-{n}.json").read_text()) for n in (1, 2)]
    assert sorted(r["runs"][0]["method"] for r in records) == ["fedavg", "fedproto"]


def test_unpack_merges_only_run_folders_that_are_further_along(tmp_path: Path) -> None:
    """benchmarks/gpu_unpack.py: what gpu_session.sh packed unpacks in place, and a stage-7 run
    folder replaces the CPU queue's only when it has more rounds (and a checkpoint)."""
    import json
    import sys

    out = tmp_path / "files" / "a"

    def run_folder(root: Path, name: str, rounds: int, checkpoint: bool = True) -> None:
        d = root / name
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(
            "".join(f'{{"round": {r}}}\n' for r in range(1, rounds + 1))
        )
        if checkpoint:
            (d / "checkpoint.pt").write_bytes(os.urandom(1000))

    run_folder(out / "pa3dfl-t1", "hetero-pa3dfl-r500-s0", 160)  # ahead of the queue's
    run_folder(out / "pa3dfl-t1", "hetero-fjord-r500-s0", 35)  # behind it
    run_folder(out / "pa3dfl-t1", "ideal-fedavg-r500-s0", 12)  # new
    run_folder(out / "lodmeta", "regular-5shot-lodmeta-s1", 400, checkpoint=False)
    (out / "records" / "pa3dfl").mkdir(parents=True)  # a run that ended there left its record
    (out / "records" / "pa3dfl" / "hetero-fedavg-r500-s0.json").write_text('{"run": "x"}\n')
    env = os.environ | {"OUT": str(out), "STAGES": "none"}
    subprocess.run(["bash", str(SCRIPT)], env=env, check=True, capture_output=True, timeout=120)
    queue = tmp_path / "queue"
    run_folder(queue, "hetero-pa3dfl-r500-s0", 10)
    run_folder(queue, "hetero-fjord-r500-s0", 90)
    unpacker = SCRIPT.parent / "gpu_unpack.py"
    done = subprocess.run(
        [sys.executable, str(unpacker), str(tmp_path / "files"), "--to", str(tmp_path / "home"),
         "--merge", str(queue), "--records", str(tmp_path / "records")],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert json.loads(done.stdout)["records"] == ["pa3dfl/hetero-fedavg-r500-s0.json"]
    copied = tmp_path / "records" / "pa3dfl" / "hetero-fedavg-r500-s0.json"
    assert copied.read_text() == '{"run": "x"}\n'
    report = {r["run"]: r for r in json.loads(done.stdout)["merged"]}
    assert report["hetero-pa3dfl-r500-s0"] == {
        "run": "hetero-pa3dfl-r500-s0", "came": 160, "had": 10, "merged": True}  # fmt: skip
    assert report["hetero-fjord-r500-s0"]["merged"] is False
    assert report["ideal-fedavg-r500-s0"]["merged"] is True
    assert "regular-5shot-lodmeta-s1" not in report  # no checkpoint: it cannot resume
    lines = (queue / "hetero-pa3dfl-r500-s0" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 160
    assert len((queue / "hetero-fjord-r500-s0" / "metrics.jsonl").read_text().splitlines()) == 90
    home = tmp_path / "home" / "a"
    assert (home / "lodmeta" / "regular-5shot-lodmeta-s1" / "metrics.jsonl").is_file()
    assert (home / "pa3dfl-t1" / "ideal-fedavg-r500-s0" / "checkpoint.pt").is_file()
    bad = subprocess.run(
        [sys.executable, str(unpacker), str(tmp_path / "nothing"), "--to", str(tmp_path / "x")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "no folder" in bad.stderr
