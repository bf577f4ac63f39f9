"""The sweep's trial lifecycle without a Ray cluster: FedSweepSearch against a real Optuna
sqlite study, MLflowDriverCallback against a real MLflow sqlite store, and the spec pieces they
rely on (inf stand-ins, ``missing`` fills). Fast: no trial trains here."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest
from ray.tune.experiment import Trial
from ray.tune.search import Searcher

from flcore.errors import ConfigError
from search_spaces import define_by_run
from sweeps.search import (
    ATTR_MLFLOW_RUN,
    FedSweepSearch,
    OutcomeRule,
    StudyLink,
    resolve_inf_values,
)
from sweeps.spec import missing_fills, validate_spec
from sweeps.tune_tracking import MLflowDriverCallback, SweepState
from tests.integration.sweep_helpers import tiny_spec

RULE = OutcomeRule((("accuracy", "max"), ("epsilon", "min")), {"accuracy": None, "epsilon": 320.0})
DONE = {"rounds_completed": 2, "rounds_total": 2}


class _Storage:
    """Picklable storage factory (a sweep passes functools.partial(study_storage, ...))."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self) -> Any:
        return optuna.storages.RDBStorage(self.url)


class _Sampler:
    def __call__(self, offset: int) -> Any:
        return optuna.samplers.RandomSampler(seed=1 + offset)


def _searcher(tmp: Path, num_samples: int = 4, rule: OutcomeRule = RULE) -> FedSweepSearch:
    link = StudyLink(_Storage(f"sqlite:///{tmp / 's.optuna.db'}"), "s", "parent-1")
    return FedSweepSearch(
        space=define_by_run(["fedavg", "local"]),
        rule=rule,
        link=link,
        sampler_factory=_Sampler(),
        num_samples=num_samples,
    )


def _trials(tmp: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="s", storage=f"sqlite:///{tmp / 's.optuna.db'}").trials


def test_link_follows_writes_made_through_another_handle(tmp_path: Path) -> None:
    """The link reads the study through Optuna's cache of finished trials: what another
    handle (another driver, the dashboard) writes is still seen: new trials, a running
    trial's attrs, a trial that finishes."""
    url = f"sqlite:///{tmp_path / 's.optuna.db'}"
    link = StudyLink(_Storage(url), "s", "parent-1")
    other = optuna.create_study(study_name="s", storage=url, directions=["maximize"])
    done = other.ask()
    done.set_user_attr("fedsweep.sweep_run", "parent-1")
    done.set_user_attr("fedsweep.tune_trial_id", "a")
    other.tell(done, 0.5)
    assert link.find("a").state == optuna.trial.TrialState.COMPLETE
    running = other.ask()
    assert [t.state.name for t in link.trials()] == ["COMPLETE", "RUNNING"]
    assert link.find("b") is None
    running.set_user_attr("fedsweep.sweep_run", "parent-1")
    running.set_user_attr("fedsweep.tune_trial_id", "b")
    assert link.find("b").number == running.number  # attrs of a running trial: re-read
    other.tell(running, 0.7)
    found = link.find("b")
    assert found.state == optuna.trial.TrialState.COMPLETE and found.values == [0.7]
    assert link.get(running._trial_id).values == [0.7]


