"""What a sweep tells Optuna, and how the Optuna study stays the record of every trial.

Implemented here (issue 23 §1.3, §3.1-3.3, §4.2, §4.4):

- :class:`OutcomeRule` decides a finished trial's Optuna state from its last result, one pure
  function for the searcher and the MLflow callback alike:

  - an error: FAIL, reason ``error``; a NaN/inf training loss: FAIL, reason ``diverged``
    (Ray's OptunaSearch told the NaN objective, Optuna rejected it, and the trial stayed
    RUNNING until the sweep's end marked it "orphaned");
  - fewer rounds than the run has (``rounds_completed < rounds_total``): stopped early by ASHA,
    PRUNED. With several objectives FedSweep supports ASHA this way instead of refusing it: the
    scheduler ranks on one metric, and the stopped trial, whose epsilon is low only because it
    trained less, never lands on a front (the MLflow run is tagged ``status=PRUNED``,
    ``stopped_early=true`` and closed KILLED);
  - an objective not measured (absent or NaN in the last result): FAIL, reason
    ``objective not measured: <names>``. The trainable fills a spec's ``missing`` value only for
    the algorithms that cannot report that objective, so an unmeasured value is never invented;
  - an objective of +-inf: Optuna is told a finite stand-in, the objective's ``inf_value``
    (sign kept). Multi-objective TPE breaks ties with a hypervolume whose reference point would
    become inf and stop seeing the DP trade-off. The stand-ins are fixed before the first tell
    (stored in the study's user attrs, so a resumed sweep reuses them: values told cannot be
    revised) and recorded per trial in the user attr ``fedsweep.inf_stand_ins``. MLflow and every
    front keep the true inf. Default for ``epsilon``: 10 x the largest target epsilon the
    sweep's search spaces (and base config) can reach; without a target anywhere, 1000. Another
    objective without an ``inf_value`` that reports inf is FAIL, ``objective not finite: <names>``
    (deriving a stand-in for an unknown metric would be a guess).

- :class:`FedSweepSearch`, a subclass of Ray's ``OptunaSearch``, tells exactly that, and keeps
  the study consistent across a driver killed at any moment (§4.2). Tune saves its experiment
  state and this searcher every few seconds; what happened after the last save is lost to Tune
  but not to the Optuna store, which every ask and tell reaches at once. On restore:

  - a trial asked after the save and still RUNNING in the study (Tune has forgotten it) is
    *adopted* by Tune's next request: same Optuna trial, same parameters (the define-by-run space
    replayed on it returns the stored values), same MLflow run (found through the trial's
    ``fedsweep.mlflow_run_id`` user attr or the run's ``fedsweep.optuna_trial`` tag);
  - a trial asked after the save that already finished counts: once the study holds
    ``num_samples`` trials of this sweep the searcher answers FINISHED;
  - a trial Tune saved as running that finished afterwards is re-run by Tune (from its last saved
    checkpoint); its second completion is not told again (the first answer stands);
  - the sampler is rebuilt with the seed offset by the number of trials in the study, so its
    restored random state does not replay the lost trials' parameters.

  Trials belong to a sweep through the user attr ``fedsweep.sweep_run`` (the parent MLflow run
  id); each also carries ``fedsweep.tune_trial_id`` and, once the driver created its child run,
  ``fedsweep.mlflow_run_id`` (§4.4). Neither the storage nor the study is pickled with the
  searcher (a journal or RDB store need not pickle): a :class:`StudyLink` reopens them.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch
from ray.tune.utils.util import unflatten_dict

from sweeps.driver_time import driver_time
from sweeps.inf_values import EPSILON_INF_FACTOR, EPSILON_INF_FALLBACK, resolve_inf_values

__all__ = [
    "ATTR_MLFLOW_RUN",
    "ATTR_REASON",
    "ATTR_ROUNDS",
    "ATTR_STAND_INS",
    "ATTR_SWEEP",
    "ATTR_TUNE_TRIAL",
    "EPSILON_INF_FACTOR",
    "EPSILON_INF_FALLBACK",
    "MLFLOW_OF_STATE",
    "FedSweepSearch",
    "Outcome",
    "OutcomeRule",
    "StudyLink",
    "resolve_inf_values",
]

logger = logging.getLogger(__name__)

ATTR_SWEEP = "fedsweep.sweep_run"
ATTR_TUNE_TRIAL = "fedsweep.tune_trial_id"
ATTR_MLFLOW_RUN = "fedsweep.mlflow_run_id"
ATTR_REASON = "fedsweep.failure_reason"
ATTR_STAND_INS = "fedsweep.inf_stand_ins"
ATTR_ROUNDS = "fedsweep.rounds_completed"
_STUDY_INF_VALUES = "fedsweep.inf_values"

#: Optuna state -> (MLflow run status, the run's ``status`` tag)
MLFLOW_OF_STATE = {
    "COMPLETE": ("FINISHED", "FINISHED"),
    "FAIL": ("FAILED", "FAILED"),
    "PRUNED": ("KILLED", "PRUNED"),
}


# ----------------------------------------------------------------------------- outcome
@dataclass(frozen=True)
class Outcome:
    """A finished trial's verdict: the Optuna state and what goes with it."""

    state: str  # "COMPLETE", "FAIL" or "PRUNED"
    values: list[float] | None = None  # told to Optuna (stand-ins in place of inf)
    reason: str | None = None  # FAIL's failure_reason
    stand_ins: dict[str, float] = field(default_factory=dict)
    rounds_completed: int | None = None

    def user_attrs(self) -> dict[str, Any]:
        """The Optuna user attrs recording this outcome (set before the tell)."""
        out: dict[str, Any] = {}
        if self.reason is not None:
            out[ATTR_REASON] = self.reason
        if self.stand_ins:
            out[ATTR_STAND_INS] = dict(self.stand_ins)
        if self.rounds_completed is not None:
            out[ATTR_ROUNDS] = self.rounds_completed
        return out


