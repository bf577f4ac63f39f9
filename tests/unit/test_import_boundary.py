"""flcore must import, and run its registries, with ray, optuna and mlflow absent."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"ray", "optuna", "mlflow"}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None
    sys.meta_path.insert(0, Block())
    import pkgutil, importlib, flcore
    for mod in pkgutil.walk_packages(flcore.__path__, "flcore."):
        importlib.import_module(mod.name)
    from flcore.algorithms import ALGORITHMS
    from flcore.config import validate_config
    validate_config({"algorithm": "fedavg"})
    assert not BLOCKED & {m.split(".")[0] for m in sys.modules}, "a blocked module was imported"
    try:
        import mlflow  # noqa: F401
    except ImportError:
        print("BLOCKED-OK", len(ALGORITHMS))
    """
)


def test_flcore_imports_without_ray_optuna_mlflow() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "BLOCKED-OK" in out.stdout


def test_import_linter_contract_holds() -> None:
    import shutil
    from pathlib import Path

    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([exe], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "flcore never imports" in out.stdout