@pytest.mark.parametrize(
    ("result", "error", "state", "reason", "values"),
    [
        ({"accuracy": 0.5, "epsilon": 3.0, **DONE}, False, "COMPLETE", None, [0.5, 3.0]),
        # inf -> the stand-in, told; the true inf stays in MLflow
        ({"accuracy": 0.5, "epsilon": math.inf, **DONE}, False, "COMPLETE", None, [0.5, 320.0]),
        # a finite epsilon past the stand-in is told just inside it: inf stays the worst
        ({"accuracy": 0.5, "epsilon": 5000.0, **DONE}, False, "COMPLETE", None,
         [0.5, math.nextafter(320.0, 0.0)]),
        ({"accuracy": 0.5, "epsilon": math.nan, **DONE}, False, "FAIL", "objective not "
         "measured: epsilon", None),
        ({"accuracy": 0.5, **DONE}, False, "FAIL", "objective not measured: epsilon", None),
        ({"accuracy": math.inf, "epsilon": 1.0, **DONE}, False, "FAIL", "objective not "
         "finite: accuracy", None),
        ({"accuracy": 0.5, "epsilon": 1.0, "diverged": True, "rounds_completed": 1,
          "rounds_total": 2}, False, "FAIL", "diverged", None),
        # ASHA stopped it: PRUNED, whatever it measured
        ({"accuracy": 0.9, "epsilon": 0.1, "rounds_completed": 1, "rounds_total": 2}, False,
         "PRUNED", None, None),
        (None, True, "FAIL", "error", None),
        (None, False, "FAIL", "objective not measured: accuracy, epsilon", None),
    ],
)  # fmt: skip
def test_outcome_rule_judges_a_last_result(
    result: dict | None, error: bool, state: str, reason: str | None, values: list | None
) -> None:
    outcome = RULE.outcome(result, error=error)
    assert (outcome.state, outcome.reason, outcome.values) == (state, reason, values)


def test_epsilon_stand_in_defaults_to_ten_times_the_largest_reachable_target(
    tmp_path: Path,
) -> None:
    objectives = {"accuracy": "max", "epsilon": "min"}
    dp = validate_spec(
        tiny_spec(tmp_path, algorithms=["fedavg", "dp_fedavg"], objectives=objectives)
    )
    # search_spaces/dp.py: privacy.target_epsilon up to 32
    assert resolve_inf_values(dp) == {"accuracy": None, "epsilon": 320.0}
    plain = validate_spec(tiny_spec(tmp_path, objectives=objectives))
    assert resolve_inf_values(plain)["epsilon"] == 1000.0  # no target anywhere
    given = validate_spec(
        tiny_spec(tmp_path, objectives={"epsilon": {"direction": "min", "inf_value": 50}})
    )
    assert resolve_inf_values(given) == {"epsilon": 50.0}
    with pytest.raises(ConfigError, match="inf_value"):
        validate_spec(
            tiny_spec(tmp_path, objectives={"epsilon": {"direction": "min", "inf_value": -1}})
        )


def test_missing_fills_only_an_algorithm_that_cannot_report_the_objective(
    tmp_path: Path,
) -> None:
    spec = validate_spec(
        tiny_spec(
            tmp_path,
            objectives=[
                {"name": "accuracy", "direction": "max"},
                {"name": "global_accuracy", "direction": "max", "missing": 0.0},
            ],
        )
    )
    # fedavg can report global_accuracy: not measured is never 0.0 for it
    assert missing_fills(spec) == {"fedavg": {}, "local": {"global_accuracy": 0.0}}


def test_searcher_tells_fail_for_diverged_and_unmeasured_and_a_stand_in_for_inf(
    tmp_path: Path,
) -> None:
    search = _searcher(tmp_path)
    for trial_id in "abcd":
        search.suggest(trial_id)
    search.on_trial_complete("a", {"accuracy": 0.5, "epsilon": math.inf, **DONE})
    search.on_trial_complete(
        "b", {"accuracy": math.nan, "epsilon": math.inf, "diverged": True, **DONE}
    )
    search.on_trial_complete("c", {"accuracy": 0.5, "epsilon": math.nan, **DONE})
    search.on_trial_complete("d", {"accuracy": 0.5, "epsilon": 1.0, "rounds_completed": 1,
                                   "rounds_total": 2})  # fmt: skip
    a, b, c, d = _trials(tmp_path)
    assert (a.state.name, a.values) == ("COMPLETE", [0.5, 320.0])
    assert a.user_attrs["fedsweep.inf_stand_ins"] == {"epsilon": 320.0}
    # Ray's OptunaSearch told b's NaN, Optuna refused it, and b stayed RUNNING
    assert (b.state.name, b.user_attrs["fedsweep.failure_reason"]) == ("FAIL", "diverged")
    assert (c.state.name, c.user_attrs["fedsweep.failure_reason"]) == (
        "FAIL",
        "objective not measured: epsilon",
    )
    assert (d.state.name, d.user_attrs["fedsweep.rounds_completed"]) == ("PRUNED", 1)
    assert [t.user_attrs["fedsweep.tune_trial_id"] for t in (a, b, c, d)] == list("abcd")
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.optuna.db'}")
    assert study.user_attrs["fedsweep.inf_values"] == {"accuracy": None, "epsilon": 320.0}


