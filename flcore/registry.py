"""Named registries: ``@ALGORITHMS.register("fedavg")``, ``ALGORITHMS.create("fedavg", **kw)``.

An unknown name raises :class:`UnknownNameError` (a ``ValueError``) that lists the known names,
so a typo in a config is answered with the spelling the user meant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from flcore.errors import UnknownNameError
from flcore.plugins import load_plugins

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from names to factories (classes or functions) of one kind of thing."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``; a duplicate name is an error."""

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The entry registered as ``name`` (plugins are loaded before giving up)."""
        if name not in self._entries:
            load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def create(self, name: str, /, **kwargs: Any) -> Any:
        """Call the entry registered as ``name`` with keyword arguments."""
        factory = self.get(name)
        return factory(**kwargs)  # type: ignore[operator]

    def names(self) -> list[str]:
        """Registered names (plugins included), sorted."""
        load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
