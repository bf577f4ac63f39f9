"""A trial's device and GPU share: Ray's GPU fractions become a memory cap on the trial."""

from __future__ import annotations

import pytest

from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.experiment import build_engine
from sweeps.trainable import trial_placement


def test_a_gpu_fraction_caps_the_trials_gpu_memory(tiny_config: dict) -> None:
    cfg = validate_config(tiny_config | {"workers": 3})
    packed = trial_placement(cfg, "cuda", 0.25)
    assert (packed.device, packed.workers, packed.gpu_memory_fraction) == ("cuda", 1, 0.25)
    # a whole GPU, or none, caps nothing
    assert trial_placement(cfg, "cuda", 1.0).gpu_memory_fraction is None
    assert trial_placement(cfg, "cpu", 0.0).gpu_memory_fraction is None
    # the config's own cap stays
    own = validate_config(tiny_config | {"gpu_memory_fraction": 0.1})
    assert trial_placement(own, "cuda", 0.5).gpu_memory_fraction == 0.1


def test_a_memory_cap_off_cuda_is_refused_before_any_work(tiny_config: dict) -> None:
    cfg = validate_config(tiny_config | {"gpu_memory_fraction": 0.5})
    with pytest.raises(ConfigError, match="gpu_memory_fraction: caps a CUDA device"):
        build_engine(cfg)


def test_trials_get_the_drivers_fedsweep_variables_and_plugin_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tests
    from sweeps.sweep import trial_runtime_env

    monkeypatch.setenv("FEDSWEEP_PLUGINS", "tests.plugins.faults")
    monkeypatch.setenv("FEDSWEEP_DATA_ROOT", "/data/fmnist")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://db/mlflow")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    local = trial_runtime_env(cluster=False)
    assert local["env_vars"]["FEDSWEEP_PLUGINS"] == "tests.plugins.faults"
    assert local["env_vars"]["FEDSWEEP_DATA_ROOT"] == "/data/fmnist"
    assert local["env_vars"]["MLFLOW_TRACKING_URI"] == "postgresql://db/mlflow"
    assert "UNRELATED_SECRET" not in local["env_vars"] and "py_modules" not in local
    # on a cluster the plugin's local package travels with it (an installed one does not)
    assert trial_runtime_env(cluster=True)["py_modules"] == [tests]
    monkeypatch.setenv("FEDSWEEP_PLUGINS", "json")
    assert "py_modules" not in trial_runtime_env(cluster=True)


def test_trial_threads_follow_the_variable_else_one_outside_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sweeps.trainable import trial_threads

    monkeypatch.setenv("FEDSWEEP_TORCH_THREADS", "3")
    assert trial_threads() == 3
    monkeypatch.delenv("FEDSWEEP_TORCH_THREADS")
    assert trial_threads() == 1
