"""The space registry and the naming rule shared by every space file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flcore.registry import Registry

__all__ = ["SPACES", "param_name", "overrides_for"]

#: algorithm name -> ``space(trial, algorithm)``
SPACES: Registry[Callable[[Any, str], None]] = Registry("search space")


def param_name(algorithm: str, key: str) -> str:
    """The Optuna parameter name of config key ``key`` in ``algorithm``'s space."""
    return f"{algorithm}:{key}"


def overrides_for(algorithm: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Config overrides (dotted keys) from a trial's parameters for ``algorithm``."""
    prefix = f"{algorithm}:"
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}
