from __future__ import annotations

import pytest

from flcore.errors import UnknownNameError
from flcore.registry import Registry


def test_register_create_and_names() -> None:
    reg: Registry = Registry("widget")

    @reg.register("b")
    def make_b(x: int = 1) -> tuple[str, int]:
        return ("b", x)

    reg.register("a")(lambda: "a")
    assert reg.names() == ["a", "b"]
    assert reg.create("b", x=5) == ("b", 5)
    assert "a" in reg and "c" not in reg
    assert len(reg) == 2


def test_unknown_name_lists_known_names() -> None:
    reg: Registry = Registry("widget")
    reg.register("alpha")(object)
    reg.register("beta")(object)
    with pytest.raises(ValueError, match=r"unknown widget 'gamma'; known widgets: alpha, beta"):
        reg.get("gamma")
    with pytest.raises(UnknownNameError):
        reg.create("gamma")


def test_duplicate_registration_is_an_error() -> None:
    reg: Registry = Registry("widget")
    reg.register("a")(object)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(object)


def test_builtin_algorithms_registered() -> None:
    from flcore.algorithms import ALGORITHMS

    assert {"fedavg", "local"} <= set(ALGORITHMS.names())
    with pytest.raises(ValueError, match="known algorithms: .*fedavg"):
        ALGORITHMS.get("fedavgg")