def _number(value: Any) -> float | None:
    """A result value as a float; None where it is not a number or is NaN (not measured)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return None if math.isnan(value) else value


@dataclass(frozen=True)
class OutcomeRule:
    """The sweep's objectives and their inf stand-ins; :meth:`outcome` judges a last result.

    Args:
        objectives: ``(name, direction)`` pairs in the study's order.
        inf_values: objective -> its finite stand-in for inf (None: inf is not accepted).
    """

    objectives: tuple[tuple[str, str], ...]
    inf_values: Mapping[str, float | None]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.objectives]

    def outcome(self, result: Mapping[str, Any] | None, *, error: bool = False) -> Outcome:
        rounds = _number((result or {}).get("rounds_completed"))
        done = None if rounds is None else int(rounds)
        if error:
            return Outcome("FAIL", reason="error", rounds_completed=done)
        if not result:
            return Outcome("FAIL", reason=f"objective not measured: {', '.join(self.names)}")
        if result.get("diverged"):
            return Outcome("FAIL", reason="diverged", rounds_completed=done)
        total = _number(result.get("rounds_total"))
        if rounds is not None and total is not None and rounds < total:
            return Outcome("PRUNED", reason=None, rounds_completed=done)
        values = {name: _number(result.get(name)) for name in self.names}
        unmeasured = [name for name, v in values.items() if v is None]
        if unmeasured:
            return Outcome(
                "FAIL",
                reason=f"objective not measured: {', '.join(unmeasured)}",
                rounds_completed=done,
            )
        told, stand_ins, infinite = [], {}, []
        for name, v in values.items():
            if v is None:  # unreachable: unmeasured ones returned above
                continue
            if math.isinf(v):
                stand_in = self.inf_values.get(name)
                if stand_in is None:
                    infinite.append(name)
                    continue
                v = math.copysign(float(stand_in), v)
                stand_ins[name] = v
            else:
                # A finite value at or past the stand-in (an epsilon above 10x the largest
                # target, say) is told just inside it, so that inf stays strictly the extreme.
                stand_in = self.inf_values.get(name)
                if stand_in is not None and abs(v) >= stand_in:
                    inside = math.nextafter(float(stand_in), 0.0)
                    stand_ins[name] = v = math.copysign(inside, v)
            told.append(v)
        if infinite:
            return Outcome(
                "FAIL",
                reason=f"objective not finite: {', '.join(infinite)}",
                rounds_completed=done,
            )
        return Outcome("COMPLETE", values=told, stand_ins=stand_ins, rounds_completed=done)


# ----------------------------------------------------------------------------- study link
class StudyLink:
    """A picklable handle on one sweep's Optuna study: the storage is opened on first use in
    each process (from ``storage_factory``) and never pickled.

    Args:
        storage_factory: ``() -> optuna.storages.BaseStorage`` (picklable).
        study_name: the study.
        sweep_run: the sweep's id (its parent MLflow run id), the trials' ``fedsweep.sweep_run``.
    """

    def __init__(self, storage_factory: Callable[[], Any], study_name: str, sweep_run: str) -> None:
        self.storage_factory = storage_factory
        self.study_name = study_name
        self.sweep_run = sweep_run
        self._storage: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_storage"} | {"_storage": None}

    @property
    def storage(self) -> Any:
        """The study's storage, behind Optuna's own cache of finished trials where Optuna
        has one (``optuna.storages.get_storage`` wraps an RDBStorage: a finished trial is
        frozen, so a read of the study fetches only the unfinished and the new ones). The
        searcher's study shares this object: the driver's scans of the study (``find``,
        ``trials``) cost ~1 ms at 100 trials instead of ~20 ms on sqlite."""
        if self._storage is None:
            self._storage = optuna.storages.get_storage(self.storage_factory())
        return self._storage

    def study_id(self) -> int | None:
        try:
            return int(self.storage.get_study_id_from_name(self.study_name))
        except KeyError:
            return None

    def trials(self) -> list[FrozenTrial]:
        study_id = self.study_id()
        if study_id is None:
            return []
        return list(self.storage.get_all_trials(study_id, deepcopy=False))

    def get(self, storage_id: int) -> FrozenTrial:
        return self.storage.get_trial(storage_id)

    def is_ours(self, trial: FrozenTrial) -> bool:
        return trial.user_attrs.get(ATTR_SWEEP) == self.sweep_run

    def find(self, tune_trial_id: str) -> FrozenTrial | None:
        """This sweep's Optuna trial that Tune trial ``tune_trial_id`` runs (or ran last)."""
        for t in self.trials():
            if self.is_ours(t) and t.user_attrs.get(ATTR_TUNE_TRIAL) == tune_trial_id:
                return t
        return None

    def set_attr(self, trial: FrozenTrial, key: str, value: Any) -> bool:
        """Set a user attr while the trial is RUNNING (Optuna freezes finished trials)."""
        if trial.state != TrialState.RUNNING:
            return False
        try:
            self.storage.set_trial_user_attr(trial._trial_id, key, value)
        except RuntimeError:  # finished meanwhile
            return False
        return True

    def close_running(self, reason: str) -> list[FrozenTrial]:
        """FAIL this sweep's trials still RUNNING (and unmarked ones: a driver killed between
        ask and marking); returns them as they are now."""
        closed = []
        for t in self.trials():
            if t.state != TrialState.RUNNING:
                continue
            if ATTR_SWEEP in t.user_attrs and not self.is_ours(t):
                continue
            for key, value in {ATTR_SWEEP: self.sweep_run, ATTR_REASON: reason}.items():
                self.storage.set_trial_user_attr(t._trial_id, key, value)
            self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            closed.append(self.get(t._trial_id))
        return closed


