"""Where long benchmark runs keep their output: outside the work tree.

A checkout can be laid anew between sessions, and a git-ignored folder inside it goes with it (a
HyperFL run lost its round-145 checkpoint that way). ``$FEDSWEEP_RUNS`` overrides the default
``~/.cache/fedsweep-runs``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["runs_dir"]


def runs_dir(*parts: str) -> Path:
    """``$FEDSWEEP_RUNS`` (default ``~/.cache/fedsweep-runs``) joined with ``parts``."""
    root = os.environ.get("FEDSWEEP_RUNS") or "~/.cache/fedsweep-runs"
    return Path(root).expanduser().joinpath(*parts)
