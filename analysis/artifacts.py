"""Artifacts of runs the analysis shows: a privacy attack's image grid, a sweep's spec.

Like :mod:`analysis.load`, this is an edge module: it reads the tracking store and hands plain
values (paths, dicts) to the pure functions.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from analysis.load import open_store

__all__ = ["ATTACK_GRID", "SWEEP_SPEC", "attack_grid", "has_artifact", "sweep_spec"]

#: the attack's image grid (originals above their reconstructions), logged by a run that ran an
#: attack
ATTACK_GRID = "attack/reconstructions.png"
#: the validated spec a sweep's parent run keeps
SWEEP_SPEC = "sweep_spec.json"


def has_artifact(client: Any, run_id: str, path: str) -> bool:
    """Whether ``run_id`` logged an artifact at ``path`` (a file, relative to the run's root)."""
    folder = path.rpartition("/")[0] or None
    return any(f.path == path and not f.is_dir for f in client.list_artifacts(run_id, folder))


def attack_grid(
    run_id: str, dst_dir: str | Path, *, client: Any | None = None, uri: str | None = None
) -> Path | None:
    """The run's attack image grid, downloaded under ``dst_dir``; ``None`` when it has none.

    Args:
        run_id: the MLflow run.
        dst_dir: where the file is copied (created if needed).
        client: an open MlflowClient (else one on ``uri``).
        uri: tracking URI, when no client is given.
    """
    client = client or open_store(uri)
    if not has_artifact(client, run_id, ATTACK_GRID):
        return None
    dst = Path(dst_dir) / run_id
    dst.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, ATTACK_GRID, dst_path=str(dst)))


def sweep_spec(
    run_id: str, *, client: Any | None = None, uri: str | None = None
) -> dict[str, Any] | None:
    """The spec a sweep's parent run holds (``sweep_spec.json``), or ``None`` without one."""
    client = client or open_store(uri)
    if not has_artifact(client, run_id, SWEEP_SPEC):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run_id, SWEEP_SPEC, dst_path=tmp)
        return json.loads(Path(local).read_text())
