"""Launch a sweep: Ray Tune runs the trials, Optuna samples them, MLflow records them.

The driver (this process) owns every MLflow write and the Optuna study's RDB store; trials only
compute. By default Ray starts locally, sized to this machine; ``--address`` joins a cluster.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from flcore.errors import ConfigError
from sweeps.spec import SweepSpec

__all__ = ["plan", "run_sweep", "SweepPaths"]


class SweepPaths:
    """Where one sweep keeps its files (all absolute: Ray changes trials' working dirs)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.root = Path(spec.storage.path).expanduser().resolve()
        self.tune_dir = self.root / spec.name  # Ray Tune's experiment directory
        self.state = self.root / f"{spec.name}.fedsweep.json"
        self.optuna_db = self.root / "optuna.db"
        self.parquet = self.root / f"{spec.name}.parquet"
        self.pareto_png = self.root / f"{spec.name}_pareto.png"


def resolve_tracking_uri(spec: SweepSpec) -> str:
    """An absolute tracking URI (a relative sqlite path would follow Ray's directory changes)."""
    uri = spec.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///') :]).resolve()}"
    if "://" not in uri:
        return str(Path(uri).resolve())
    return uri


def experiment_name(spec: SweepSpec) -> str:
    """The MLflow experiment: ``tracking.experiment``, else the base config's ``experiment``,
    else ``MLFLOW_EXPERIMENT_NAME``, else the sweep's name."""
    return (
        spec.tracking.experiment
        or spec.base.experiment
        or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        or spec.name
    )


def plan(spec: SweepSpec, *, address: str | None = None) -> dict[str, Any]:
    """What a sweep will do, without starting anything (``--dry-run``)."""
    paths = SweepPaths(spec)
    return {
        "sweep": spec.name,
        "algorithms": spec.algorithms,
        "trials": spec.num_samples,
        "seeds": spec.seeds,
        "experiments": spec.num_samples * len(spec.seeds),
        "rounds": spec.base.rounds,
        "steps_per_trial": spec.steps,
        "max_concurrent_trials": spec.max_concurrent_trials,
        "resources_per_trial": spec.resources.model_dump(),
        "objectives": [o.model_dump() for o in spec.objectives],
        "sampler": spec.sampler.model_dump(),
        "scheduler": spec.scheduler.model_dump(),
        "ray_address": address or spec.ray.address or "local (started by fedsweep)",
        "tracking_uri": resolve_tracking_uri(spec),
        "experiment": experiment_name(spec),
        "storage": str(paths.root),
        "results_parquet": str(paths.parquet),
        "optuna_storage": f"sqlite:///{paths.optuna_db}",
    }


def _sampler(spec: SweepSpec, seed_offset: int) -> Any:
    import optuna

    s = spec.sampler
    seed = None if s.seed is None else s.seed + seed_offset
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=s.n_startup_trials, multivariate=True, group=True
    )


def _study_storage(paths: SweepPaths) -> Any:
    import optuna

    paths.root.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(
        f"sqlite:///{paths.optuna_db}", engine_kwargs={"connect_args": {"timeout": 60}}
    )


def _existing_trials(storage: Any, name: str) -> int:
    import optuna

    try:
        return len(optuna.load_study(study_name=name, storage=storage).trials)
    except KeyError:
        return 0


