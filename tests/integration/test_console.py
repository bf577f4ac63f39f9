"""What ``fedsweep sweep`` shows a person, in a real terminal: tmux runs the sweep in a pty and the
test reads the screen (``tmux capture-pane``). The live view replaces Ray Tune's tables: the
counts, the current front one line per point, elapsed time and ETA, a line per failure with its
reason; the printed front follows it."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tests.integration.sweep_helpers import FEDSWEEP, env, tiny_spec, write_spec

TMUX = shutil.which("tmux") or "tmux"


def _in_tmux(cmd: list[str], cwd: Path, extra: dict[str, str], timeout: float = 300) -> str:
    """Run ``cmd`` in a detached tmux session (a real pty, 150 x 60, on a tmux server of its own)
    until it exits; returns the screen and its scrollback."""
    # the server's socket in a folder of the test's own: `kill-server` leaves its socket behind
    # (tmux 3.3a), and under `-L` that is /tmp/tmux-<uid>/<name>, one file per test run
    sockets = Path(tempfile.mkdtemp(prefix="fedsweep-tmux-"))
    marker = cwd / "exit-code"
    script = (
        f"cd {shlex.quote(str(cwd))} && {shlex.join(cmd)}; "
        f"echo $? > {shlex.quote(str(marker))}; sleep 600"
    )
    tmux = [TMUX, "-S", str(sockets / "server")]
    try:
        # a new tmux server: its sessions get the environment it was started with
        subprocess.run(
            [*tmux, "new-session", "-d", "-x", "150", "-y", "60", "bash", "-c", script],
            check=True,
            # the pane's size, not the caller's COLUMNS/LINES (which rich would read instead)
            env={k: v for k, v in env(**extra).items() if k not in ("COLUMNS", "LINES")}
            | {"TERM": "xterm-256color"},
        )
        deadline = time.monotonic() + timeout
        while not marker.is_file() and time.monotonic() < deadline:
            time.sleep(1)
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-J", "-S", "-2000"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert marker.is_file(), f"the sweep did not end in {timeout} s:\n{screen}"
        assert marker.read_text().strip() == "0", screen
        return screen
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
        shutil.rmtree(sockets, ignore_errors=True)


def test_the_live_view_replaces_tunes_tables_in_a_real_terminal(
    data_root: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        data_root,
        algorithms=["fedavg_steady", "fedavg_raises"],
        objectives=[
            {"name": "accuracy", "direction": "max"},
            {"name": "bytes_up", "direction": "min"},
        ],
        num_samples=3,
        max_failures=0,
        sampler={"name": "random", "seed": 20},
    )
    screen = _in_tmux(
        [FEDSWEEP, "sweep", str(write_spec(tmp_path, spec))],
        tmp_path,
        {"FEDSWEEP_PLUGINS": "tests.plugins.faults"},
    )
    # Tune's own progress tables are gone (its reporter prints these headings)
    assert "Trial status" not in screen and "Current time:" not in screen, screen
    # the last frame of the live view
    assert "sweep t" in screen and "of 3" in screen, screen
    lines = screen.splitlines()
    header = [ln for ln in lines if ln.startswith("sweep t ")][-1]
    done = int(header.split(" done")[0].split()[-1])
    failed = int(header.split(" failed")[0].split()[-1])
    assert done + failed == 3 and failed >= 1 and done >= 1, header
    assert "0 running  0 pending" in header and "ETA 0:00" in header, header
    assert "current front (finished trials)" in screen
    assert any("fedavg_steady" in ln and "accuracy" not in ln for ln in lines), screen
    # each failure has its line with the reason (the error's last line)
    fails = {ln.split(":")[0] for ln in lines if ln.startswith("FAIL ") and "fedavg_raises" in ln}
    assert len(fails) == failed, screen
    assert all(
        "injected failure" in ln for ln in lines if ln.startswith("FAIL ") and "raises" in ln
    ), screen
