"""Ray nodes started with ``ray start --block`` as separate processes, for the cluster tests: a
head, and workers that may run in their own mount namespace (``unshare --mount``) where some
folders are replaced by empty tmpfs mounts, so they do not see what the driver writes there, as
a host that does not mount the shared storage would not.

Every process a node starts is found (psutil, its whole tree) and killed by PID at the end;
``ray stop`` is never used (it stops every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

RAY = shutil.which("ray") or str(Path(sys.executable).parent / "ray")


def ray_env(temp_dir: Path) -> dict[str, str]:
    """Token authentication (Ray 2.60's default for a `ray start` cluster), no usage stats, and
    a temp dir of the test's own (``RAY_TMPDIR``)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return env | {
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(temp_dir),
    }


class Node:
    """One ``ray start --block`` process and everything it starts."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._tree: set[int] = {self.proc.pid}

    def remember(self) -> None:
        """Record the node's process tree now (daemons re-parent when their parent dies)."""
        try:
            root = psutil.Process(self.proc.pid)
            self._tree |= {p.pid for p in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def kill(self) -> None:
        self.remember()
        for pid in sorted(self._tree, reverse=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        self.proc.wait(timeout=30)
        self._out.close()


def private_tmpfs(folders: tuple[Path | str, ...], then: list[str]) -> list[str]:
    """``then``, run in a mount namespace of its own where each folder is an empty tmpfs (root
    only: ``unshare --mount``); nothing mounted there is seen outside."""
    mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in folders)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"{mounts} && exec {shlex.join(then)}"]  # fmt: skip


def start_head(temp_dir: Path, port: int) -> Node:
    cmd = [
        RAY,
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--num-cpus=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    return Node(cmd, ray_env(temp_dir), temp_dir.parent / "head.log")


def start_worker(
    temp_dir: Path, address: str, *, num_cpus: int = 1, hide: tuple[Path, ...] = ()
) -> Node:
    """A worker node; with ``hide``, in its own mount namespace where each of those folders is an
    empty tmpfs (root only: ``unshare --mount``)."""
    start = [RAY, "start", "--block", f"--address={address}", f"--num-cpus={num_cpus}"]
    if not hide:
        return Node(start, ray_env(temp_dir), temp_dir.parent / "worker.log")
    cmd = private_tmpfs(hide, start)
    return Node(cmd, ray_env(temp_dir), temp_dir.parent / "worker.log")


def wait_for_nodes(address: str, env: dict[str, str], count: int, timeout: float = 90) -> None:
    """Until ``count`` nodes are alive in the cluster at ``address`` (checked from a subprocess,
    so this test process never joins the cluster)."""
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            [sys.executable, "-c", probe, address],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        seen = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
        if seen.isdigit() and int(seen) >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"{count} Ray nodes did not come up at {address}: last probe {seen!r}")
