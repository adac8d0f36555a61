"""Turning the canary state machine's decision into a typed plan and the status fields it writes."""

import pytest
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.analysis import AnalysisDecision
from tokenyard.operator.canary_plan import AnalysisObservation, canary_plan, canary_step, rollout_position
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.reconcile_plan import plan
from tokenyard.operator.revision import revision_hash
from tokenyard.operator.rollout import (
    Phase,
    PromoteRevision,
    RolloutDecision,
    RolloutState,
    ScaleGroups,
    SetShadow,
    SetWeights,
)
from tokenyard.operator.snapshot import DeploymentSnapshot, Event

STATE = RolloutState(stable_revision="old", phase=Phase.PROGRESSING, canary_revision="new", step_index=2)


def test_actions_become_targets_traffic_and_shadow():
    decision = RolloutDecision(
        state=STATE,
        actions=(
            ScaleGroups("old", 3),
            ScaleGroups("new", 1),
            SetWeights({"old": 80, "new": 20}),
            SetShadow("new", 0.5),
            PromoteRevision("new"),  # carries nothing the plan needs: the state says it
        ),
        reason="step 2",
    )
    plan = canary_plan(decision, {"decision": "Pass"}, {"decision": "Pending"})
    assert plan.targets == {"old": 3, "new": 1}
    assert plan.stable_revision == "old"
    assert plan.traffic == [{"revision": "old", "weight": 80}, {"revision": "new", "weight": 20}]
    assert plan.shadow == {"revision": "new", "fraction": 0.5}
    assert plan.rollout == {
        "phase": "Progressing",
        "step": 2,
        "reason": "step 2",
        "stableRevision": "old",
        "canaryRevision": "new",
        "analysis": {"decision": "Pass"},
        "state": STATE.to_dict(),
    }
    assert plan.status_fields() == {"traffic": plan.traffic, "shadow": plan.shadow, "rollout": plan.rollout}


def test_without_a_new_analysis_the_previous_one_is_shown_and_no_shadow_revision_means_none():
    decision = RolloutDecision(state=STATE, actions=(SetShadow(None, 0.0),), reason="waiting")
    plan = canary_plan(decision, None, {"decision": "Pending"})
    assert plan.shadow is None and plan.traffic == [] and plan.targets == {}
    assert plan.rollout["analysis"] == {"decision": "Pending"}


# --- canary_step and reconcile_plan.plan: the analysis verdict is an input, fetched by the adapter ----------


NOW = 1_000_000.0
SPEC = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}, "servedModelName": "served"},
    "engine": {"image": "vllm:1"},
    "parallelism": {"tensor": 8},
    "replicas": 2,
    "rollout": {
        "strategy": "Canary",
        "steps": [{"setWeight": 50}, {"analysis": {"timeoutSeconds": 300}}, {"setWeight": 100}],
    },
}
CANARY_REV = revision_hash(ModelDeploymentSpec.parse(SPEC))


def snapshot(rollout_state=None, **status):
    if rollout_state is not None:
        status["rollout"] = {"state": rollout_state.to_dict(), "analysis": {"decision": "Pending"}}
    return DeploymentSnapshot.from_body(
        {"metadata": {"name": "llm", "namespace": "ns", "uid": "u"}, "spec": SPEC, "status": status}
    )


def group(index, revision):
    member = MemberView(f"llm-{index}-0", 0, f"n{index}", "Running", ready=True)
    return GroupView(index, revision, 1, (member,), (f"n{index}",), (f"n{index}",))


GROUPS = [group(0, "stable"), group(1, "stable"), group(2, CANARY_REV)]
ANALYSING = RolloutState(
    stable_revision="stable",
    phase=Phase.PROGRESSING,
    canary_revision=CANARY_REV,
    step_index=1,
    step_started_at=NOW - 60,
    canary_weight=50,
)


def test_the_position_starts_a_rollout_of_a_new_revision_and_names_the_served_model():
    position = rollout_position(snapshot(currentRevision="stable"), NOW)
    assert position.state.phase == Phase.PROGRESSING
    assert (position.state.stable_revision, position.state.canary_revision) == ("stable", CANARY_REV)
    assert position.model == "served"
    assert len(position.strategy.steps) == 3


def test_a_failing_verdict_rolls_back_without_any_io():
    verdict = AnalysisObservation(AnalysisDecision.FAIL, "errors: canary worse", NOW, {"decision": "Fail"})
    step = canary_step(snapshot(ANALYSING), GROUPS, verdict, NOW)
    assert step.previous_state == ANALYSING
    assert step.state.phase == Phase.ROLLING_BACK
    assert step.rollout["analysis"] == {"decision": "Fail"}  # the look just made, not the status' last one
    assert step.analysis == {"decision": "Fail"}
    assert step.events and all(e.reason == "Rollout" and not e.warning for e in step.events)
    assert all(w["revision"] != CANARY_REV or w["weight"] == 0 for w in step.traffic)


def test_a_passing_verdict_moves_on_to_the_next_step():
    verdict = AnalysisObservation(AnalysisDecision.PASS, "no metric worse", NOW, {"decision": "Pass"})
    step = canary_step(snapshot(ANALYSING), GROUPS, verdict, NOW)
    assert step.state.step_index > ANALYSING.step_index
    assert step.state.phase in (Phase.PROGRESSING, Phase.PROMOTING)


def test_between_looks_the_last_analysis_shown_stays():
    step = canary_step(snapshot(ANALYSING), GROUPS, AnalysisObservation(AnalysisDecision.PENDING), NOW)
    assert step.state.step_index == ANALYSING.step_index and step.state.phase == Phase.PROGRESSING
    assert step.rollout["analysis"] == {"decision": "Pending"} and step.analysis is None


def test_plan_takes_the_verdict_and_carries_the_canary_step():
    verdict = AnalysisObservation(AnalysisDecision.FAIL, "errors: canary worse", NOW, {"decision": "Fail"})
    p = plan(snapshot(ANALYSING), GROUPS, [], verdict, NOW, bind_timeout=30)
    assert p.canary is not None and p.canary.state.phase == Phase.ROLLING_BACK
    assert p.rollout_status == p.canary.status_fields()
    assert p.current_revision == "stable"
    assert p.creates.get(CANARY_REV, 0) == 0  # no new canary group on the way back


def test_plan_of_a_canary_needs_the_verdict():
    with pytest.raises(ValueError, match="ns/llm: a canary rollout needs the analysis verdict"):
        plan(snapshot(ANALYSING), GROUPS, [], None, NOW, bind_timeout=30)


def test_plan_without_a_canary_ignores_the_verdict():
    body_spec = {**SPEC, "rollout": {}}
    rolling = DeploymentSnapshot.from_body(
        {"metadata": {"name": "llm", "namespace": "ns"}, "spec": body_spec}
    )
    p = plan(rolling, [], [], None, NOW, bind_timeout=30)
    assert p.canary is None and p.creates == {revision_hash(rolling.spec): 2}


def test_rollout_events_are_plain_events():
    assert Event("Rollout", "m") == Event("Rollout", "m", warning=False)