# ----------------------------------------------------------------------------- searcher
class FedSweepSearch(OptunaSearch):
    """Ray's OptunaSearch, telling Optuna what :class:`OutcomeRule` decides and reconciling a
    restored state with the study (see the module docstring).

    Args:
        space: the define-by-run space (a callable).
        rule: objectives and inf stand-ins.
        link: the study.
        sampler_factory: ``seed_offset -> sampler``; the offset is the study's trial count, so a
            sampler rebuilt after a restore does not replay its lost draws.
        num_samples: the sweep's trials; once the study holds that many of this sweep's
            trials, the searcher answers FINISHED.
    """

    def __init__(
        self,
        *,
        space: Callable[[Any], Any],
        rule: OutcomeRule,
        link: StudyLink,
        sampler_factory: Callable[[int], Any],
        num_samples: int,
    ) -> None:
        self._rule = rule
        self._link = link
        self._sampler_factory = sampler_factory
        self._num_samples = num_samples
        self._trial_ids: dict[str, int] = {}  # Tune trial id -> Optuna storage trial id
        self._restored = False
        names = rule.names
        directions = [d for _, d in rule.objectives]
        super().__init__(
            space=space,
            metric=names if len(names) > 1 else names[0],
            mode=directions if len(names) > 1 else directions[0],
            sampler=sampler_factory(len(link.trials())),
            storage=link.storage,
            study_name=link.study_name,
        )
        self._inf_values = self._fix_inf_values(self._ot_study)

    def _fix_inf_values(self, study: Any) -> dict[str, float | None]:
        """The stand-ins, stored in the study before its first tell; a study that has them
        keeps them (told values cannot be revised)."""
        stored = study.user_attrs.get(_STUDY_INF_VALUES)
        wanted = dict(self._rule.inf_values)
        if stored is None:
            study.set_user_attr(_STUDY_INF_VALUES, wanted)
            return wanted
        if stored != wanted:
            logger.warning(
                "study %s keeps the inf stand-ins it was started with (%s), not %s",
                self._link.study_name,
                stored,
                wanted,
            )
        return dict(stored)

    # Neither the storage nor the study pickles in general: reopen them through the link.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_ot_study=None, _storage=None, _sampler=None, _ot_trials={})
        return state  # _ot_trials caches live optuna.Trial objects; _trial_ids is the record

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__getstate__(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self._ot_study = None  # reopened with a sampler seeded past the study's trials
        self._restored = True
        known = set(self._trial_ids.values())
        lost = [
            t for t in self._link.trials() if self._link.is_ours(t) and t._trial_id not in known
        ]
        if lost:
            logger.info(
                "sweep %s: %d trial(s) were asked after Tune's last save: %s",
                self._link.study_name,
                len(lost),
                ", ".join(f"#{t.number} {t.state.name}" for t in lost),
            )

    def _trial(self, storage_id: int) -> Any:
        """The live ``optuna.Trial`` of a RUNNING trial (made once: making one runs the
        sampler's ``before_trial``)."""
        cached = self._ot_trials.get(storage_id)
        if cached is None:
            cached = self._ot_trials[storage_id] = optuna.Trial(self._study(), storage_id)
        return cached

    def _study(self) -> Any:
        if self._ot_study is None:
            self._ot_trials = {}
            self._ot_study = optuna.load_study(
                study_name=self._link.study_name,
                storage=self._link.storage,
                sampler=self._sampler_factory(len(self._link.trials())),
                pruner=optuna.pruners.NopPruner(),
            )
        return self._ot_study

    def _orphan(self) -> FrozenTrial | None:
        """The first of this sweep's RUNNING trials that no Tune trial runs now (asked after
        Tune's last save, before the driver died); unmarked ones count after a restore."""
        known = set(self._trial_ids.values())
        for t in sorted(self._link.trials(), key=lambda t: t.number):
            if t.state != TrialState.RUNNING or t._trial_id in known:
                continue
            if self._link.is_ours(t) or (self._restored and ATTR_SWEEP not in t.user_attrs):
                return t
        return None

    @driver_time("optuna")
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not callable(self._space):
            raise TypeError("FedSweepSearch needs a define-by-run space")
        study = self._study()
        if trial_id in self._trial_ids:
            ot_trial = self._trial(self._trial_ids[trial_id])
        else:
            orphan = self._orphan()
            if orphan is not None:
                logger.info("trial %s takes over Optuna trial #%d", trial_id, orphan.number)
                ot_trial = self._trial(orphan._trial_id)
            else:
                ours = sum(1 for t in self._link.trials() if self._link.is_ours(t))
                if ours >= self._num_samples:
                    return Searcher.FINISHED
                ot_trial = study.ask()
                self._ot_trials[ot_trial._trial_id] = ot_trial
            ot_trial.set_user_attr(ATTR_SWEEP, self._link.sweep_run)
            ot_trial.set_user_attr(ATTR_TUNE_TRIAL, trial_id)
            self._trial_ids[trial_id] = ot_trial._trial_id
        params = self._suggest_from_define_by_run_func(self._space, ot_trial)
        return unflatten_dict(params)

    @driver_time("optuna")
    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        # Intermediate values exist for one objective only (Optuna's report); told as the
        # final values are: stand-ins for inf, nothing for NaN.
        names = self._rule.names
        if len(names) > 1 or trial_id in self._completed_trials:
            return
        storage_id = self._trial_ids.get(trial_id)
        value = _number(result.get(names[0]))
        step = result.get("training_iteration")
        if storage_id is None or value is None or step is None:
            return
        if math.isinf(value):
            stand_in = self._inf_values.get(names[0])
            if stand_in is None:
                return
            value = math.copysign(stand_in, value)
        if self._link.get(storage_id).state == TrialState.RUNNING:
            self._trial(storage_id).report(value, int(step))

    @driver_time("optuna")
    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if trial_id in self._completed_trials:
            logger.warning("trial %s completed twice; the first completion stands", trial_id)
            return
        self._completed_trials.add(trial_id)
        storage_id = self._trial_ids.get(trial_id)
        if storage_id is None:
            logger.warning("trial %s has no Optuna trial; nothing told", trial_id)
            return
        trial = self._link.get(storage_id)
        if trial.state.is_finished():
            # Finished before the driver restarted (Tune had not saved it): told already.
            logger.info("Optuna trial #%d was told %s already", trial.number, trial.state.name)
            return
        rule = OutcomeRule(self._rule.objectives, self._inf_values)
        outcome = rule.outcome(result, error=error)
        for key, value in outcome.user_attrs().items():
            self._link.storage.set_trial_user_attr(storage_id, key, value)
        self._study().tell(
            trial.number,
            outcome.values,
            state=TrialState[outcome.state],
            skip_if_finished=True,
        )
