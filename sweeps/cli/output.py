"""How commands end and report: errors as exit 2 with a message, ``--json`` as one JSON document
on stdout (everything else a command prints, ours or a library's, goes to stderr), strict JSON
for metrics (inf as "inf", nan as null)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from flcore.errors import FedSweepError

__all__ = [
    "deliver",
    "err_console",
    "fail",
    "jsonable",
    "jsonable_tree",
    "sigterm_as_interrupt",
    "stdout_to_stderr",
    "wide_console",
]

err_console = Console(stderr=True)
T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit ``code`` with ``message`` on stderr, on one line (not wrapped at the console's
    width: a log or a pipe gets it whole, and a terminal wraps it itself). The message is
    printed as written: brackets in it (a user's value, ``[p_min^2, 1]``) are not markup."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM (``kill``, ``timeout``, a batch scheduler's stop) ends the command
    as Ctrl-C does: a ``KeyboardInterrupt``, so a run closes its MLflow run ``KILLED`` and keeps
    its measured rounds instead of staying ``RUNNING`` forever. The handler before is restored
    on the way out; outside the main thread (no handler allowed) nothing changes."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        before = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextmanager
def stdout_to_stderr():
    """Send everything written to fd 1 (ours, libraries', child processes') to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield os.fdopen(os.dup(saved), "w")
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def deliver(as_json: bool, work: Callable[[], T], show: Callable[[T], None]) -> None:
    """Do a command's work and report it: with ``--json`` as one JSON document on stdout (all
    else the work prints, ours or a library's, goes to stderr), otherwise ``show``n for people.
    A FedSweepError ends the command with its message."""
    try:
        if as_json:
            with stdout_to_stderr() as real_stdout:
                result = work()
            real_stdout.write(json.dumps(jsonable_tree(result)) + "\n")
            real_stdout.flush()
        else:
            show(work())
    except FedSweepError as exc:
        fail(str(exc))


def jsonable(value: Any) -> Any:
    """A metric for strict JSON: +-inf (epsilon without DP) as "inf"/"-inf", nan as null."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def jsonable_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: jsonable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable_tree(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):  # numpy / pandas scalars
        with contextlib.suppress(AttributeError, ValueError):
            value = value.item()
    return jsonable(value)


def wide_console() -> Console:
    """A console for tables of run ids: the terminal's width, or 200 columns into a pipe."""
    return Console(width=None if sys.stdout.isatty() else 200)
