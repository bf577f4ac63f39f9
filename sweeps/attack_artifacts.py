"""What a privacy evaluation leaves in MLflow besides its metrics: the image grid (originals
above reconstructions, artifact ``attack/reconstructions.png``) and its reasons and label
source as tags."""

from __future__ import annotations

import base64
import math
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ATTACK_GRID_DIR", "attack_tags", "evaluator", "grid_png", "grid_png_base64"]

ATTACK_GRID_DIR = "attack"
_GRID_NAME = "reconstructions.png"


def evaluator(engine: Any) -> Any:
    """The engine's privacy-evaluation probe, or None."""
    from flcore.attacks.evaluation import LeakageEvaluator

    return next((p for p in engine.probes if isinstance(p, LeakageEvaluator)), None)


def grid_png(engine: Any, folder: str | Path) -> Path | None:
    """Render the evaluation's grid to ``folder/reconstructions.png`` (None: nothing attacked)."""
    ev = evaluator(engine)
    grid = ev.grid_tensors() if ev is not None else None
    if grid is None:
        return None
    from analysis.plots import plot_attack_grid
    from flcore.attacks.metrics import psnr

    orig, rec = grid
    captions = [f"{v:.1f} dB" if math.isfinite(v) else "exact" for v in psnr(rec, orig).tolist()]
    s = ev.settings
    title = (
        f"{s.name} on {engine.algorithm.name}: originals (top), reconstructions (bottom), "
        f"{ev.label_source or 'given'} labels"
    )
    return plot_attack_grid(
        orig.numpy(), rec.numpy(), Path(folder) / _GRID_NAME, title=title, captions=captions
    )


def grid_png_base64(engine: Any) -> str | None:
    """The grid PNG as base64 text (for a Tune result), or None."""
    with tempfile.TemporaryDirectory() as tmp:
        path = grid_png(engine, tmp)
        return base64.b64encode(path.read_bytes()).decode() if path is not None else None


def attack_tags(summary: dict[str, Any], engine: Any) -> dict[str, str]:
    """Tags of a run that ran a privacy evaluation: the attack, label source and reasons."""
    ev = evaluator(engine)
    if ev is None:
        return {}
    tags = {"attack": ev.settings.name, "attack.labels": ev.label_source or "none"}
    for key in ("leak_reason", "leak_lpips_reason", "leak_identified_by"):
        if summary.get(key):
            tags[key] = str(summary[key])[:5000]
    return tags