def test_restored_searcher_takes_over_lost_trials_and_repeats_no_configuration(
    tmp_path: Path,
) -> None:
    """Tune saved the searcher after asking a, b; then a finished, c was asked and finished,
    d was asked, and the driver died. Tune restores a, b and asks for three more trials."""
    search = _searcher(tmp_path, num_samples=5)
    asked = {t: search.suggest(t) for t in "ab"}
    tuner_pkl = pickle.dumps(search)  # Tune pickles the searcher once, at the start
    search.save(str(tmp_path / "searcher.pkl"))  # ... and its state every few seconds
    search.on_trial_complete("a", {"accuracy": 0.5, "epsilon": 2.0, **DONE})
    asked |= {t: search.suggest(t) for t in "cd"}
    search.on_trial_complete("c", {"accuracy": 0.6, "epsilon": 1.0, **DONE})
    # the driver is SIGKILLed; a new one restores
    resumed = pickle.loads(tuner_pkl)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    # Tune re-runs a (saved as running): its first verdict stands
    resumed.on_trial_complete("a", {"accuracy": 0.1, "epsilon": 9.0, **DONE})
    assert _trials(tmp_path)[0].values == [0.5, 2.0]
    # d, asked after the save, is taken over with its parameters
    assert resumed.suggest("e") == asked["d"]
    # one new trial: c and d count, and the sampler does not replay c's or d's draw
    new = resumed.suggest("f")
    assert new not in asked.values()
    assert resumed.suggest("g") == Searcher.FINISHED  # a, b, c, d, f: num_samples
    for t in "bef":
        resumed.on_trial_complete(t, {"accuracy": 0.5, "epsilon": 1.0, **DONE})
    trials = _trials(tmp_path)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 5
    assert trials[3].user_attrs["fedsweep.tune_trial_id"] == "e"  # d's Optuna trial


