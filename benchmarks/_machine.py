"""The machine a benchmark ran on, and the code it ran, recorded beside its figures."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """CPU count, model, the SIMD torch uses and the CPU's vector flags, platform, Python and
    torch versions, and the load average at start."""
    import torch

    cpu, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as fh:
            lines = fh.read().splitlines()
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu
        )
        first = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
        flags = sorted(f for f in first if f.startswith(("avx", "amx", "fma")))
    except OSError:
        pass
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        # the kernels torch dispatches to (a virtual machine's "AMD EPYC" names no generation,
        # and float results differ between AVX2 and AVX-512 kernels)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": flags,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_at_start": os.getloadavg(),
    }


def code_version() -> dict[str, Any]:
    """The checkout's commit and the tracked files of flcore/, sweeps/ and benchmarks/ that
    differ from it (uncommitted changes the run's code had); ``commit`` None where there is no
    git checkout (a copy of the working tree on a device machine)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "changed": []}
    changed = git("diff", "--name-only", "HEAD", "--", "flcore", "sweeps", "benchmarks") or ""
    return {"commit": commit.strip(), "changed": sorted(changed.split())}
