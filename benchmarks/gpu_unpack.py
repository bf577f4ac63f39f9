"""Bring a device call's files home: unpack what ``benchmarks/gpu_session.sh`` packed, and hand
stage 7's run folders to the CPU queue where they are further along.

A call's files lie under its ``files_at`` folder (``/work/.device/N/``), one ``results.tgz`` per
``gpu_session.sh`` that ran (``$OUT`` or a folder under it) and stage 7's run folders as 15 MiB
pieces ``pa3dfl-t1.tgz.NN``. This unpacks every archive into ``--to`` (the same layout: a
``results.tgz`` in ``a/`` unpacks into ``TO/a/``) and, with ``--merge DIR`` (the CPU queue's
``~/.cache/fedsweep-runs/pa3dfl``), copies each unpacked run folder that has a checkpoint into
DIR when DIR has no such folder or an older one (fewer rounds in its ``metrics.jsonl``); a folder
in DIR as far along or further is kept. Folders without a checkpoint (stages 11 and 12, which
delete them) are never merged: they cannot resume. The records of runs that ended on the GPU
machine (``records/<kind>/<run>.json`` in a ``results.tgz``) are copied into ``--records``
(default: this checkout's ``benchmarks/records``, where they are committed). What it did is
printed as JSON.

    python benchmarks/gpu_unpack.py /work/.device/1 --to ~/.cache/fedsweep-runs/gpu/s28/call1 \\
        --merge ~/.cache/fedsweep-runs/pa3dfl
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any


def last_round(run: Path) -> int:
    """The last round a run folder's ``metrics.jsonl`` records (0: none)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return 0
    rounds = [int(json.loads(line)["round"]) for line in path.open() if line.strip()]
    return max(rounds, default=0)


def unpack(files_at: Path, to: Path) -> list[Path]:
    """Every ``results.tgz`` and set of ``pa3dfl-t1.tgz.NN`` pieces under ``files_at``,
    unpacked into the matching folder under ``to``; returns those folders."""
    folders = []
    for where in sorted({p.parent for p in files_at.rglob("*") if p.is_file()}):
        dest = to / where.relative_to(files_at)
        archives = []
        if (where / "results.tgz").is_file():
            archives.append((where / "results.tgz").read_bytes())
        pieces = sorted(where.glob("pa3dfl-t1.tgz.*"))
        if pieces:
            archives.append(b"".join(p.read_bytes() for p in pieces))
        if not archives:
            continue
        dest.mkdir(parents=True, exist_ok=True)
        for data in archives:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(dest, filter="data")
        folders.append(dest)
    return folders


def merge(unpacked: list[Path], into: Path) -> list[dict[str, Any]]:
    """Copy each unpacked run folder with a ``checkpoint.pt`` into ``into`` where it is further
    along than the folder of that name there; returns one record per run folder seen."""
    report = []
    into.mkdir(parents=True, exist_ok=True)
    for folder in unpacked:
        for ckpt in sorted(folder.rglob("checkpoint.pt")):
            run = ckpt.parent
            target = into / run.name
            came, had = last_round(run), last_round(target)
            merged = came > had
            if merged:
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(run, target)
            report.append({"run": run.name, "came": came, "had": had, "merged": merged})
    return report


def copy_records(unpacked: list[Path], into: Path) -> list[str]:
    """Copy every ``records/<kind>/<run>.json`` under the unpacked folders into
    ``into/<kind>/``; returns the ``<kind>/<run>.json`` names copied."""
    copied = []
    for folder in unpacked:
        for record in sorted(folder.glob("records/*/*.json")):
            dest = into / record.parent.name / record.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, dest)
            copied.append(f"{record.parent.name}/{record.name}")
    return copied


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files_at", type=Path, help="the call's files_at folder")
    ap.add_argument("--to", type=Path, required=True, help="where the archives unpack")
    ap.add_argument("--merge", type=Path, help="the CPU queue's run folders (stage 7's)")
    ap.add_argument(
        "--records",
        type=Path,
        default=Path(__file__).resolve().parent / "records",
        help="where the records of runs that ended there go (default: benchmarks/records)",
    )
    args = ap.parse_args(argv)
    if not args.files_at.is_dir():
        ap.error(f"no folder {args.files_at}")
    folders = unpack(args.files_at, args.to)
    if not folders:
        ap.error(f"no results.tgz or pa3dfl-t1.tgz.NN under {args.files_at}")
    out: dict[str, Any] = {"unpacked": [str(f) for f in folders]}
    out["records"] = copy_records(folders, args.records)
    if args.merge is not None:
        out["merged"] = merge(folders, args.merge)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
