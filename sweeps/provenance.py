"""Where a result came from: package versions and the git commit, recorded as MLflow tags."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["provenance_tags", "git_commit"]


def git_commit(cwd: str | Path | None = None) -> str:
    """The commit of the source tree this package runs from, with '-dirty' if it has changes."""
    here = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def provenance_tags(dataset_checksum: str | None = None) -> dict[str, str]:
    """Tags for a run: fedsweep/torch versions, git commit, dataset checksum."""
    import torch

    tags = {
        "fedsweep.version": _version("fedsweep"),
        "fedsweep.git_commit": git_commit(),
        "torch.version": torch.__version__,
    }
    if dataset_checksum:
        tags["dataset.sha256"] = dataset_checksum
    return tags
