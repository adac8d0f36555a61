"""bench/chaos_control.py and bench/chaos_operator.py: the pure part of the chaos suite's verdict — what is
counted in a window of sampled series, where a rollout ended, which figures fail the run, and the exit code."""

import importlib.util
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parents[3] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (postponed annotations) look the module up by name
    spec.loader.exec_module(module)
    return module


cc = _load("chaos_control")
co = _load("chaos_operator")


# ---------------------------------------------------------------------------------------------- windows
def test_decreases_count_only_downward_steps_landing_inside_the_window():
    samples = [(0.0, 3), (1.0, 2), (2.0, 3), (3.0, 1), (4.0, 1), (5.0, 0)]
    assert cc.decreases_between(samples, 0.0, 10.0) == 3
    # the step 3 -> 1 lands at t=3.0: inside [2.5, 4.5); the step to 0 at 5.0 is outside
    assert cc.decreases_between(samples, 2.5, 4.5) == 1
    assert cc.decreases_between(samples, 5.0, 5.0) == 0  # an empty window counts nothing


def test_decreases_ignore_failed_reads():
    # None is a read that failed (the API server away): neither side of a step can be judged
    assert cc.decreases_between([(0.0, 3), (1.0, None), (2.0, 1)], 0.0, 3.0) == 0


def test_changes_count_every_new_value_inside_the_window():
    times = [(0.0, "a"), (1.0, "a"), (2.0, "b"), (3.0, "c"), (4.0, "c"), (5.0, "d")]
    assert cc.changes_between(times, 0.0, 10.0) == 3
    assert cc.changes_between(times, 2.5, 4.5) == 1
    assert cc.changes_between(times[:2], 0.0, 10.0) == 0  # a stalled loop writes nothing new


def test_entries_count_transitions_into_the_states_not_time_spent_there():
    phases = [
        (0.0, "Progressing"),
        (1.0, "Paused"),
        (2.0, "RollingBack"),
        (3.0, "RolledBack"),
        (4.0, "RolledBack"),
    ]
    assert cc.entries_between(phases, cc.ROLLBACK_PHASES, 0.0, 10.0) == 1
    assert cc.entries_between(phases, cc.ROLLBACK_PHASES, 2.5, 10.0) == 0  # already inside when it began
    assert cc.entries_between(phases, {"Paused"}, 0.0, 10.0) == 1


# ---------------------------------------------------------------------------------------------- rollouts
@pytest.mark.parametrize(
    "phase, current, update, outcome",
    [
        ("Healthy", "new", "new", "promoted"),
        ("RolledBack", "old", "new", "rolled-back"),
        ("Healthy", "old", "new", None),  # the operator has not started the new revision's rollout yet
        ("Paused", "old", "new", None),
        ("Progressing", "old", "new", None),
    ],
)
def test_rollout_outcome(phase, current, update, outcome):
    assert cc.rollout_outcome(phase, current, update) == outcome


def test_outcome_must_follow_the_analysis():
    assert cc.outcome_follows_analysis("promoted", "Pass")
    assert cc.outcome_follows_analysis("rolled-back", "Fail")
    assert not cc.outcome_follows_analysis("rolled-back", "Pass")
    assert not cc.outcome_follows_analysis("promoted", "Fail")
    assert not cc.outcome_follows_analysis("promoted", "Inconclusive")


def test_own_lags_follow_the_chain_and_skip_what_was_not_seen():
    reacted = {
        "back": 10.0,
        "autoscaler": 11.0,
        "operator": 14.0,
        "pod-bound": 14.5,
        "pod-ready": 15.0,
        "sim-pods": 14.9,  # seen in the same poll as the pod turning Ready: no negative lag
    }
    lags = cc.own_lags(reacted)
    assert lags == {"autoscaler": 1.0, "operator": 3.0, "pod-bound": 0.5, "pod-ready": 0.5, "sim-pods": 0.0}
    # the router never reacted: no lag for it (the scenario counts it as not resumed)
    assert "router" not in lags


def test_a_rollout_is_finished_only_for_the_new_revision():
    old_finished = {
        "status": {"updateRevision": "a", "currentRevision": "a", "rollout": {"phase": "Healthy"}}
    }
    assert co.rollout_finished(old_finished, previous_update_revision="a") is None
    new_promoted = {
        "status": {"updateRevision": "b", "currentRevision": "b", "rollout": {"phase": "Healthy"}}
    }
    assert co.rollout_finished(new_promoted, previous_update_revision="a") == "promoted"
    new_rolled_back = {
        "status": {"updateRevision": "b", "currentRevision": "a", "rollout": {"phase": "RolledBack"}}
    }
    assert co.rollout_finished(new_rolled_back, previous_update_revision="a") == "rolled-back"


# ---------------------------------------------------------------------------------------------- the verdict
def test_verdict_names_every_non_zero_must_be_zero_figure():
    results = {
        "scale-up": {"trials": 10, "duplicate_trials": 0, "orphan_pods": 2, "converge_max_seconds": 9.1},
        "prometheus-autoscaler": {"trials": 2, "scale_downs_on_missing_data": 1},
        "apiserver-restart": {"trials": 1, "not_resumed": 0, "component_restarts": 0},
    }
    failures = cc.verdict(results)
    assert failures == ["scale-up: orphan_pods = 2", "prometheus-autoscaler: scale_downs_on_missing_data = 1"]
    assert cc.exit_code(failures) == 1


def test_figures_that_may_be_non_zero_do_not_fail_the_run():
    # trials, samples, timings and the analysis' agreement with the ground truth are reported, not judged
    results = {
        "canary-steps": {"trials": 10, "samples": 700, "kills_mid_change": 8, "outcomes_as_deserved": 9}
    }
    assert cc.verdict(results) == []
    assert cc.exit_code([]) == 0


def test_a_scenario_that_broke_down_fails_the_run():
    assert cc.exit_code([], errors=["apiserver-restart: TimeoutError()"]) == 1


def test_unknown_scenario_names_are_refused_with_the_known_ones():
    assert co.selected(None) == set(co.ALL_SCENARIOS)
    assert co.selected("canary-steps, apiserver-restart") == {"canary-steps", "apiserver-restart"}
    with pytest.raises(SystemExit, match="unknown scenario.*canary-step\\b.*known: scale-up"):
        co.selected("canary-step")


def test_canary_bounds():
    # both revisions' full group sets at promotion, and never fewer ready groups than the spec asks
    assert co.CANARY.group_limit == 2 * co.CANARY_REPLICAS
    assert co.CANARY.ready_bound == co.CANARY_REPLICAS