def run_sweep(
    spec: SweepSpec,
    *,
    resume: bool = False,
    address: str | None = None,
    verbose: int = 1,
) -> dict[str, Any]:
    """Run (or resume) the sweep to the end; returns the summary the CLI prints."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    paths = SweepPaths(spec)
    address = address or spec.ray.address
    exists = (paths.tune_dir / "tuner.pkl").is_file() or paths.state.is_file()
    if resume and not exists:
        raise ConfigError("--resume", f"no sweep {spec.name!r} to resume under {paths.root}")
    if not resume and exists:
        raise ConfigError(
            "name",
            f"a sweep named {spec.name!r} already exists under "
            f"{paths.root}: resume it with --resume, or choose another name",
        )

    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from search_spaces import define_by_run
    from sweeps.export import export_sweep
    from sweeps.provenance import provenance_tags
    from sweeps.tracking import experiment_id, mlflow_client
    from sweeps.trainable import FLTrainable
    from sweeps.tune_tracking import MLflowDriverCallback, SweepState

    uri = resolve_tracking_uri(spec)
    client = mlflow_client(uri)
    exp_name = experiment_name(spec)
    exp_id = experiment_id(client, exp_name)
    state = SweepState(paths.state)
    if state.parent_run_id is None:
        parent = client.create_run(
            exp_id,
            run_name=f"sweep-{spec.name}",
            tags={"fedsweep.sweep": spec.name, "fedsweep.kind": "sweep", **provenance_tags()},
        )
        state.set("parent_run_id", parent.info.run_id)
        _log_spec(client, parent.info.run_id, spec)
    parent_id = state.parent_run_id
    client.update_run(parent_id, status="RUNNING")

    base = spec.base
    device = "cuda" if spec.resources.gpu > 0 else base.device
    trainable = tune.with_resources(
        tune.with_parameters(
            FLTrainable,
            base=base.model_dump(mode="json"),
            seeds=spec.seeds,
            rounds_per_step=spec.rounds_per_step,
            missing={o.name: o.missing for o in spec.objectives if o.missing is not None},
            device=device,
        ),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    callback = MLflowDriverCallback(
        uri=uri,
        experiment_id=exp_id,
        state_path=str(paths.state),
        sweep_name=spec.name,
        dataset=base.dataset,
        trial_params=_TrialParams(base.model_dump(mode="json")),
    )

    ray_start = time.perf_counter()
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=verbose > 1)
        else:
            ray.init(
                num_cpus=spec.ray.num_cpus or os.cpu_count(),
                num_gpus=spec.ray.num_gpus,
                include_dashboard=False,
                log_to_driver=verbose > 1,
            )
    ray_init_seconds = time.perf_counter() - ray_start
    try:
        if resume and (paths.tune_dir / "tuner.pkl").is_file():
            tuner = tune.Tuner.restore(
                str(paths.tune_dir),
                trainable=trainable,
                resume_unfinished=True,
                resume_errored=False,
            )
        else:
            storage = _study_storage(paths)
            objectives = spec.objectives
            metric: Any = (
                [o.name for o in objectives] if spec.multi_objective else objectives[0].name
            )
            mode: Any = (
                [o.direction for o in objectives]
                if spec.multi_objective
                else objectives[0].direction
            )
            search = OptunaSearch(
                space=define_by_run(spec.algorithms),
                metric=metric,
                mode=mode,
                sampler=_sampler(spec, _existing_trials(storage, spec.name)),
                storage=storage,
                study_name=spec.name,
            )
            scheduler = None
            if spec.scheduler.name == "asha":
                from ray.tune.schedulers import ASHAScheduler

                scheduler = ASHAScheduler(
                    metric=spec.scheduler.metric,
                    mode=spec.scheduler.mode,
                    max_t=spec.steps,
                    grace_period=spec.scheduler.grace_period,
                    reduction_factor=spec.scheduler.reduction_factor,
                    time_attr="training_iteration",
                )
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(
                    search_alg=search,
                    scheduler=scheduler,
                    num_samples=spec.num_samples,
                    max_concurrent_trials=spec.max_concurrent_trials,
                    reuse_actors=False,
                ),
                run_config=tune.RunConfig(
                    name=spec.name,
                    storage_path=str(paths.root),
                    callbacks=[callback],
                    verbose=verbose,
                    checkpoint_config=tune.CheckpointConfig(
                        num_to_keep=spec.checkpoint.keep,
                        checkpoint_frequency=spec.checkpoint.every,
                        checkpoint_at_end=True,
                    ),
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                ),
            )
        grid = tuner.fit()
    except KeyboardInterrupt:
        client.set_terminated(parent_id, status="KILLED")
        raise
    finally:
        if not address:
            ray.shutdown()

    # Tune returns (rather than raises) after a SIGINT; trials it did not finish remain.
    interrupted = any(r.error is None and not (r.metrics or {}).get("done") for r in grid)
    if not interrupted:
        _close_orphaned_study_trials(paths, spec.name)
    df = export_sweep(uri, exp_name, out=paths.parquet, parent_run_id=parent_id)
    client.log_artifact(parent_id, str(paths.parquet))
    summary = _summarise(spec, df, exp_name, parent_id, paths)
    if summary.get("pareto_png"):
        client.log_artifact(parent_id, summary["pareto_png"])
    client.set_terminated(parent_id, status="KILLED" if interrupted else "FINISHED")
    summary["interrupted"] = interrupted
    summary["ray_init_seconds"] = ray_init_seconds
    return summary


def _close_orphaned_study_trials(paths: SweepPaths, name: str) -> int:
    """Mark FAIL the study's trials still RUNNING once the sweep is complete.

    A driver killed with SIGKILL can have asked Optuna for a trial after Tune last saved the
    searcher; the resumed sweep never hears of that trial again, and it would stay RUNNING.
    """
    import optuna

    storage = _study_storage(paths)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return 0
    orphans = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    for t in orphans:
        storage.set_trial_user_attr(
            t._trial_id, "fedsweep_closed", "orphaned by an interrupted driver"
        )
        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return len(orphans)


class _TrialParams:
    """Picklable: a trial's config -> the experiment config it runs, flattened for MLflow."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        from flcore.config import ExperimentConfig
        from sweeps.trainable import trial_experiment_config

        cfg = trial_experiment_config(config, ExperimentConfig.model_validate(self.base))
        return cfg.model_dump(mode="json")


