"""One FL experiment as a Ray Tune class trainable: a step is ``rounds_per_step`` rounds.

A trial is one sampled configuration; it runs once per seed of the spec, the seeds in lockstep,
and reports the mean over seeds of every metric (with ``<metric>_std`` beside it when there are
several seeds), so the objectives Optuna sees are per-configuration means; an epsilon is the
largest over seeds instead (each seed's run has its own guarantee, and the trial's is the worst).

Every report carries the latest value of every metric: accuracy measured only every
``eval_every`` rounds is carried forward. Every objective is in every report (Ray checks for the
searcher's metrics in each one): a metric this trial's algorithm *cannot* report takes the
spec's ``missing`` value (``fills``: per algorithm, from :func:`sweeps.spec.missing_fills`), and
a metric it can report but has not measured (yet) is NaN, never a fill-in (§3.1: a leakage not
measured yet used to become 0 dB, the best score). The searcher (:mod:`sweeps.search`) judges the
last report: ``rounds_completed`` below ``rounds_total`` (stopped early), ``diverged`` (a NaN or
inf training loss; the trial ends there), or an objective still NaN. A seed's run may end before
its last round by the config's ``early_stopping`` (Pa3dFL's protocol, not a scheduler's
pruning): once every seed's run has ended, ``rounds_total`` is ``rounds_completed`` (the trial is
COMPLETE), and the client accuracies reported are each seed's best-validation round's
(their best window's means with ``early_stopping.window``, or with ``early_stopping.report:
all_clients`` every client on the state the best window ended with, and ``evaluated_clients``;
:meth:`flcore.engine.Engine.summary`), with ``best_round``. ``privacy_tags`` is the
algorithm's :meth:`~flcore.algorithms.base.Algorithm.privacy_tags` (the driver tags the child run
with each). A checkpoint holds every seed's whole engine state.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray import tune

from analysis.guarantees import is_epsilon
from flcore.algorithms.base import Algorithm
from flcore.config import ExperimentConfig
from flcore.engine import CLIENT_ACCURACIES, Engine
from flcore.experiment import build_data, build_engine
from sweeps.spec import trial_experiment_config

__all__ = ["FLTrainable", "REPORTED", "combine_seeds", "trial_experiment_config"]

#: metrics every report carries (plus the objectives and ``*_std``): whatever any algorithm may
#: report, and the engine's per-round traffic and time
REPORTED = Algorithm.reports | {"round_bytes_up", "round_bytes_down", "round_seconds"}


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


def trial_threads() -> int:
    """Torch threads of a trial: ``FEDSWEEP_TORCH_THREADS`` if set, else the CPUs Ray assigned
    the trial (at least 1)."""
    if os.environ.get("FEDSWEEP_TORCH_THREADS"):
        return max(1, int(os.environ["FEDSWEEP_TORCH_THREADS"]))
    if not ray.is_initialized():  # outside Ray (a test, a script)
        return 1
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return max(1, int(cpus))


def trial_placement(cfg: ExperimentConfig, device: str, gpu: float) -> ExperimentConfig:
    """A trial's config on its device: clients in-process (``workers: 1``), and a trial that
    asked Ray for a fraction of a GPU capped at that fraction of the GPU's memory
    (``gpu_memory_fraction``), since Ray's fractions schedule but cap nothing; a fraction the
    config sets itself is kept."""
    update: dict[str, Any] = {"workers": 1, "device": device}
    if device.startswith("cuda") and 0 < gpu < 1 and cfg.gpu_memory_fraction is None:
        update["gpu_memory_fraction"] = gpu
    return cfg.model_copy(update=update)


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
        objectives: list[str],
        fills: dict[str, dict[str, float]],
        device: str = "cpu",
        gpu: float = 0.0,
        checkpoint_seconds: float | None = None,
    ) -> None:
        # the spec's pieces (the same for every trial of a sweep): a reused actor keeps them
        self._spec = {
            "base": base,
            "seeds": seeds,
            "rounds_per_step": rounds_per_step,
            "objectives": objectives,
            "fills": fills,
            "device": device,
            "gpu": gpu,
            "checkpoint_seconds": checkpoint_seconds,
        }
        torch.set_num_threads(trial_threads())
        self._build(config)
        # From process start (interpreter, imports, data, engines) to ready: the per-trial cost.
        self._startup_s = _process_age()

    def _build(self, config: dict[str, Any]) -> None:
        """This trial's engines (one per seed) and its empty per-trial state."""
        spec = self._spec
        # checkpoint.every auto: ask Tune for a save once this much training time has passed
        self.checkpoint_seconds = spec["checkpoint_seconds"]
        self._saved_at = time.monotonic()
        self.base = ExperimentConfig.model_validate(spec["base"])
        self.seeds = list(spec["seeds"])
        self.rounds_per_step = spec["rounds_per_step"]
        self.objectives = list(spec["objectives"])
        self.exp_config = trial_placement(
            trial_experiment_config(config, self.base), spec["device"], spec["gpu"]
        )
        # only the objectives this algorithm cannot report (spec-level, see missing_fills)
        self.fills = dict(spec["fills"].get(self.exp_config.algorithm, {}))
        self.engines: list[Engine] = []
        for seed in self.seeds:
            cfg = self.exp_config.model_copy(update={"seed": seed})
            self.engines.append(build_engine(cfg, data=build_data(cfg)))
        self._latest: list[dict[str, float | None]] = [{} for _ in self.seeds]
        # every step's numeric report, kept in the checkpoint: a resumed driver re-logs from it
        # what a killed driver had queued but not written (MLflowDriverCallback.relog_missing)
        self._reports: list[dict[str, float]] = []
        self._grid_sent = False

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """A new trial in this actor (``reuse_actors``): new engines for the new configuration,
        every per-trial state emptied; the process, its imports and its loaded datasets stay.
        ``startup_seconds`` is then this reset's time (build to ready), not the process's age."""
        started = time.monotonic()
        self.engines = []  # free the last trial's engines (and their cycles) before the next
        gc.collect()
        self._build(new_config)
        self._startup_s = time.monotonic() - started
        return True

    def step(self) -> dict[str, Any]:
        diverged = False
        for i, engine in enumerate(self.engines):
            rounds = engine.iter_rounds()
            for _ in range(self.rounds_per_step):
                if engine.finished:  # all its rounds, or stopped by early stopping
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
        finished = not diverged and all(e.finished for e in self.engines)
        last_round: dict[str, Any] = {}
        if finished:
            last_round = self._report()
            for i, engine in enumerate(self.engines):
                self._take_run_summary(i, engine)
        report = self._report()
        # the last round's own leakage, which the whole-run figures replace in the report: the
        # driver logs it first at the same step, so the metric history keeps every round
        own = {
            k: v
            for k, v in last_round.items()
            if k.startswith("leak_") and isinstance(v, float) and v == v and report.get(k) != v
        }
        if own:
            report["last_round_values"] = own
        grid = self._attack_grid()
        if grid is not None:
            report["attack_grid_png"] = grid  # once: the driver logs it as an artifact
        if finished and self.engines[0].algorithm.capacity is not None:
            # under a capacity setting: each client's width, parameters, FLOPs of one batch and
            # peak memory of one step (the first seed's clients), as ``fedsweep run`` logs them
            engine = self.engines[0]
            report.update(engine.cost_metrics())
            report["client_costs_json"] = json.dumps(
                {str(k): v for k, v in engine.client_costs().items()}
            )
        done = all(e.finished for e in self.engines)
        report["diverged"] = diverged  # the searcher tells it FAIL (reason "diverged")
        report["done"] = done or diverged
        if (
            self.checkpoint_seconds is not None
            and not report["done"]  # the end is saved anyway (checkpoint_at_end)
            and time.monotonic() - self._saved_at >= self.checkpoint_seconds
        ):
            report["should_checkpoint"] = True
        self._reports.append(
            {
                k: float(v)
                for k, v in report.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
        )
        return report

    def _take_run_summary(self, i: int, engine: Engine) -> None:
        """At a seed's last round, its probes' whole-run figures replace the last round's: a
        leakage evaluation's per-round metrics describe the latest attacked round only, its
        summary every attacked round (``leak_psnr`` is the mean over all attacked records)."""
        for probe in engine.probes:
            for key, value in probe.summary(engine).items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self._latest[i][key] = value
        if engine.early_stopping_metric is not None:
            # the best-validation round's accuracies replace the last round's (a width cluster
            # absent from that round is absent from the report too); ``stopped_early`` is left
            # out: in a sweep that name is the tag of a trial a scheduler pruned
            summary = engine.summary()
            latest = self._latest[i]
            for key in [k for k in latest if k.startswith(CLIENT_ACCURACIES)]:
                del latest[key]
            for key, value in summary.items():
                selected = key.startswith(CLIENT_ACCURACIES) or key == "global_accuracy"
                kept = selected or key in ("best_round", "evaluated_clients")
                if kept and value is not None:
                    latest[key] = value

    def _attack_grid(self) -> str | None:
        """The first seed's attack image grid as base64 PNG, the first time one exists (it
        travels in the result: the driver may be on another machine than this worker)."""
        if self._grid_sent:
            return None
        from sweeps.attack_artifacts import grid_png_base64

        png = grid_png_base64(self.engines[0])
        if png is not None:
            self._grid_sent = True
        return png

    def _report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "round": int(self.engines[0].round),
            # Ray's own address of this node (the host name may not resolve)
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "device": self.exp_config.device,
            "algorithm": self.exp_config.algorithm,
            "startup_seconds": self._startup_s,
            # every seed's engine, for a trial stopped early (ASHA) versus one that ran to the end
            "rounds_completed": int(min(e.round for e in self.engines)),
            # the rounds the trial runs to; once every seed ended (early stopping may end one
            # before its last round) the rounds it ran, so such a trial is not taken as pruned
            "rounds_total": int(
                min(e.round for e in self.engines)
                if all(e.finished for e in self.engines)
                else self.engines[0].rounds
            ),
            "privacy_tags": dict(self.engines[0].algorithm.privacy_tags()),
        }
        out["dp_guarantee"] = out["privacy_tags"]["dp_guarantee"]
        # every metric any seed has measured so far (DP runs add delta, noise_multiplier)
        keys = REPORTED | set(self.objectives) | set().union(*self._latest)
        out.update(combine_seeds(self._latest, keys - {"round", "clients"}, self.fills))
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self._saved_at = time.monotonic()
        torch.save(
            {
                "engines": [e.state_dict() for e in self.engines],
                "latest": self._latest,
                "reports": self._reports,
            },
            Path(checkpoint_dir) / "state.pt",
        )

    def load_checkpoint(self, checkpoint: str | dict) -> None:
        state = torch.load(Path(checkpoint) / "state.pt", weights_only=False)
        for engine, s in zip(self.engines, state["engines"], strict=True):
            engine.load_state_dict(s)
        self._latest = state["latest"]
        self._reports = list(state.get("reports", []))
        self._saved_at = time.monotonic()


def combine_seeds(
    latest: list[dict[str, float]], keys: set[str], fills: dict[str, float]
) -> dict[str, float]:
    """A trial's figures from its seeds' latest metrics: per key the mean over seeds, and
    ``<key>_std`` (sample std) when there are several; an epsilon is the largest over seeds
    (each seed's run has its own guarantee, the trial's is the worst: a LoDMeta walk's busiest
    client differs by seed; the mean would under-report some seed's). A key some seed has not
    measured yet is ``fills[key]`` (NaN without one)."""
    out: dict[str, float] = {}
    for key in sorted(keys):
        values = [lat.get(key) for lat in latest]
        if any(v is None for v in values):
            out[key] = fills.get(key, math.nan)
            continue
        arr = np.asarray(values, dtype=float)
        same = bool(np.all(arr == arr[0]))  # also true for seeds that all report inf
        combined = arr.max() if is_epsilon(key) else arr.mean()
        out[key] = float(arr[0]) if same else float(combined)
        if len(values) > 1:
            out[f"{key}_std"] = 0.0 if same else float(arr.std(ddof=1))
    return out
