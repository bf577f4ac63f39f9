"""`fedsweep --help` and every command's own help read as prose on an 80-column terminal: each
command's summary (its docstring's first paragraph, the line the command list shows) is one
sentence on one line, and a help paragraph's source line breaks are not kept (they broke
sentences mid-line where the terminal is narrower than the source)."""

from __future__ import annotations

import inspect
import re

import click
import pytest
import typer.main
from typer.testing import CliRunner

from sweeps.cli import app


def _commands() -> list[tuple[list[str], click.Command]]:
    found: list[tuple[list[str], click.Command]] = []

    def walk(command: click.Command, path: list[str]) -> None:
        found.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = _commands()


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "fedsweep" for p, _ in COMMANDS]
)
def test_a_commands_summary_is_one_line_of_plain_text(
    path: list[str], command: click.Command
) -> None:
    summary = inspect.cleandoc(command.help or "").split("\n\n")[0]
    assert summary, f"{path}: no help"
    assert "\n" not in summary, f"{path}: its summary spans lines: {summary!r}"
    assert "``" not in (command.help or ""), f"{path}: reST markup shows as-is: {command.help!r}"


@pytest.mark.parametrize("path", [["pareto"], ["attack"], ["privacy", "epsilon"]])
def test_help_paragraphs_wrap_to_the_terminal_not_to_the_source(path: list[str]) -> None:
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"}).output
    head = out.split("╭")[0]  # the usage line and the docstring, before the option panels
    paragraphs = [p.splitlines() for p in re.split(r"\n\s*\n", head) if p.strip()]
    assert len(paragraphs) >= 3, out  # usage, summary, at least one paragraph of detail
    for lines in paragraphs[1:]:
        cut = [line.strip() for line in lines[:-1] if len(line.strip()) < 60]
        assert not cut, f"{path}: a paragraph's line cut short where the source broke: {cut}"
