"""Turning the canary state machine's decision into a typed plan and the status fields it writes."""

from tokenyard.operator.canary_plan import canary_plan
from tokenyard.operator.rollout import (
    Phase,
    PromoteRevision,
    RolloutDecision,
    RolloutState,
    ScaleGroups,
    SetShadow,
    SetWeights,
)

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
