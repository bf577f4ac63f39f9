"""One FL experiment as a Ray Tune class trainable: a step is ``rounds_per_step`` rounds.

A trial is one sampled configuration; it runs once per seed of the spec, the seeds in lockstep,
and reports the mean over seeds of every metric (with ``<metric>_std`` beside it when there are
several seeds), so the objectives Optuna sees are per-configuration means.

Every report carries the latest value of every metric: accuracy measured only every
``eval_every`` rounds is carried forward, and a metric an algorithm cannot report takes the
spec's ``missing`` value (Ray checks for the metric in every report, and multi-objective Optuna
reads only a trial's last one). A checkpoint holds every seed's whole engine state.
"""

from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray import tune

from flcore.algorithms.base import Algorithm
from flcore.config import ExperimentConfig, apply_overrides, validate_config
from flcore.engine import Engine
from flcore.experiment import build_data, build_engine
from search_spaces import overrides_for

__all__ = ["FLTrainable", "trial_experiment_config", "REPORTED"]

#: metrics every report carries (plus objectives' ``missing`` fill-ins and ``*_std``): whatever
#: any algorithm may report, and the engine's per-round traffic and time
REPORTED = Algorithm.reports | {"round_bytes_up", "round_bytes_down", "round_seconds"}


def trial_experiment_config(config: dict[str, Any], base: ExperimentConfig) -> ExperimentConfig:
    """The experiment a trial's sampled parameters describe (base + overrides, validated)."""
    algorithm = config["algorithm"]
    raw = base.model_dump(mode="json") | {"algorithm": algorithm}
    return validate_config(apply_overrides(raw, overrides_for(algorithm, config)))


def _process_age() -> float:
    """Seconds since this process started (Linux /proc), NaN where that is unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5): starttime, in clock ticks
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return time.time() - (boot + start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return math.nan


class FLTrainable(tune.Trainable):
    """Runs one configuration for every seed; ``setup`` gets the spec pieces through
    ``tune.with_parameters``."""

    def setup(
        self,
        config: dict[str, Any],
        *,
        base: dict[str, Any],
        seeds: list[int],
        rounds_per_step: int,
        missing: dict[str, float],
        device: str = "cpu",
    ) -> None:
        torch.set_num_threads(max(1, int(os.environ.get("FEDSWEEP_TORCH_THREADS", "1"))))
        self.base = ExperimentConfig.model_validate(base)
        self.seeds = list(seeds)
        self.rounds_per_step = rounds_per_step
        self.missing = dict(missing)
        self.exp_config = trial_experiment_config(config, self.base).model_copy(
            update={"workers": 1, "device": device}
        )
        self.engines: list[Engine] = []
        for seed in self.seeds:
            cfg = self.exp_config.model_copy(update={"seed": seed})
            self.engines.append(build_engine(cfg, data=build_data(cfg)))
        self._latest: list[dict[str, float | None]] = [{} for _ in self.seeds]
        # From process start (interpreter, imports, data, engines) to ready: the per-trial cost.
        self._startup_s = _process_age()

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        return False  # a new configuration needs new engines; Ray then builds a new actor

    def step(self) -> dict[str, Any]:
        diverged = False
        for i, engine in enumerate(self.engines):
            rounds = engine.iter_rounds()
            for _ in range(self.rounds_per_step):
                if engine.round >= engine.rounds:
                    break
                result = next(rounds)
                for key, value in result.metrics.items():
                    if value is not None:
                        self._latest[i][key] = value
                loss = result.metrics.get("train_loss")
                if loss is not None and not math.isfinite(loss):
                    diverged = True
                    break
            rounds.close()
            if diverged:
                break
        report = self._report()
        grid = self._attack_grid()
        if grid is not None:
            report["attack_grid_png"] = grid  # once: the driver logs it as an artifact
        done = all(e.round >= e.rounds for e in self.engines)
        report["diverged"] = diverged
        if diverged:
            # Optuna marks a trial with a NaN objective FAILED; the driver tags the reason.
            report.update({k: math.nan for k in self.missing} | {"accuracy": math.nan})
        report["done"] = done or diverged
        return report

    def _attack_grid(self) -> str | None:
        """The first seed's attack image grid as base64 PNG, the first time one exists (it
        travels in the result: the driver may be on another machine than this worker)."""
        if getattr(self, "_grid_sent", False):
            return None
        from sweeps.attack_artifacts import grid_png_base64

        png = grid_png_base64(self.engines[0])
        if png is not None:
            self._grid_sent = True
        return png

    def _report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "round": int(self.engines[0].round),
            "node_ip": socket.gethostbyname(socket.gethostname()),
            "node_id": ray.get_runtime_context().get_node_id(),
            "device": self.exp_config.device,
            "algorithm": self.exp_config.algorithm,
            "startup_seconds": self._startup_s,
            "dp_guarantee": self.engines[0].algorithm.dp_guarantee(),
        }
        # every metric any seed has measured so far (DP runs add delta, noise_multiplier)
        keys = REPORTED | set(self.missing) | set().union(*self._latest)
        keys -= {"round", "clients"}
        for key in sorted(keys):
            values = [lat.get(key) for lat in self._latest]
            if any(v is None for v in values):
                out[key] = self.missing.get(key, math.nan)
                continue
            arr = np.asarray(values, dtype=float)
            same = bool(np.all(arr == arr[0]))  # also true for seeds that all report inf
            out[key] = float(arr[0]) if same else float(arr.mean())
            if len(values) > 1:
                out[f"{key}_std"] = 0.0 if same else float(arr.std(ddof=1))
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        torch.save(
            {"engines": [e.state_dict() for e in self.engines], "latest": self._latest},
            Path(checkpoint_dir) / "state.pt",
        )

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        state = torch.load(Path(checkpoint) / "state.pt", weights_only=False)
        for engine, s in zip(self.engines, state["engines"], strict=True):
            engine.load_state_dict(s)
        self._latest = state["latest"]
