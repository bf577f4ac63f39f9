"""Hosts for the multi-host test, made of Linux namespaces on one machine (root only).

A host is a network namespace (``ip netns``) joined to one bridge by a veth pair, with an address
that exists only inside the namespaces (10.203.7.0/24), and a mount namespace of its own
(``unshare --mount``) where /tmp and /dev/shm are private tmpfs mounts, so Ray's session folders
and shared memory are the host's own. Each host has an anchor process holding both namespaces;
every process of the host runs inside them (``nsenter``), so a host's processes are exactly
``ip netns pids`` of its namespace, which is how :meth:`Hosts.kill` takes a host down. Folders
outside /tmp (the storage every host "mounts", the data, the virtual environment) are the
machine's, seen by every host, as an NFS mount would be. Traffic stays on the bridge, which has
no address: nothing outside the namespaces can reach them, and they reach nothing outside.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path

from tests.integration.ray_hosts import private_tmpfs

SUBNET = "10.203.7"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts:
    """Hosts ``names`` (addresses ``SUBNET.1``, ``.2``, ... in that order); a context manager
    that builds them and tears every part down, its processes killed by PID."""

    def __init__(self, names: list[str]) -> None:
        tag = uuid.uuid4().hex[:4]
        self.bridge = f"fsb{tag}"
        self.netns = {name: f"fs{tag}{name}" for name in names}
        self.ip = {name: f"{SUBNET}.{i + 1}" for i, name in enumerate(names)}
        self._veth = {name: f"fv{tag}{i}" for i, name in enumerate(names)}
        self._anchor: dict[str, subprocess.Popen] = {}
        self._made: list[tuple[str, ...]] = []

    def __enter__(self) -> Hosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", "del", self.bridge))
            _ip("link", "set", self.bridge, "up")
            for name, ns in self.netns.items():
                veth = self._veth[name]
                _ip("netns", "add", ns)
                self._made.append(("netns", "del", ns))
                _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
                _ip("link", "set", f"{veth}p", "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", f"{veth}p")
                _ip("-n", ns, "link", "set", f"{veth}p", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                # a default route onto the bridge (which leads nowhere): programs that find
                # their own address by routing towards the internet (Ray) find this one
                _ip("-n", ns, "route", "add", "default", "dev", f"{veth}p")
                anchor = private_tmpfs(("/tmp", "/dev/shm"), ["sleep", "infinity"])
                self._anchor[name] = subprocess.Popen(["ip", "netns", "exec", ns, *anchor])
            for name in self.netns:
                self._wait_anchor(name)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_anchor(self, name: str) -> None:
        """Until the anchor has mounted its private /tmp (it then execs ``sleep``)."""
        proc = self._anchor[name]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"host {name}: its namespaces could not be made")
            try:
                if Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"host {name} did not come up")

    def run_on(self, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` as a process of host ``name`` (its network and mount namespaces)."""
        pid = str(self._anchor[name].pid)
        return ["nsenter", "--target", pid, "--net", "--mount", "--", *cmd]

    def pids(self, name: str) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.netns[name]], capture_output=True, text=True
        ).stdout
        return [int(p) for p in out.split()]

    def kill(self, name: str) -> int:
        """SIGKILL every process of host ``name`` (its anchor too); returns how many."""
        pids = self.pids(name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._anchor[name].wait(timeout=10)
        return len(pids)

    def __exit__(self, *exc: object) -> None:
        for name in self.netns:
            with contextlib.suppress(Exception):
                for _ in range(3):  # processes forked while the first pass killed
                    if not self.kill(name):
                        break
        for cmd in reversed(self._made):
            subprocess.run(["ip", *cmd], capture_output=True)
        self._made.clear()
