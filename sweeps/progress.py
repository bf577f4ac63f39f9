"""A rich progress bar over rounds, on stderr so ``--json`` keeps stdout clean."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from flcore.callbacks import Callback, RoundResult, RunInfo

__all__ = ["ProgressCallback"]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class ProgressCallback(Callback):
    """Shows rounds done, time left and the latest accuracy."""

    def __init__(self, console: Console | None = None, enabled: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None
        self._acc = "-"
        self._rounds = 0

    def on_run_start(self, info: RunInfo) -> None:
        self._rounds = info.rounds
        if not self.enabled or not self.console.is_terminal:
            return  # a log file gets one line per evaluated round instead (on_round_end)
        self._progress = Progress(
            TextColumn(f"[bold]{info.algorithm}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rounds  acc {task.fields[acc]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "rounds", total=info.rounds, completed=info.start_round - 1, acc=self._acc
        )

    def on_round_end(self, result: RoundResult) -> None:
        acc = result.metrics.get("accuracy")
        if acc is not None:
            self._acc = f"{acc:.4f}"
        if self._progress is None:
            if self.enabled and result.evaluated:
                m = result.metrics
                self.console.print(
                    f"round {result.round}/{self._rounds}  accuracy {self._acc}  "
                    f"accuracy_before {_fmt(m.get('accuracy_before'))}  "
                    f"global_accuracy {_fmt(m.get('global_accuracy'))}  "
                    f"round_seconds {_fmt(m.get('round_seconds'), 2)}",
                    highlight=False,
                )
            return
        self._progress.update(self._task, advance=1, acc=self._acc)

    def on_stage(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False)

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
