"""The sweep spec: a YAML file validated, like run configs, before anything starts.

Top-level keys: ``name``, ``base`` (an experiment config, inline or a path relative to the spec),
``algorithms``, ``objectives``, ``seeds``, ``num_samples``, ``max_concurrent_trials``,
``reuse_actors``, ``rounds_per_step``, ``resources``, ``scheduler``, ``sampler``,
``max_failures``, ``checkpoint``, ``tracking``, ``storage`` and ``ray``. ``--set`` reaches every
key, ``base.*`` included.

Decisions checked here, before anything starts (each a ``ConfigError`` naming the key):

- ``sampler.name: nsga2`` is refused with several algorithms. Optuna's ``NSGAIISampler`` (5.0,
  ``infer_relative_search_space``) evolves only the intersection search space: the parameters
  suggested with the same distribution in every completed trial. Our parameters are named
  ``<algorithm>:<key>`` (``search_spaces``), so with several algorithms that intersection is
  the ``algorithm`` choice alone and every hyperparameter comes from its ``RandomSampler``.
  TPE (multivariate, ``group=True``) models each algorithm's conditional space instead.
- ``sampler.population_size`` is NSGA-II's generation size (Optuna's default 50), refused for
  other samplers; NSGA-II draws its whole first generation at random, so a sweep of
  ``num_samples <= population_size`` trials would never evolve and is refused too.
- ``tracking.uri`` is a URI MLflow reads, with no password (``sweeps.preflight``); whether the
  store answers is checked when the sweep starts, not here (a dry run reaches no server).
- Every algorithm's trial config is validated on the base (:func:`trial_experiment_config`
  of one seeded draw of its search space): an algorithm the base cannot run (a walk on a base
  without few-shot clients, a plain one on few-shot clients) is refused here, not trial by
  trial. The base's ``algorithm_params`` are its own algorithm's (a ready config's, e.g.
  Pa3dFL's): a trial of another algorithm keeps the keys it takes (a family's shared knobs:
  LoDMeta's inner loop for LoDMeta-basic) and starts from its defaults for the rest, with a
  warning naming them.
- ``storage.optuna`` is ``sqlite``, ``journal`` or an SQLAlchemy URL of sqlite, postgresql or
  mysql. A URL's database driver must import now (not after Ray started), it may carry no
  password (the spec is logged to MLflow and kept beside the sweep: use ``PGPASSWORD``,
  ``~/.pgpass`` or ``~/.my.cnf``), and a relative ``sqlite:///`` path is made absolute here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from analysis.guarantees import is_epsilon
from flcore.config import ExperimentConfig, apply_overrides, parse_overrides, read_yaml
from flcore.config import validate_config as validate_experiment
from flcore.errors import ConfigError

__all__ = [
    "NSGA2_POPULATION",
    "SweepSpec",
    "ObjectiveSpec",
    "load_spec",
    "missing_fills",
    "foreign_params",
    "trial_experiment_config",
    "validate_spec",
]

NSGA2_POPULATION = 50  # Optuna's NSGAIISampler default population_size
_RDB_BACKENDS = ("sqlite", "postgresql", "mysql")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def trial_experiment_config(config: Mapping[str, Any], base: ExperimentConfig) -> ExperimentConfig:
    """The experiment a trial's sampled parameters describe (base + overrides, validated).

    The base goes in as the spec wrote it (``exclude_unset``; the driver hands the trainable its
    base the same way): a key the spec never set stays unset, so a check on what a config sets
    (a walk refuses ``client_fraction``, ``full_last_round``) judges the spec, not a default.
    ``base.algorithm_params`` are ``base.algorithm``'s: another algorithm's trial keeps those
    it takes (a family's shared knobs) and starts from its defaults for the rest
    (:func:`foreign_params`).
    """
    from search_spaces import overrides_for

    algorithm = config["algorithm"]
    raw = base.model_dump(mode="json", exclude_unset=True)
    if algorithm != base.algorithm and "algorithm_params" in raw:
        foreign = foreign_params(algorithm, raw["algorithm_params"])
        raw["algorithm_params"] = {
            k: v for k, v in raw["algorithm_params"].items() if k not in foreign
        }
    raw["algorithm"] = algorithm
    return validate_experiment(apply_overrides(raw, overrides_for(algorithm, config)))


def _one_draw(algorithm: str) -> dict[str, Any]:
    """A trial's config from one draw of ``algorithm``'s search space (an in-memory study,
    seeded): what its space supplies (DP-FedAvg's privacy mapping) is there when the base is
    judged."""
    import optuna

    from search_spaces import SPACES

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    finally:
        optuna.logging.set_verbosity(verbosity)
    SPACES.get(algorithm)(trial, algorithm)
    return {"algorithm": algorithm, **trial.params}


def foreign_params(algorithm: str, params: Mapping[str, Any]) -> list[str]:
    """The keys of ``params`` (another algorithm's ``algorithm_params``) that ``algorithm``
    does not take."""
    from flcore.algorithms import ALGORITHMS

    fields = ALGORITHMS.get(algorithm).Params.model_fields
    return sorted(k for k in params if k not in fields)


class ObjectiveSpec(_Strict):
    """One objective: a metric, its direction, the value to use where an algorithm cannot
    report it (without ``missing`` such an algorithm is an error; see :func:`missing_fills`),
    and ``inf_value``, the finite stand-in told to Optuna for an inf value (MLflow and fronts
    keep inf; default for ``epsilon``: 10 x the largest reachable target epsilon, see
    :mod:`sweeps.search`; another objective without it fails a trial that reports inf)."""

    name: str
    direction: Literal["max", "min"]
    missing: float | None = None
    inf_value: float | None = Field(None, gt=0, allow_inf_nan=False)


class ResourcesSpec(_Strict):
    cpu: float = Field(1.0, gt=0)
    gpu: float = Field(0.0, ge=0, description="a fraction such as 0.25 packs trials on a GPU")


class SchedulerSpec(_Strict):
    name: Literal["none", "asha"] = "none"
    metric: str | None = None
    mode: Literal["max", "min"] | None = None
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(2.0, gt=1)


class SamplerSpec(_Strict):
    name: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int | None = 0
    n_startup_trials: int = Field(4, ge=0, description="tpe: random trials before TPE models")
    population_size: int | None = Field(
        None, ge=2, description=f"nsga2 only: trials per generation (default {NSGA2_POPULATION})"
    )


class CheckpointSpec(_Strict):
    """When a trial checkpoints. ``every: auto`` (the default) saves after a step that ends at
    least ``min_seconds`` after the trial's last save (or its start), and at its end: a killed
    trial loses at most about ``min_seconds`` of work, and a trial writes at most one state
    per ``min_seconds`` to the shared storage (HyperFL's is 60 MB a seed; on a GPU its rounds
    take half a second, so saving every step would write about 100 MB/s a trial). An integer
    saves every that many steps."""

    keep: int = Field(2, ge=1, description="checkpoints kept per trial")
    every: int | Literal["auto"] = Field(
        "auto", description="auto (by time, min_seconds) or steps between checkpoints"
    )
    min_seconds: float = Field(
        60.0, gt=0, description="every: auto: seconds of training between checkpoints, at least"
    )

    @field_validator("every")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be auto or an integer >= 1")
        return v


class TrackingSpec(_Strict):
    uri: str | None = Field(
        None, description="MLflow URI; default $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db"
    )
    experiment: str | None = None


class StorageSpec(_Strict):
    path: str = Field("sweeps_out", description="Ray Tune results, checkpoints, Optuna store")
    optuna: str | None = Field(
        None,
        description="the Optuna study's store: 'sqlite', 'journal' or an RDB URL; default "
        "'sqlite' locally, 'journal' on a cluster address",
    )


class RaySpec(_Strict):
    address: str | None = Field(None, description="None: start a local Ray; 'auto' or host:port")
    num_cpus: int | None = Field(None, ge=1)
    num_gpus: int | None = Field(None, ge=0)


class SweepSpec(_Strict):
    """A validated sweep."""

    name: str = Field("sweep", pattern=r"^[A-Za-z0-9_.-]+$")
    base: ExperimentConfig
    algorithms: list[str] = Field(min_length=1)
    objectives: list[ObjectiveSpec] = Field(min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    num_samples: int = Field(8, ge=1)
    max_concurrent_trials: int = Field(2, ge=1)
    reuse_actors: bool = Field(
        True,
        description="a finished trial's Ray actor runs the next one (its imports and loaded "
        "datasets kept, new engines built); false: a fresh process per trial",
    )
    rounds_per_step: int = Field(1, ge=1)
    resources: ResourcesSpec = ResourcesSpec()
    scheduler: SchedulerSpec = SchedulerSpec()
    sampler: SamplerSpec = SamplerSpec()
    max_failures: int = Field(2, ge=0)
    checkpoint: CheckpointSpec = CheckpointSpec()
    tracking: TrackingSpec = TrackingSpec()
    storage: StorageSpec = StorageSpec()
    ray: RaySpec = RaySpec()

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v) or any(s < 0 for s in v):
            raise ValueError("seeds must be distinct and >= 0")
        return v

    @property
    def steps(self) -> int:
        """Tune iterations per trial: the base config's rounds in steps of rounds_per_step."""
        return math.ceil(self.base.rounds / self.rounds_per_step)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def _objectives(raw: Any) -> list[dict[str, Any]]:
    """Accept ``{accuracy: max}``, ``[{name, direction, missing}]`` or ``["accuracy:max"]``."""
    if isinstance(raw, Mapping):
        out = []
        for name, val in raw.items():
            out.append(
                {"name": name, **val}
                if isinstance(val, Mapping)
                else {"name": name, "direction": val}
            )
        return out
    if isinstance(raw, list):
        out = []
        for item in raw:
            if isinstance(item, str):
                name, _, direction = item.partition(":")
                out.append({"name": name.strip(), "direction": direction.strip()})
            else:
                out.append(item)
        return out
    raise ConfigError("objectives", "must be a mapping {metric: max|min} or a list")


def _reported(algorithm: str, base: ExperimentConfig) -> set[str]:
    """Metrics a trial of ``algorithm`` reports: the algorithm's, plus the privacy evaluation's
    when the base config attacks: all of them where the algorithm uploads something to attack,
    else only the values it declares (``local``: calibrated leakage 0; its raw leakage is null,
    nothing uploaded); plus the knowledge inversion's with ``knowledge_attack``."""
    from flcore.algorithms import ALGORITHMS
    from flcore.attacks.evaluation import LEAK_METRICS, NOTHING_UPLOADED_LEAKAGE

    alg = ALGORITHMS.get(algorithm)
    out = set(alg.reports)
    if base.attack is not None:
        out |= set(LEAK_METRICS) if alg.uploads else set(NOTHING_UPLOADED_LEAKAGE)
    if base.knowledge_attack is not None:
        from flcore.attacks.knowledge_inversion import KNOWLEDGE_METRICS

        out |= set(KNOWLEDGE_METRICS)
    return out


def missing_fills(spec: SweepSpec) -> dict[str, dict[str, float]]:
    """algorithm -> {objective: its ``missing`` value} for each objective that algorithm cannot
    report (:func:`_reported`): the only place ``missing`` stands in for a value. A metric an
    algorithm can report but has not measured is never filled (NaN: the trial fails)."""
    fills: dict[str, dict[str, float]] = {}
    for alg in spec.algorithms:
        reported = _reported(alg, spec.base)
        fills[alg] = {
            o.name: o.missing
            for o in spec.objectives
            if o.name not in reported and o.missing is not None
        }
    return fills


def validate_spec(raw: Mapping[str, Any], *, base_dir: Path | None = None) -> SweepSpec:
    """Validate a raw spec; errors name the dotted key and are raised before any work."""
    from flcore.algorithms import ALGORITHMS
    from search_spaces import SPACES

    raw = dict(raw)
    base = raw.get("base", {})
    if isinstance(base, str):
        path = Path(base)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        base = read_yaml(path)
    base_overrides = raw.pop("_base_overrides", {})
    try:
        base_cfg = validate_experiment(apply_overrides(base or {}, base_overrides))
    except ConfigError as exc:
        raise ConfigError(
            f"base.{exc.key}" if exc.key else "base", str(exc).split(": ", 1)[-1]
        ) from None
    if base_cfg.data_root is None:
        from flcore.data import default_data_root

        base_cfg = base_cfg.model_copy(update={"data_root": str(default_data_root())})
    else:  # Ray changes each trial's working directory: make the root absolute now.
        base_cfg = base_cfg.model_copy(
            update={"data_root": str(Path(base_cfg.data_root).expanduser().resolve())}
        )
    if base_cfg.attack is not None and base_cfg.attack.rounds is None:
        # A sweep's default schedule: one last-round attack hides early-round leakage, and
        # symbolic rounds survive a searched ``rounds`` (resolved per trial).
        attack = base_cfg.attack.model_copy(update={"rounds": ["first", "middle", "last"]})
        base_cfg = base_cfg.model_copy(update={"attack": attack})
    raw["base"] = base_cfg
    if "objectives" in raw:
        raw["objectives"] = _objectives(raw["objectives"])
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ConfigError(
            key,
            f"{msg} (got {err.get('input')!r})"
            if "input" in err and err["type"] != "extra_forbidden"
            else msg,
        ) from None
    for i, alg in enumerate(spec.algorithms):
        if alg not in ALGORITHMS:
            raise ConfigError(
                f"algorithms.{i}",
                f"unknown algorithm {alg!r}; known: {', '.join(ALGORITHMS.names())}",
            )
        if alg not in SPACES:
            raise ConfigError(f"algorithms.{i}", f"no search space for {alg!r} in search_spaces/")
        try:
            trial_experiment_config(_one_draw(alg), spec.base)
        except ConfigError as exc:
            raise ConfigError(f"algorithms.{i}", f"{alg} cannot run on this base: {exc}") from None
    dropped = {
        alg: keys
        for alg in sorted(set(spec.algorithms) - {spec.base.algorithm})
        if (keys := foreign_params(alg, spec.base.algorithm_params))
    }
    if dropped:
        warnings.warn(
            f"base.algorithm_params are {spec.base.algorithm}'s; "
            + "; ".join(f"{alg} does not take {', '.join(keys)}" for alg, keys in dropped.items())
            + ": those trials start from their own defaults there (and their search spaces)",
            UserWarning,
            stacklevel=2,
        )
    attack = spec.base.attack
    if attack is not None and attack.labels == "auto" and len(set(spec.algorithms)) > 1:
        # iDLG works only where the classifier is uploaded; elsewhere auto falls back to given
        # labels, so the algorithms would face different attackers.
        raise ConfigError(
            "base.attack.labels",
            "auto label recovery is not the same threat model for different algorithms; "
            "use labels: given (the default) in a sweep over several algorithms",
        )
    reported = {a: _reported(a, spec.base) for a in spec.algorithms}
    for i, obj in enumerate(spec.objectives):
        if is_epsilon(obj.name) and obj.name.lower().split(".")[-1] != "epsilon":
            warnings.warn(
                f"objective {obj.name!r} is a partial privacy figure (one release's share, or a "
                "paper's formula), not the guarantee a run has; only 'epsilon' is (inf where "
                "something is released unprotected), so a front on it is no privacy-utility "
                "front",
                UserWarning,
                stacklevel=2,
            )
        if obj.name.startswith("leak_lpips") and spec.base.attack is not None:
            from flcore.attacks.metrics import LPIPS

            reason = LPIPS().reason
            if reason is not None:
                raise ConfigError(f"objectives.{i}", reason)
        lacking = [a for a in spec.algorithms if obj.name not in reported[a]]
        if lacking and obj.missing is None:
            known = sorted(set().union(*reported.values()))
            raise ConfigError(
                f"objectives.{i}",
                f"{', '.join(lacking)} cannot report {obj.name!r}; give the objective a "
                f"'missing' value or drop it (metrics reported: {', '.join(known)})",
            )
    if len({o.name for o in spec.objectives}) != len(spec.objectives):
        raise ConfigError("objectives", "an objective is listed twice")
    if spec.scheduler.name == "asha":
        if spec.scheduler.metric is None or spec.scheduler.mode is None:
            raise ConfigError("scheduler", "asha needs a metric and a mode (one metric only)")
        if spec.scheduler.metric not in {o.name for o in spec.objectives} | {"train_loss"}:
            raise ConfigError("scheduler.metric", "must be an objective or train_loss")
    _check_sampler(spec)
    if spec.tracking.uri is not None:
        from sweeps.preflight import check_tracking_uri

        check_tracking_uri(spec.tracking.uri)
    if spec.storage.optuna is not None:
        optuna_store = _optuna_store(spec.storage.optuna)
        if optuna_store != spec.storage.optuna:
            storage = spec.storage.model_copy(update={"optuna": optuna_store})
            spec = spec.model_copy(update={"storage": storage})
    return spec


def _check_sampler(spec: SweepSpec) -> None:
    s = spec.sampler
    if s.name != "nsga2":
        if s.population_size is not None:
            raise ConfigError(
                "sampler.population_size", f"is NSGA-II's; sampler {s.name!r} has no population"
            )
        return
    if len(spec.algorithms) > 1:
        raise ConfigError(
            "sampler.name",
            "nsga2 cannot search several algorithms: Optuna's NSGAIISampler evolves only the "
            "parameters suggested with the same distribution in every completed trial (its "
            "intersection search space), and each algorithm's hyperparameters exist only in its "
            "own trials, so NSGA-II would evolve the choice of algorithm alone and draw every "
            "hyperparameter at random (RandomSampler). Use sampler.name=tpe, which models each "
            "algorithm's conditional space, or one nsga2 sweep per algorithm",
        )
    population = s.population_size or NSGA2_POPULATION
    if spec.num_samples <= population:
        raise ConfigError(
            "sampler.population_size",
            f"NSGA-II draws its first generation ({population} trials) at random, so "
            f"num_samples={spec.num_samples} would never evolve: set population_size below "
            "num_samples (a few generations: num_samples >= 3 * population_size) or use "
            "sampler.name=tpe",
        )


def _optuna_store(value: str) -> str:
    """``storage.optuna`` checked: ``sqlite``, ``journal``, or an RDB URL (relative sqlite paths
    made absolute)."""
    if value in ("sqlite", "journal"):
        return value
    key = "storage.optuna"
    if "://" not in value:
        raise ConfigError(key, f"must be 'sqlite', 'journal' or a database URL (got {value!r})")
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(value)
    except ArgumentError as err:
        raise ConfigError(key, f"not a database URL: {err}") from None
    backend = url.get_backend_name()
    if backend not in _RDB_BACKENDS:
        raise ConfigError(
            key, f"Optuna's RDB storage here takes {', '.join(_RDB_BACKENDS)} URLs, not {backend!r}"
        )
    from sweeps.preflight import refuse_password, require_driver

    refuse_password(url, key)
    require_driver(url, key)
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ConfigError(key, "an in-memory sqlite store does not survive the sweep")
        return url.set(database=str(Path(url.database).expanduser().resolve())).render_as_string()
    return value


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> SweepSpec:
    """Read a sweep YAML, apply ``--set`` overrides (``base.*`` reaches the experiment) and
    validate it."""
    path = Path(path)
    raw = read_yaml(path)
    parsed = parse_overrides(overrides)
    base_over = {k[len("base.") :]: v for k, v in parsed.items() if k.startswith("base.")}
    top_over = {k: v for k, v in parsed.items() if not k.startswith("base.")}
    raw = apply_overrides(raw, top_over)
    if base_over:
        raw["_base_overrides"] = base_over
    return validate_spec(raw, base_dir=path.parent)
