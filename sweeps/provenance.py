"""Where a result came from: package versions and the git commit, recorded as MLflow tags."""

from __future__ import annotations

from importlib import metadata

from analysis.provenance import git_commit

__all__ = ["provenance_tags", "git_commit"]


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