def _log_spec(client: Any, run_id: str, spec: SweepSpec) -> None:
    from mlflow.entities import Param

    params = {
        "sweep.name": spec.name,
        "sweep.algorithms": ",".join(spec.algorithms),
        "sweep.objectives": ",".join(f"{o.name}:{o.direction}" for o in spec.objectives),
        "sweep.num_samples": spec.num_samples,
        "sweep.seeds": json.dumps(spec.seeds),
        "sweep.sampler": spec.sampler.name,
        "sweep.scheduler": spec.scheduler.name,
    }
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
    client.log_text(run_id, spec.model_dump_json(indent=1), "sweep_spec.json")


def _summarise(
    spec: SweepSpec, df: Any, exp_name: str, parent_id: str, paths: SweepPaths
) -> dict[str, Any]:
    from analysis.pareto import Objective, pareto_front

    objectives = [Objective(o.name, o.direction) for o in spec.objectives]
    trials = []
    for row in df.to_dict("records"):
        trials.append(
            {
                "run_id": row["run_id"],
                "trial_id": row.get("trial_id"),
                "status": row["status"],
                "algorithm": row.get("algorithm"),
                "config": json.loads(row["search_params"])
                if isinstance(row.get("search_params"), str)
                else None,
                **{o.name: row.get(o.name) for o in spec.objectives},
            }
        )
    out: dict[str, Any] = {
        "experiment": exp_name,
        "parent_run_id": parent_id,
        "trials": trials,
        "pareto": [],
        "results_parquet": str(paths.parquet),
    }
    ok = df[df["status"] == "FINISHED"] if len(df) else df
    if len(ok):
        result = pareto_front(df, objectives, by="algorithm")
        keep = ["run_id", "algorithm", *[o.name for o in objectives]]
        out["pareto"] = result.front[keep].to_dict("records")
        overall = set(result.front["run_id"])
        out["pareto_by_algorithm"] = {
            alg: [
                r | {"on_overall_front": r["run_id"] in overall}
                for r in front[keep].to_dict("records")
            ]
            for alg, front in result.per_group.items()
        }
        if len(objectives) >= 2:
            from analysis.plots import plot_pareto_2d

            # the first objective against each other one: pareto_png is the first pair's
            pngs = [
                str(
                    plot_pareto_2d(
                        result.table,
                        objectives[0],
                        other,
                        by="algorithm",
                        path=paths.pareto_png
                        if k == 1
                        else paths.pareto_png.with_name(
                            f"{spec.name}_pareto_{objectives[0].name}_{other.name}.png"
                        ),
                        title=f"sweep {spec.name}",
                    )
                )
                for k, other in enumerate(objectives[1:], start=1)
            ]
            out["pareto_png"] = pngs[0]
            out["pareto_pngs"] = pngs
    return out
