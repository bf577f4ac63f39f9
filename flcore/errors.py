"""The small exception hierarchy of flcore. Every user-facing error is a ``FedSweepError``."""

from __future__ import annotations

__all__ = ["FedSweepError", "ConfigError", "UnknownNameError", "DataNotFoundError"]


class FedSweepError(Exception):
    """Base class of the errors FedSweep raises on purpose."""


class ConfigError(FedSweepError, ValueError):
    """A configuration value is missing, of the wrong type or out of range.

    ``key`` is the dotted path of the offending key (``optimizer.momentum``).
    """

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


class UnknownNameError(FedSweepError, ValueError):
    """A name that no registry entry carries."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known) or '(none)'}")


class DataNotFoundError(FedSweepError, FileNotFoundError):
    """A dataset could be found neither locally nor by download."""
