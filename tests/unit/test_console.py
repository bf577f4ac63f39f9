"""The sweep's live view, fed as Tune's callback feeds it: verdicts as the search tells them, the
front of the finished trials (inf epsilon kept), counts, ETA, and the plain-line form a
non-terminal gets. (The view in a real terminal: tests/integration/test_console.py.)"""

from __future__ import annotations

import io
import math

from rich.console import Console

from sweeps.console import SweepProgress, showing
from sweeps.search import OutcomeRule

RULE = OutcomeRule((("accuracy", "max"), ("epsilon", "min")), {"accuracy": None, "epsilon": 40.0})


def _progress() -> SweepProgress:
    return SweepProgress("s", RULE.objectives, 6, RULE)


def _finish(p: SweepProgress, tid: str, algorithm: str, **result: object) -> str:
    p.started_trial(tid, algorithm)
    p.result(tid, algorithm, {"rounds_completed": 5, "rounds_total": 5, **result})
    return p.finished(tid, algorithm)


def test_verdicts_counts_and_front() -> None:
    p = _progress()
    _finish(p, "a", "fedavg", accuracy=0.80, epsilon=math.inf)
    _finish(p, "b", "dp_fedavg", accuracy=0.60, epsilon=2.0)
    _finish(p, "c", "dp_fedavg", accuracy=0.55, epsilon=3.0)  # dominated by b
    pruned = _finish(p, "d", "fedavg", accuracy=0.9, epsilon=1.0, rounds_completed=2)
    failed = _finish(p, "e", "fedavg", accuracy=math.nan, epsilon=1.0)
    p.started_trial("f", "fedavg")
    assert p.counts() == {"done": 3, "running": 1, "pruned": 1, "failed": 1, "pending": 0}
    # the pruned trial's better values never reach the front; inf stays inf
    front = p.front()
    assert [(t, v["epsilon"]) for t, _, v in front] == [("a", math.inf), ("b", 2.0)]
    assert "PRUNED" in pruned and "stopped early after round 2" in pruned
    assert "FAIL" in failed and "objective not measured: accuracy" in failed


def test_errors_carry_their_reason_and_the_eta_follows_the_rate() -> None:
    p = _progress()
    assert p.eta() is None  # nothing finished yet
    p.started_trial("x", "fedavg_raises")
    line = p.finished("x", "fedavg_raises", error="error: RuntimeError: boom")
    assert line.startswith("FAIL") and "RuntimeError: boom" in line
    eta = p.eta()
    assert eta is not None and eta > 0  # five left at the rate of one so far


def test_the_view_renders_every_part() -> None:
    p = _progress()
    _finish(p, "a", "fedavg", accuracy=0.8, epsilon=math.inf)
    p.started_trial("z", "fedavg_raises")
    p.finished("z", "fedavg_raises", error="error: RuntimeError: boom")
    out = Console(record=True, width=120, file=io.StringIO())
    out.print(p.render())
    text = out.export_text()
    assert "sweep s  1 done  0 running  4 pending  0 pruned  1 failed  of 6" in text
    assert "current front (finished trials)" in text
    assert "epsilon (min)" in text and "inf" in text.split("current front")[1]
    assert "FAIL z (fedavg_raises): error: RuntimeError: boom" in text


def test_a_non_terminal_gets_plain_lines_and_the_final_view() -> None:
    from sweeps.console import SweepConsole

    buffer = io.StringIO()
    target = Console(file=buffer, width=120, force_terminal=False)
    p = _progress()
    cb = SweepConsole(p)
    with showing(target):
        p.started_trial("a", "fedavg")
        p.result(
            "a",
            "fedavg",
            {"accuracy": 0.8, "epsilon": 1.5, "rounds_completed": 5, "rounds_total": 5},
        )
        cb._show(p.finished("a", "fedavg"))
    text = buffer.getvalue()
    assert text.count("COMPLETE a  fedavg") == 1  # one line per finished trial
    assert "accuracy=0.8  epsilon=1.5" in text
    # the final view once, at the end, after the lines
    assert "current front (finished trials)" in text.split("COMPLETE a")[1]
    assert "Live" not in text and "\x1b[" not in text  # no redrawing on a non-terminal
