"""Plugins: modules named in ``FEDSWEEP_PLUGINS`` (comma-separated) that register their own
algorithms, search spaces, datasets or models.

A user adds an algorithm without touching this package::

    FEDSWEEP_PLUGINS=mylab.fedfoo fedsweep run foo.yaml

They are imported lazily, the first time a registry is asked for a name it does not know (or
for its list of names), in every process that asks: the CLI, Ray trial workers and the engine's
worker pool alike, since child processes inherit the environment.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["load_plugins", "ENV_VAR"]

ENV_VAR = "FEDSWEEP_PLUGINS"
_loaded: set[str] = set()


def load_plugins() -> list[str]:
    """Import every module named in ``$FEDSWEEP_PLUGINS`` not imported yet; returns them.

    Raises:
        ImportError: naming the plugin that could not be imported.
    """
    names = [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    new = [n for n in names if n not in _loaded]
    for name in new:
        _loaded.add(name)
        try:
            importlib.import_module(name)
        except ImportError as exc:
            _loaded.discard(name)
            raise ImportError(f"{ENV_VAR}: cannot import plugin {name!r}: {exc}") from exc
    return new
