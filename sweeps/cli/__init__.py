"""The ``fedsweep`` command line (Typer + rich).

One module per group of commands (``run``, ``sweep``, ``analysis``, ``servers``, ``privacy``),
each thin: it reads its options (``inputs``: bad input exits 2 before any work), calls the work
in ``sweeps``/``analysis``/``flcore``, and shows the result (``render``: every rich table in one
place; ``output``: errors, ``--json`` and stdout/stderr plumbing).
"""

from __future__ import annotations

import os

# Importing a command module registers its commands, in the order `fedsweep --help` lists them.
# isort: off
from sweeps.cli import run  # noqa: F401
from sweeps.cli import sweep  # noqa: F401
from sweeps.cli import analysis  # noqa: F401
from sweeps.cli import servers  # noqa: F401
from sweeps.cli import privacy  # noqa: F401

# isort: on
from sweeps.cli._app import app
from sweeps.cli.output import jsonable

__all__ = ["app", "jsonable", "main"]


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    app()
