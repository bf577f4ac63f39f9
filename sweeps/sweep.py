"""Launch a sweep: Ray Tune runs the trials, Optuna samples them, MLflow records them.

The driver (this process) owns every MLflow write and the Optuna study's store; trials only
compute. By default Ray starts locally, sized to this machine; ``--address`` joins a cluster.

Before any work, the sweep checks that its tracking store answers and, on a cluster, that every
node sees ``storage.path`` (:mod:`sweeps.preflight`); only then does a new sweep record its
resolved spec and its Optuna store beside its state (:mod:`sweeps.spec_record`), so a refused
sweep leaves nothing behind. ``--resume`` refuses settings that differ from that record, before
Ray starts.
:func:`study_storage` is the one way to open a sweep's Optuna study (:mod:`sweeps.study_store`:
one store per sweep, sqlite locally, a journal file on a cluster, or a database URL).
Samplers: TPE is multivariate with ``group=True`` (each algorithm's conditional space is its own
group) and uses ``constant_liar`` when trials run concurrently, so trials asked for while others
run are steered away from the running ones (Optuna 4 defaults it off, Optuna 5 on: it is set
explicitly); NSGA-II takes ``sampler.population_size``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
import time
from pathlib import Path
from typing import Any

from flcore.errors import ConfigError
from sweeps.driver_time import reset as reset_driver_time
from sweeps.driver_time import tally as driver_tally
from sweeps.inf_values import resolve_inf_values
from sweeps.preflight import check_storage_shared, check_tracking_reachable, check_tracking_uri
from sweeps.spec import NSGA2_POPULATION, SweepSpec
from sweeps.spec_record import check_resume, resolved_spec, write_record
from sweeps.study_store import default_choice, holds_study, open_storage, study_location
from sweeps.tracking import experiment_name as tracking_experiment
from sweeps.tracking import resolve_tracking_uri

__all__ = ["plan", "run_sweep", "study_storage", "SweepPaths"]


class SweepPaths:
    """Where one sweep keeps its files (all absolute: Ray changes trials' working dirs)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.root = Path(spec.storage.path).expanduser().resolve()
        self.tune_dir = self.root / spec.name  # Ray Tune's experiment directory
        self.state = self.root / f"{spec.name}.fedsweep.json"
        self.spec_record = self.root / f"{spec.name}.spec.json"  # the spec it started with
        self.optuna_db = self.root / f"{spec.name}.optuna.db"  # storage.optuna: sqlite
        self.optuna_journal = self.root / f"{spec.name}.optuna.journal"  # storage.optuna: journal
        self.legacy_optuna_db = self.root / "optuna.db"  # every sweep's, before per-sweep stores
        self.parquet = self.root / f"{spec.name}.parquet"
        self.pareto_png = self.root / f"{spec.name}_pareto.png"

    @property
    def made(self) -> bool:
        """Whether this sweep was started here (Tune saved its state, or the driver its own)."""
        return (self.tune_dir / "tuner.pkl").is_file() or self.state.is_file()


#: variables every trial process gets from the driver's environment (besides ``FEDSWEEP_*``)
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_DISABLE_TELEMETRY")


def trial_runtime_env(*, cluster: bool) -> dict[str, Any]:
    """Ray's ``runtime_env`` for the sweep's workers: the driver's ``FEDSWEEP_*`` variables
    (plugins, data root, torch threads) and MLflow's, on every node; on a cluster also the
    plugin modules' code (``py_modules``) for the packages ``FEDSWEEP_PLUGINS`` names, so a
    node without them installed still knows their algorithms."""
    env = {k: v for k, v in os.environ.items() if k.startswith("FEDSWEEP_") or k in FORWARDED_ENV}
    out: dict[str, Any] = {"env_vars": env}
    if cluster:
        packages = plugin_packages()
        if packages:
            out["py_modules"] = packages
    return out


def plugin_packages() -> list[Any]:
    """The local (not installed) top-level packages of the ``FEDSWEEP_PLUGINS`` modules, which
    Ray ships to every node. A single-file plugin module cannot travel (Ray ships folders):
    install it on the nodes."""
    import importlib

    from flcore.plugins import ENV_VAR, load_plugins

    load_plugins()
    names = [n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()]
    installed = {str(Path(p).resolve()) for k, p in sysconfig.get_paths().items() if "lib" in k}
    out: list[Any] = []
    for top in sorted({n.split(".")[0] for n in names}):
        module = importlib.import_module(top)
        where = str(Path(getattr(module, "__file__", None) or ".").resolve())
        if getattr(module, "__path__", None) and not any(where.startswith(p) for p in installed):
            out.append(module)
    return out


def sweep_tracking_uri(spec: SweepSpec) -> str:
    """The store a sweep writes to (``tracking.uri``, resolved as every command resolves it)."""
    return resolve_tracking_uri(spec.tracking.uri)


def experiment_name(spec: SweepSpec) -> str:
    """The MLflow experiment: ``tracking.experiment``, else the base config's ``experiment``,
    else ``MLFLOW_EXPERIMENT_NAME``, else the sweep's name."""
    return tracking_experiment(spec.tracking.experiment or spec.base.experiment, spec.name)


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
        # what Optuna is told for an infinite objective (None: inf FAILs the trial)
        "inf_values": resolve_inf_values(spec),
        "sampler": spec.sampler.model_dump(),
        "scheduler": spec.scheduler.model_dump(),
        "ray_address": address or spec.ray.address or "local (started by fedsweep)",
        "tracking_uri": sweep_tracking_uri(spec),
        "experiment": experiment_name(spec),
        "storage": str(paths.root),
        "results_parquet": str(paths.parquet),
        "optuna_storage": study_location(spec, paths, address, fresh=not paths.made).describe(),
    }