def _callback(tmp: Path, link: StudyLink | None) -> tuple[MLflowDriverCallback, Any, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp_id = client.create_experiment("e")
    parent = client.create_run(exp_id, tags={"fedsweep.kind": "sweep"}).info.run_id
    SweepState(tmp / "state.json").set("parent_run_id", parent)
    callback = MLflowDriverCallback(
        uri=f"sqlite:///{tmp / 'mlflow.db'}",
        experiment_id=exp_id,
        state_path=str(tmp / "state.json"),
        sweep_name="s",
        trial_params=dict,
        dataset="fmnist",
        study=link,
        rule=RULE,
    )
    return callback, client, exp_id


def _children(client: Any, exp_id: str) -> list[Any]:
    runs = client.search_runs([exp_id])
    return [r for r in runs if r.data.tags.get("fedsweep.kind") != "sweep"]


def test_a_child_run_created_before_a_kill_is_found_not_made_again(tmp_path: Path) -> None:
    callback, client, exp_id = _callback(tmp_path, link=None)
    trial = Trial("FLTrainable", config={"algorithm": "fedavg"}, trial_id="t1", stub=True)
    first = callback._run_id(trial)
    # the driver died before it saved the trial -> run map
    SweepState(tmp_path / "state.json").set("trials", {})
    again = pickle.loads(pickle.dumps(callback))  # the resumed driver's copy
    assert again._run_id(trial) == first
    assert len(_children(client, exp_id)) == 1


def test_runs_end_as_their_optuna_trial_was_told_and_carry_privacy_tags(tmp_path: Path) -> None:
    search = _searcher(tmp_path)
    callback, client, exp_id = _callback(tmp_path, link=search._link)
    config = search.suggest("t1")
    trial = Trial("FLTrainable", config=config, trial_id="t1", stub=True)
    callback.on_trial_start(0, [], trial)
    privacy = {"dp_guarantee": "client-level", "dp_relation": "replace-one",
               "client_sampling": "fixed"}  # fmt: skip
    result = {"accuracy": 0.4, "epsilon": 2.0, "round": 1, "rounds_completed": 1,
              "rounds_total": 2, "privacy_tags": privacy}  # fmt: skip
    callback.on_trial_result(0, [], trial, result)
    trial.run_metadata.last_result = result
    search.on_trial_complete("t1", result)  # Tune tells the searcher first: ASHA stopped it
    callback.on_trial_complete(0, [], trial)
    callback.flush()  # the callback's writes go through its background writer
    [run] = _children(client, exp_id)
    tags = run.data.tags
    assert run.info.status == "KILLED"
    assert (tags["status"], tags["stopped_early"], tags["rounds_completed"]) == (
        "PRUNED",
        "true",
        "1",
    )
    assert {k: tags[k] for k in privacy} == privacy
    [told] = _trials(tmp_path)
    assert tags["fedsweep.optuna_trial"] == str(told.number)
    assert told.user_attrs[ATTR_MLFLOW_RUN] == run.info.run_id
    assert run.data.metrics["accuracy"] == 0.4


def test_the_callback_scans_the_study_once_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial's start, results and end each need its Optuna trial: the study is scanned for
    it once, then that trial alone is read (and still seen as the searcher tells it)."""
    search = _searcher(tmp_path)
    callback, client, exp_id = _callback(tmp_path, link=search._link)
    scans = []
    find = search._link.find
    monkeypatch.setattr(search._link, "find", lambda tid: scans.append(tid) or find(tid))
    trial = Trial("FLTrainable", config=search.suggest("t1"), trial_id="t1", stub=True)
    callback.on_trial_start(0, [], trial)
    result = {"accuracy": 0.5, "epsilon": 1.0, "round": 2, "rounds_completed": 2,
              "rounds_total": 2}  # fmt: skip
    callback.on_trial_result(0, [], trial, result)
    trial.run_metadata.last_result = result
    search.on_trial_complete("t1", result)
    callback.on_trial_complete(0, [], trial)
    callback.flush()
    assert scans == ["t1"]
    [run] = _children(client, exp_id)
    assert (run.info.status, run.data.tags["status"]) == ("FINISHED", "FINISHED")
    [told] = _trials(tmp_path)
    assert told.user_attrs[ATTR_MLFLOW_RUN] == run.info.run_id


def test_steps_a_restored_trial_re_reports_are_logged_once(tmp_path: Path) -> None:
    """A trial restored from an older checkpoint re-runs steps already logged: a retried
    attempt in the same driver, and a resumed driver (a fresh copy, its store read once a
    trial), log each step once."""
    callback, client, exp_id = _callback(tmp_path, link=None)
    trial = Trial("FLTrainable", config={"algorithm": "fedavg"}, trial_id="t1", stub=True)
    callback.on_trial_start(0, [], trial)

    def report(cb: MLflowDriverCallback, step: int) -> None:
        cb.on_trial_result(0, [], trial, {"round": step, "train_loss": 1.0 / step})

    for step in (1, 2, 3):
        report(callback, step)
    callback.on_trial_recover(0, [], trial)  # the retry restarts from its step-1 checkpoint
    for step in (2, 3, 4):
        report(callback, step)
    callback.flush()
    again = pickle.loads(pickle.dumps(callback))  # the resumed driver, from step 3's save
    for step in (4, 5):
        report(again, step)
    again.flush()
    [run] = _children(client, exp_id)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == [1, 2, 3, 4, 5]
