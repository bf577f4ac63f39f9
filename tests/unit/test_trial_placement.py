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