def _sampler(spec: SweepSpec, seed_offset: int) -> Any:
    """The Optuna sampler; ``seed_offset`` (trials the study already holds) keeps a continued
    study from repeating its random start-up points."""
    import optuna

    s = spec.sampler
    seed = None if s.seed is None else s.seed + seed_offset
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(
            seed=seed, population_size=s.population_size or NSGA2_POPULATION
        )
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=s.n_startup_trials,
        multivariate=True,
        group=True,
        constant_liar=spec.max_concurrent_trials > 1,
    )


def study_storage(spec: SweepSpec, paths: SweepPaths, address: str | None = None) -> Any:
    """The sweep's Optuna store (an ``optuna.storages.BaseStorage``), created if need be.

    The store a sweep started with (kept in its spec record) wherever it resumes; for a new
    sweep ``storage.optuna``, else a journal file on a cluster ``address``, else sqlite.
    """
    return open_storage(study_location(spec, paths, address))


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
    verbose: int = 0,
    live: bool = False,
) -> dict[str, Any]:
    """Run (or resume) the sweep to the end; returns the summary the CLI prints.

    ``verbose`` is Ray Tune's (0: silent; 2: its result tables, and the trials' own output
    reaches the driver); ``live`` shows :mod:`sweeps.console`'s view on stderr meanwhile."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    paths = SweepPaths(spec)
    address = address or spec.ray.address
    exists = paths.made
    if resume and not exists:
        raise ConfigError("--resume", f"no sweep {spec.name!r} to resume under {paths.root}")
    if not resume and exists:
        raise ConfigError(
            "name",
            f"a sweep named {spec.name!r} already exists under "
            f"{paths.root}: resume it with --resume, or choose another name",
        )
    uri = sweep_tracking_uri(spec)
    tree = resolved_spec(spec, tracking_uri=uri, experiment=experiment_name(spec))
    if resume:  # before Ray starts and before anything is written
        check_resume(spec.name, paths.spec_record, tree)
    else:
        # one study per sweep: a study of this name left by a deleted sweep (or another sweep's
        # on a shared database) would feed its trials to this sweep's sampler
        location = study_location(spec, paths, address, fresh=True)
        if holds_study(location, spec.name):
            raise ConfigError(
                "name",
                f"the Optuna store {location.target} already holds a study {spec.name!r} (left "
                "by an earlier sweep of that name): choose another name, or delete that study",
            )
    # the tracking store answers (sweeps.preflight): before Ray starts or anything is written
    uri_key = "tracking.uri" if spec.tracking.uri else "MLFLOW_TRACKING_URI"
    check_tracking_uri(uri, key=uri_key, in_spec=bool(spec.tracking.uri))
    check_tracking_reachable(uri, key=uri_key)

    import functools

    import ray
    from ray import tune

    from search_spaces import define_by_run
    from sweeps.console import SweepConsole, SweepProgress, showing
    from sweeps.export import export_sweep
    from sweeps.fast_sqlite import fast_commits
    from sweeps.provenance import provenance_tags
    from sweeps.search import FedSweepSearch, OutcomeRule, StudyLink, resolve_inf_values
    from sweeps.spec import missing_fills
    from sweeps.tracking import experiment_id, mlflow_client, sqlite_path
    from sweeps.trainable import FLTrainable
    from sweeps.tune_tracking import MLflowDriverCallback, SweepState

    reset_driver_time()
    ray_start = time.perf_counter()
    if not ray.is_initialized():
        if address:
            ray.init(
                address=address,
                log_to_driver=verbose > 1,
                runtime_env=trial_runtime_env(cluster=True),
            )
        else:
            ray.init(
                num_cpus=spec.ray.num_cpus,  # None: Ray's own, container-aware count
                num_gpus=spec.ray.num_gpus,
                include_dashboard=False,
                log_to_driver=verbose > 1,
                runtime_env=trial_runtime_env(cluster=False),
            )
    ray_init_seconds = time.perf_counter() - ray_start
    if address:  # every node that runs trials sees storage.path (before anything is written)
        check_storage_shared(paths.root)
    if not resume:
        write_record(paths.spec_record, tree, default_choice(spec, address))

    db = sqlite_path(uri)
    if db is not None:  # the driver's commits on Tune's loop skip the disk wait (fast_sqlite)
        fast_commits(db)
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
    assert parent_id is not None
    client.update_run(parent_id, status="RUNNING")

    base = spec.base
    device = "cuda" if spec.resources.gpu > 0 else base.device
    trainable = tune.with_resources(
        tune.with_parameters(
            FLTrainable,
            base=base.model_dump(mode="json", exclude_unset=True),
            seeds=spec.seeds,
            rounds_per_step=spec.rounds_per_step,
            objectives=[o.name for o in spec.objectives],
            fills=missing_fills(spec),
            device=device,
            gpu=spec.resources.gpu,
            checkpoint_seconds=(
                spec.checkpoint.min_seconds if spec.checkpoint.every == "auto" else None
            ),
        ),
        {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu},
    )
    # The study is the record of every trial's outcome; searcher and callback each reach it
    # through a picklable link (Tune pickles both with the experiment).
    link = StudyLink(functools.partial(study_storage, spec, paths, address), spec.name, parent_id)
    rule = OutcomeRule(
        tuple((o.name, o.direction) for o in spec.objectives), resolve_inf_values(spec)
    )
    console = SweepConsole(
        SweepProgress(
            spec.name,
            [(o.name, o.direction) for o in spec.objectives],
            spec.num_samples,
            rule,
        )
    )
    callback = MLflowDriverCallback(
        uri=uri,
        experiment_id=exp_id,
        state_path=str(paths.state),
        sweep_name=spec.name,
        dataset=base.dataset,
        trial_params=_TrialParams(base.model_dump(mode="json", exclude_unset=True)),
        study=link,
        rule=rule,
    )
    callback.fresh = not resume  # no earlier driver made runs for this sweep's trials

    try:
        if resume and (paths.tune_dir / "tuner.pkl").is_file():
            # Tune restores its searcher (FedSweepSearch reconciles it with the study) and the
            # callback; trials it had not saved are taken over or counted (sweeps.search).
            tuner = tune.Tuner.restore(
                str(paths.tune_dir),
                trainable=trainable,
                resume_unfinished=True,
                resume_errored=False,
            )
        else:
            search = FedSweepSearch(
                space=define_by_run(spec.algorithms),
                rule=rule,
                link=link,
                sampler_factory=functools.partial(_sampler, spec),
                num_samples=spec.num_samples,
            )
            scheduler = None
            if spec.scheduler.name == "asha":
                from ray.tune.schedulers import ASHAScheduler

                # With several objectives ASHA ranks on one metric; a trial it stops is PRUNED
                # (never on a front), not refused: see sweeps.search.
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
                    reuse_actors=spec.reuse_actors,
                ),
                run_config=tune.RunConfig(
                    name=spec.name,
                    storage_path=str(paths.root),
                    callbacks=[callback, console],
                    verbose=verbose,
                    checkpoint_config=tune.CheckpointConfig(
                        num_to_keep=spec.checkpoint.keep,
                        # auto: the trainable asks for each save (should_checkpoint)
                        checkpoint_frequency=(
                            0 if spec.checkpoint.every == "auto" else spec.checkpoint.every
                        ),
                        checkpoint_at_end=True,
                    ),
                    failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                ),
            )
        with showing() if live else contextlib.nullcontext():
            grid = tuner.fit()
    except KeyboardInterrupt:
        client.set_terminated(parent_id, status="KILLED")
        raise
    finally:
        callback.close()  # every queued MLflow write reaches the store, after Ctrl-C too
        if not address:
            ray.shutdown()

    # Tune returns (rather than raises) after a SIGINT; trials it did not finish remain.
    interrupted = any(r.error is None and not (r.metrics or {}).get("done") for r in grid)
    # after a resume: what the killed driver had queued but not written, from the trials' own
    # checkpoints (before reconciling, which closes runs that may still lack those points)
    relogged = callback.relog_missing(paths.tune_dir) if resume else None
    reconciled = None if interrupted else _close_orphaned_study_trials(callback)
    callback.close()
    df = export_sweep(uri, exp_name, out=paths.parquet, parent_run_id=parent_id)
    client.log_artifact(parent_id, str(paths.parquet))
    summary = _summarise(spec, df, exp_name, parent_id, paths)
    if summary.get("pareto_png"):
        client.log_artifact(parent_id, summary["pareto_png"])
    client.set_terminated(parent_id, status="KILLED" if interrupted else "FINISHED")
    summary["interrupted"] = interrupted
    summary["reconciled"] = reconciled
    summary["relogged"] = relogged
    summary["ray_init_seconds"] = ray_init_seconds
    wall = time.perf_counter() - ray_start
    spent = driver_tally()
    summary["driver_seconds"] = {
        **spent,
        "sweep_wall": wall,
        "share": sum(spent.values()) / wall if wall > 0 else None,
    }
    return summary


def _close_orphaned_study_trials(callback: Any) -> dict[str, int]:
    """Once the sweep is complete, end every trial in exactly one state, the same in Optuna
    and MLflow (:meth:`sweeps.tune_tracking.MLflowDriverCallback.reconcile`): a trial still
    RUNNING in the study is FAIL (lost), and each child run is closed as its Optuna trial
    ended. Returns what it changed (all zero when no driver was killed)."""
    counts: dict[str, int] = callback.reconcile()
    return counts


class _TrialParams:
    """Picklable: a trial's config -> the experiment config it runs, flattened for MLflow."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        from flcore.config import ExperimentConfig
        from sweeps.spec import trial_experiment_config

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
        # what the front leaves out, and why (failed, pruned, unmeasured), and its caveats
        out["n_invalid"] = result.n_invalid
        out["invalid_reasons"] = dict(result.invalid_reasons)
        out["notes"] = list(result.notes)
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
