"""A run whose client workers cannot start fails with a clear error instead of waiting forever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
from flcore.config import validate_config
from flcore.experiment import build_engine

# no `if __name__ == "__main__":` guard: every spawned worker re-runs this file and dies
cfg = validate_config({
    "data_root": sys.argv[1], "num_clients": 2, "samples_per_client": 50,
    "test_samples_per_client": 20, "rounds": 1, "local_epochs": 1, "workers": 2,
})
build_engine(cfg).run()
print("finished")
"""


@pytest.mark.slow  # the fault-injection tier: `make slow` (README, "Tests")
def test_workers_that_die_while_starting_raise_a_clear_error(
    data_root: Path, tmp_path: Path
) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(data_root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "finished" not in proc.stdout
    assert "WorkerStartError" in proc.stderr
    assert 'if __name__ == "__main__":' in proc.stderr
