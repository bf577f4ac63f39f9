"""benchmarks/gpu_session.sh packs what it leaves in $OUT into what a device call can bring
back (at most 8 files of at most 16 MiB, no deeper than two folders): one results archive and
15 MiB pieces of stage 7's run folders, which unpack to the original files."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

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


def test_side_by_side_runs_come_back_without_checkpoints(tmp_path: Path, data_root: Path) -> None:
    """Stage 12's runs (here one FedAvg round of FedHKD's setup, on the CPU) run as their own
    processes and come back as run folders without checkpoints, with each run's JSON."""
    import json
    import sys

    out = tmp_path / "out"
    env = os.environ | {
        "OUT": str(out),
        "STAGES": "12",
        "F12_SETTINGS": "n10-b0.5",
        "F12_METHODS": "fedavg fedproto",
        "F12_EXTRA": "--rounds 1",
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
