"""A throwaway PostgreSQL cluster for the tests (Debian's ``postgresql``): ``initdb`` and
``pg_ctl`` found with ``pg_config --bindir``, run as an unprivileged user when the tests run as
root (PostgreSQL refuses root), in a fresh folder, on a free port, listening on one address;
optionally inside a network namespace (``wrap``: a command prefix such as
``ip netns exec NS``). Databases ``mlflow`` and ``optuna`` are created."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.integration.sweep_helpers import free_port

PG_USER = "fedsweep-pg"


def as_pg_user(cmd: list[str]) -> list[str]:
    """PostgreSQL's tools refuse to run as root: as root, run them as an unprivileged user."""
    if os.geteuid() != 0:
        return cmd
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
        )
    return ["runuser", "-u", PG_USER, "--", *cmd]


@contextmanager
def postgres(
    *, host: str = "127.0.0.1", port: int | None = None, wrap: Sequence[str] = ()
) -> Iterator[str]:
    """Yields ``postgresql://postgres@host:port`` (trust authentication), stopped at the end.
    Its folder is a fresh one under the system's temp dir (pytest's are private to root)."""
    bindir = Path(
        subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    home = Path(tempfile.mkdtemp(prefix="fedsweep-pg-", dir="/var/tmp"))
    if os.geteuid() == 0:
        as_pg_user(["true"])  # creates the user
        shutil.chown(home, PG_USER)
    data, port = home / "data", port or free_port()

    def run(cmd: list[str]) -> None:
        done = subprocess.run([*wrap, *as_pg_user(cmd)], capture_output=True, text=True)
        if done.returncode:
            log = (home / "log").read_text()[-2000:] if (home / "log").is_file() else ""
            raise RuntimeError(f"{cmd[0]} failed: {done.stderr[-2000:]}\n{log}")

    run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
    with (data / "pg_hba.conf").open("a") as hba:  # clients on the host's own subnet too
        hba.write("host all all samenet trust\n")
    options = f"-p {port} -k {home} -c listen_addresses={host}"
    run(
        [str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(home / "log"), "-w"]
        + ["start"]
    )
    try:
        for db in ("mlflow", "optuna"):
            run([str(bindir / "createdb"), "-h", host, "-p", str(port), "-U", "postgres", db])
        yield f"postgresql://postgres@{host}:{port}"
    finally:
        run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(home, ignore_errors=True)


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    """Until ``url`` answers 200 (``proc`` is the server: its exit fails at once)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s")
