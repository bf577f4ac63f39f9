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
