"""What ``fedsweep sweep`` shows while it runs: one live view in place of Ray Tune's tables.

- :class:`SweepProgress` holds what a person wants to know: trials done / running / pending /
  pruned / failed, the current front of the finished trials (one line per point), elapsed time
  and an ETA, and one line per failure with its reason. A trial's verdict is the one the search
  tells Optuna (:class:`sweeps.search.OutcomeRule` on its last result), so a trial counted as
  pruned or failed here is left out of the front exactly as it is in the final fronts.
- :class:`SweepConsole` is the Tune callback that feeds it (on the driver). Its progress is part
  of Tune's experiment state (``get_state``/``set_state``), so a resumed sweep counts the trials
  finished before the stop.
- :func:`showing` displays it for the duration of a sweep: on a terminal as a ``rich.live.Live``
  view redrawn twice a second on stderr; elsewhere (a pipe, a CI log) as one plain line per
  finished trial and the final view once at the end, since a redrawn view would fill a log with
  copies of itself.

Tune pickles its callbacks with the experiment and restores them on ``--resume``, so the
callback holds no console: it reports to the display :func:`showing` made current in this
process, if any (none with ``--json`` or ``--verbose``).

The live front is over the finished trials' last reported values (true values: ``epsilon`` inf
for a run without a formal guarantee), one seed-mean per trial as the trainable reports it; the
sweep's final front (``analysis.pareto.pareto_front`` over the MLflow runs) is what to cite.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from ray.tune import Callback
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from analysis.pareto import non_dominated_mask
from sweeps.search import OutcomeRule

__all__ = ["SweepConsole", "SweepProgress", "showing"]

_FAILURES_SHOWN = 8


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.4g}"
    return str(v)


class SweepProgress:
    """The state of one sweep as its trials report (thread-safe: the live view reads it from
    rich's refresh thread while Tune's loop writes it)."""

    def __init__(
        self,
        name: str,
        objectives: Sequence[tuple[str, str]],
        num_samples: int,
        rule: OutcomeRule,
    ) -> None:
        self.name = name
        self.objectives = tuple((n, d) for n, d in objectives)
        self.num_samples = num_samples
        self.rule = rule
        self.trials: dict[str, dict[str, Any]] = {}
        self.started = time.time()
        self.finished_here: list[float] = []  # wall times at which trials ended in this driver
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ events
    def started_trial(self, trial_id: str, algorithm: str) -> None:
        with self._lock:
            entry = self.trials.setdefault(trial_id, {"algorithm": algorithm})
            if entry.get("state") in (None, "RUNNING"):
                entry["state"] = "RUNNING"

    def result(self, trial_id: str, algorithm: str, result: Mapping[str, Any]) -> None:
        with self._lock:
            entry = self.trials.setdefault(trial_id, {"algorithm": algorithm})
            entry.setdefault("state", "RUNNING")
            entry["last"] = {
                k: result.get(k)
                for k in (*self.rule.names, "rounds_completed", "rounds_total", "diverged")
            }

    def finished(self, trial_id: str, algorithm: str, *, error: str | None = None) -> str:
        """The trial's verdict (COMPLETE, PRUNED or FAIL); returns a line describing it."""
        with self._lock:
            entry = self.trials.setdefault(trial_id, {"algorithm": algorithm})
            last = entry.get("last")
            if error is not None:
                state, reason = "FAIL", error
            else:
                outcome = self.rule.outcome(last)
                state, reason = outcome.state, outcome.reason
                if state == "PRUNED":
                    reason = f"stopped early after round {outcome.rounds_completed}"
            entry["state"], entry["reason"] = state, reason
            self.finished_here.append(time.time())
            return self._line(trial_id, entry)

    def _line(self, trial_id: str, entry: Mapping[str, Any]) -> str:
        values = entry.get("last") or {}
        shown = "  ".join(f"{n}={_value(values.get(n))}" for n, _ in self.objectives)
        text = f"{entry['state']:<8} {trial_id}  {entry['algorithm']:<12} {shown}"
        if entry.get("reason"):
            text += f"  ({entry['reason']})"
        return text

    # ------------------------------------------------------------------ views
    def counts(self) -> dict[str, int]:
        with self._lock:
            states = [e.get("state") for e in self.trials.values()]
        out = {
            "done": states.count("COMPLETE"),
            "running": states.count("RUNNING"),
            "pruned": states.count("PRUNED"),
            "failed": states.count("FAIL"),
        }
        out["pending"] = max(0, self.num_samples - len(states))
        return out

    def front(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(trial id, algorithm, values) of the non-dominated finished trials, best first on
        the first objective."""
        with self._lock:
            done = [
                (tid, e["algorithm"], dict(e.get("last") or {}))
                for tid, e in self.trials.items()
                if e.get("state") == "COMPLETE"
            ]
        if not done:
            return []
        names = [n for n, _ in self.objectives]
        values = np.array([[float(v[n]) for n in names] for _, _, v in done], dtype=float)
        mask = non_dominated_mask(values, [d for _, d in self.objectives])
        kept = [row for row, keep in zip(done, mask, strict=True) if keep]
        first, direction = self.objectives[0]
        kept.sort(key=lambda r: float(r[2][first]), reverse=direction == "max")
        return kept

    def eta(self) -> float | None:
        """Seconds left at the rate trials have ended in this driver (None before the first)."""
        c = self.counts()
        left = c["running"] + c["pending"]
        if not self.finished_here or left == 0:
            return 0.0 if left == 0 else None
        rate = len(self.finished_here) / max(1e-9, time.time() - self.started)
        return left / rate

    def render(self) -> Group:
        c = self.counts()
        elapsed = time.time() - self.started
        head = Text.assemble(
            (f"sweep {self.name}  ", "bold"),
            (f"{c['done']} done", "green"),
            f"  {c['running']} running  {c['pending']} pending  ",
            (f"{c['pruned']} pruned", "yellow"),
            "  ",
            (f"{c['failed']} failed", "red" if c["failed"] else ""),
            f"  of {self.num_samples}   elapsed {_duration(elapsed)}  ETA {_duration(self.eta())}",
        )
        table = Table(title="current front (finished trials)", title_justify="left", box=None)
        table.add_column("trial")
        table.add_column("algorithm")
        for name, direction in self.objectives:
            table.add_column(f"{name} ({direction})", justify="right")
        for tid, algorithm, values in self.front():
            table.add_row(tid, algorithm, *(_value(values.get(n)) for n, _ in self.objectives))
        parts: list[Any] = [head, table]
        with self._lock:
            failures = [
                (tid, e) for tid, e in self.trials.items() if e.get("state") in ("FAIL", "PRUNED")
            ]
        for tid, e in failures[-_FAILURES_SHOWN:]:
            colour = "red" if e["state"] == "FAIL" else "yellow"
            parts.append(Text(f"{e['state']} {tid} ({e['algorithm']}): {e['reason']}", colour))
        if len(failures) > _FAILURES_SHOWN:
            parts.append(Text(f"... and {len(failures) - _FAILURES_SHOWN} more", "dim"))
        return Group(*parts)


class _Display:
    """Where progress is shown: a live view on a terminal, plain lines elsewhere."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress: SweepProgress | None = None
        self.live: Live | None = None

    def attach(self, progress: SweepProgress) -> None:
        if self.progress is progress:
            return
        self.progress = progress
        if self.console.is_terminal and self.live is None:
            self.live = Live(
                get_renderable=progress.render,
                console=self.console,
                refresh_per_second=2,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self.live.start()

    def event(self, line: str) -> None:
        if self.live is None:
            self.console.print(line, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
        elif self.progress is not None:
            self.console.print(self.progress.render())


_current: _Display | None = None


#: what Tune prints on its own while the live view shows: its experiment banner and tables (the
#: new output engine prints them even at verbose 0; the legacy one at 0 prints nothing), each
#: failed trial's traceback (the view has its reason; MLflow its tag ``error``)
_TUNE_QUIET = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_PRINT_ALL_TRIAL_ERRORS": "0"}
#: tensorboardX (Tune's default TBX logger) warns on every inf, and epsilon is inf without DP
_QUIET_LOGGERS = ("tensorboardX.x2num",)


@contextmanager
def _tune_quiet() -> Iterator[None]:
    saved_env = {k: os.environ.get(k) for k in _TUNE_QUIET}
    saved_levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    os.environ.update(_TUNE_QUIET)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def showing(console: Console | None = None) -> Iterator[_Display]:
    """Show the sweep's progress on ``console`` (default: stderr) while the block runs, in
    place of what Tune prints itself."""
    global _current
    display = _Display(console or Console(stderr=True))
    previous, _current = _current, display
    try:
        with _tune_quiet():
            yield display
    finally:
        _current = previous
        display.close()


def _algorithm(trial: Any) -> str:
    config = getattr(trial, "config", None) or {}
    return str(config.get("algorithm", "?"))


def _error_reason(trial: Any) -> str:
    from sweeps.tune_tracking import trial_error

    lines = [ln.strip() for ln in trial_error(trial).strip().splitlines() if ln.strip()]
    return f"error: {lines[-1][:300]}" if lines else "error"


class SweepConsole(Callback):
    """Feeds a sweep's :class:`SweepProgress` from Tune's events and shows it on the current
    display (:func:`showing`), if any."""

    def __init__(self, progress: SweepProgress) -> None:
        self.progress = progress

    def get_state(self) -> dict[str, Any]:
        return {"progress": self.progress}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("progress") is not None:
            self.progress = state["progress"]
            self.progress.started = time.time()
            self.progress.finished_here = []

    def _show(self, line: str | None = None) -> None:
        if _current is None:
            return
        _current.attach(self.progress)
        if line is not None:
            _current.event(line)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.progress.started_trial(trial.trial_id, _algorithm(trial))
        self._show()

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self.progress.result(trial.trial_id, _algorithm(trial), result)
        self._show()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._show(self.progress.finished(trial.trial_id, _algorithm(trial)))

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._show(
            self.progress.finished(trial.trial_id, _algorithm(trial), error=_error_reason(trial))
        )
