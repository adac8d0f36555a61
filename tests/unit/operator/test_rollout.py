"""The rollout state machine: transitions, commands, restart safety, and its invariants under random runs."""

import json

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tokenyard.operator.analysis import AnalysisDecision
from tokenyard.operator.rollout import (
    AnalysisStep,
    Command,
    CommandKind,
    Observations,
    PauseReason,
    PauseStep,
    Phase,
    PromoteRevision,
    RemoveGroups,
    RolloutState,
    ScaleGroups,
    SetShadow,
    SetWeights,
    SetWeightStep,
    ShadowStep,
    Strategy,
    analysis_look_due,
    analysis_window,
    last_analysis,
    start_rollout,
    step,
)

STABLE, CANARY = "rev-a", "rev-b"


def obs(
    stable_ready: int, canary_ready: int = 0, analysis=None, reason: str = "", commands=()
) -> Observations:
    return Observations({STABLE: stable_ready, CANARY: canary_ready}, analysis, reason, commands)


def begin(now: float = 0.0) -> RolloutState:
    return start_rollout(RolloutState(STABLE), CANARY, now)


def action(decision, kind):
    found = [a for a in decision.actions if isinstance(a, kind)]
    return found[0] if len(found) == 1 else found


def weights(decision) -> dict[str, int]:
    return action(decision, SetWeights).weights


def groups(decision) -> dict[str, int]:
    return {a.revision: a.groups for a in decision.actions if isinstance(a, ScaleGroups)}


def strategy(*steps, replicas=4, **kwargs) -> Strategy:
    return Strategy(tuple(steps), replicas, **kwargs)


# --- from the resource ----------------------------------------------------------------------------------


def test_strategy_from_the_model_deployment_spec():
    from tokenyard.core.types import ModelDeploymentSpec
    from tokenyard.operator.canary_plan import strategy_from_spec

    spec = ModelDeploymentSpec.parse(
        {
            "model": {"weights": {"uri": "hf://m"}},
            "engine": {"image": "vllm"},
            "replicas": 3,
            "rollout": {
                "strategy": "Canary",
                "maxSurge": 1,
                "drainSeconds": 45,
                "autoRollback": False,
                "steps": [
                    {"setWeight": 10},
                    {"pause": {"durationSeconds": 60}},
                    {"shadow": {"fraction": 0.2, "durationSeconds": 300}},
                    {"analysis": {"timeoutSeconds": 300}},
                    {"pause": {}},
                ],
            },
        }
    )
    parsed = strategy_from_spec(spec)
    assert parsed.steps == (
        SetWeightStep(10),
        PauseStep(60.0),
        ShadowStep(0.2, 300.0),
        AnalysisStep(300.0),
        PauseStep(None),
    )
    assert (parsed.replicas, parsed.drain_timeout_s, parsed.auto_rollback) == (3, 45.0, False)
    assert parsed.analysis_interval_s == 30.0  # spec.rollout.analysis.intervalSeconds, by default
    # The canary is sized by its weight, not by the rolling update's maxSurge: 50% of 3 groups needs 2.
    assert parsed.canary_groups_for(50) == 2


def test_canary_groups_follow_the_weight_and_the_surge():
    assert strategy(replicas=4).canary_groups_for(10) == 1
    assert strategy(replicas=4).canary_groups_for(50) == 2
    assert strategy(replicas=4, max_surge=1).canary_groups_for(50) == 1
    assert strategy(replicas=4).canary_groups_for(0) == 1  # somewhere for shadow copies to go


# --- transitions ---------------------------------------------------------------------------------------


def test_weight_waits_for_ready_groups_then_the_rollout_promotes_and_drains():
    plan = strategy(SetWeightStep(50), PauseStep(60), drain_timeout_s=30)
    state = begin()
    d = step(plan, state, obs(4, 1), 0)
    assert weights(d) == {STABLE: 100, CANARY: 0}
    assert groups(d) == {STABLE: 4, CANARY: 2}  # scaled ahead of the weight
    assert "waiting for 2 ready canary group(s), 1 ready" in d.reason
    d = step(plan, d.state, obs(4, 2), 10)
    assert weights(d) == {STABLE: 50, CANARY: 50}
    assert d.state.step_index == 1 and d.state.step_started_at == 10
    d = step(plan, d.state, obs(4, 2), 69)
    assert d.state.phase is Phase.PROGRESSING
    d = step(plan, d.state, obs(4, 2), 70)
    assert d.state.phase is Phase.PROMOTING
    assert groups(d) == {STABLE: 4, CANARY: 4}
    assert weights(d) == {STABLE: 50, CANARY: 50}  # all traffic moves only once all groups are ready
    d = step(plan, d.state, obs(4, 4), 80)
    assert action(d, PromoteRevision) == PromoteRevision(CANARY)
    assert weights(d) == {CANARY: 100, STABLE: 0}
    assert groups(d) == {CANARY: 4, STABLE: 4}  # the old stable finishes its streams
    assert action(d, RemoveGroups) == []
    d = step(plan, d.state, obs(4, 0), 110)
    assert d.state.phase is Phase.HEALTHY and d.state.stable_revision == CANARY
    assert action(d, RemoveGroups) == RemoveGroups(STABLE)


def test_failed_analysis_rolls_back_at_once_and_removes_groups_after_the_drain():
    plan = strategy(SetWeightStep(20), AnalysisStep(300), drain_timeout_s=30)
    d = step(plan, begin(), obs(4, 1), 0)
    assert weights(d) == {STABLE: 80, CANARY: 20}
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.FAIL, "errors: canary worse"), 60)
    assert d.state.phase is Phase.ROLLING_BACK
    assert "analysis failed: errors: canary worse" in d.state.message
    assert weights(d) == {STABLE: 100, CANARY: 0}
    assert groups(d) == {STABLE: 4, CANARY: 1}
    assert action(d, RemoveGroups) == []
    d = step(plan, d.state, obs(4, 1), 89)
    assert d.state.phase is Phase.ROLLING_BACK and action(d, RemoveGroups) == []
    d = step(plan, d.state, obs(4, 1), 90)
    assert d.state.phase is Phase.ROLLED_BACK
    assert d.state.rolled_back_revision == CANARY and d.state.stable_revision == STABLE
    assert action(d, RemoveGroups) == RemoveGroups(CANARY)


def test_inconclusive_analysis_pauses_and_resumes_by_itself():
    plan = strategy(SetWeightStep(20), AnalysisStep(300))
    d = step(plan, begin(), obs(4, 1), 0)
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.INCONCLUSIVE, "prometheus unreachable"), 30)
    assert d.state.phase is Phase.PAUSED and d.state.pause_reason is PauseReason.INCONCLUSIVE
    assert "prometheus unreachable" in d.state.message
    assert weights(d) == {STABLE: 80, CANARY: 20}  # held, neither rolled back nor promoted
    d = step(plan, d.state, obs(4, 1, None), 400)  # no verdict is no reason to go on
    assert d.state.phase is Phase.PAUSED
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.PENDING), 410)
    assert d.state.phase is Phase.PROGRESSING
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.PASS, "errors: within"), 420)
    assert d.state.phase is Phase.PROMOTING


def test_analysis_step_over_without_a_verdict_pauses():
    plan = strategy(AnalysisStep(60))
    d = step(plan, begin(), obs(4, 1), 0)
    assert analysis_window(plan, d.state, 30) == (0, False)
    assert analysis_window(plan, d.state, 60) == (0, True)
    d = step(plan, d.state, obs(4, 1), 60)
    assert d.state.pause_reason is PauseReason.INCONCLUSIVE


def test_analysis_looks_every_interval_and_at_the_end_and_remembers_across_a_restart():
    plan = strategy(AnalysisStep(100), AnalysisStep(100), analysis_interval_s=30)
    d = step(plan, begin(), obs(4, 1), 0)  # the first step starts at 0
    assert analysis_look_due(plan, d.state, 5)  # nothing seen yet in this window
    d = step(
        plan,
        d.state,
        Observations({STABLE: 4, CANARY: 1}, AnalysisDecision.PENDING, "undecided", analysis_at=5),
        5,
    )
    assert not analysis_look_due(plan, d.state, 20)  # 15 s after the last look
    assert last_analysis(d.state) == (AnalysisDecision.PENDING, "undecided")
    # the look time and verdict survive the status round trip (an operator restart)
    restored = RolloutState.from_dict(json.loads(json.dumps(d.state.to_dict())))
    assert restored == d.state
    assert not analysis_look_due(plan, restored, 34) and analysis_look_due(plan, restored, 35)
    # a carried verdict (no analysis_at) leaves the look time alone
    d = step(plan, restored, obs(4, 1, AnalysisDecision.PENDING, "undecided"), 20)
    assert d.state.analysis_looked_at == 5
    d = step(
        plan, d.state, Observations({STABLE: 4, CANARY: 1}, AnalysisDecision.PENDING, "", analysis_at=95), 95
    )
    assert not analysis_look_due(plan, d.state, 99)
    assert analysis_look_due(plan, d.state, 100)  # the window is over: its final look, whatever the interval
    # an inconclusive final look pauses; the analysis keeps looking at its interval, to resume by itself
    paused = step(
        plan,
        d.state,
        Observations({STABLE: 4, CANARY: 1}, AnalysisDecision.INCONCLUSIVE, "", analysis_at=100),
        100,
    )
    assert paused.state.phase is Phase.PAUSED
    assert not analysis_look_due(plan, paused.state, 110) and analysis_look_due(plan, paused.state, 130)
    d = step(
        plan,
        d.state,
        Observations({STABLE: 4, CANARY: 1}, AnalysisDecision.PASS, "passed", analysis_at=100),
        100,
    )
    assert d.state.step_index == 1 and d.state.step_started_at == 100
    # the PASS that ended the first window is not the second one's verdict: its first look is due at once
    assert analysis_look_due(plan, d.state, 101)
    assert not analysis_look_due(strategy(SetWeightStep(10)), begin(), 0)  # no analysis running


def test_a_verdict_belongs_to_its_step():
    """A PASS for one analysis step does not also pass the next one started in the same reconcile."""
    plan = strategy(AnalysisStep(60), SetWeightStep(20), AnalysisStep(60))
    d = step(plan, begin(), obs(4, 1), 0)
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.PASS), 30)
    assert d.state.step_index == 2 and d.state.phase is Phase.PROGRESSING
    assert weights(d) == {STABLE: 80, CANARY: 20}


def test_shadow_goes_only_to_a_ready_canary_and_stops_after_its_step():
    plan = strategy(ShadowStep(0.3, 60, analysis=False), SetWeightStep(10))
    d = step(plan, begin(), obs(4, 0), 0)
    assert action(d, SetShadow) == SetShadow(None, 0.0)
    d = step(plan, d.state, obs(4, 1), 5)
    assert action(d, SetShadow) == SetShadow(CANARY, 0.3)
    assert weights(d) == {STABLE: 100, CANARY: 0}
    d = step(plan, d.state, obs(4, 0), 10)  # the canary group went unready
    assert action(d, SetShadow) == SetShadow(None, 0.0)
    d = step(plan, d.state, obs(4, 1), 65)
    assert action(d, SetShadow) == SetShadow(None, 0.0)
    assert weights(d) == {STABLE: 90, CANARY: 10}


def test_canary_weight_drops_to_zero_while_its_groups_are_unready():
    plan = strategy(SetWeightStep(25), PauseStep(None))
    d = step(plan, begin(), obs(4, 1), 0)
    assert weights(d) == {STABLE: 75, CANARY: 25}
    d = step(plan, d.state, obs(4, 0), 10)
    assert weights(d) == {STABLE: 75, CANARY: 0}
    d = step(plan, d.state, obs(4, 1), 20)
    assert weights(d) == {STABLE: 75, CANARY: 25}


def test_canary_never_ready_is_rolled_back_after_the_progress_deadline():
    plan = strategy(SetWeightStep(25), progress_deadline_s=120, drain_timeout_s=0)
    d = step(plan, begin(), obs(4, 0), 0)
    d = step(plan, d.state, obs(4, 0), 119)
    assert d.state.phase is Phase.PROGRESSING
    d = step(plan, d.state, obs(4, 0), 120)
    assert d.state.phase is Phase.ROLLED_BACK
    assert "progress deadline" in d.state.message


def test_failed_analysis_without_auto_rollback_pauses_for_a_human():
    plan = strategy(SetWeightStep(20), AnalysisStep(60), auto_rollback=False)
    d = step(plan, begin(), obs(4, 1), 0)
    d = step(plan, d.state, obs(4, 1, AnalysisDecision.FAIL, "worse"), 30)
    assert d.state.pause_reason is PauseReason.ANALYSIS_FAILED
    d = step(
        plan, d.state, obs(4, 1, AnalysisDecision.FAIL, "worse", (Command(CommandKind.RESUME, "r1"),)), 40
    )
    assert d.state.pause_reason is PauseReason.ANALYSIS_FAILED
    d = step(
        plan, d.state, obs(4, 1, AnalysisDecision.FAIL, "worse", (Command(CommandKind.ABORT, "a1"),)), 50
    )
    assert d.state.phase is Phase.ROLLING_BACK


# --- commands --------------------------------------------------------------------------------------------


def test_pause_freezes_the_step_clock_and_resume_continues():
    plan = strategy(SetWeightStep(20), PauseStep(100))
    d = step(plan, begin(), obs(4, 1), 0)
    d = step(plan, d.state, obs(4, 1, commands=(Command(CommandKind.PAUSE, "p"),)), 50)
    assert d.state.pause_reason is PauseReason.USER
    d = step(plan, d.state, obs(4, 1, commands=(Command(CommandKind.PAUSE, "p"),)), 500)
    assert d.state.phase is Phase.PAUSED
    d = step(plan, d.state, obs(4, 1, commands=(Command(CommandKind.RESUME, "r"),)), 500)
    assert d.state.phase is Phase.PROGRESSING and d.state.step_started_at == 450
    d = step(plan, d.state, obs(4, 1), 549)
    assert d.state.step_index == 1
    d = step(plan, d.state, obs(4, 1), 550)
    assert d.state.phase is Phase.PROMOTING


def test_pause_until_promoted_and_promote_skips_one_step():
    plan = strategy(SetWeightStep(20), PauseStep(None), SetWeightStep(50), PauseStep(None))
    d = step(plan, begin(), obs(4, 2), 0)
    assert d.state.pause_reason is PauseReason.STEP
    d = step(plan, d.state, obs(4, 2), 10_000)
    assert d.state.phase is Phase.PAUSED
    d = step(plan, d.state, obs(4, 2, commands=(Command(CommandKind.PROMOTE, "1"),)), 10_001)
    assert weights(d) == {STABLE: 50, CANARY: 50}
    assert d.state.step_index == 3 and d.state.pause_reason is PauseReason.STEP


def test_promote_full_and_abort():
    plan = strategy(SetWeightStep(20), PauseStep(None))
    d = step(plan, begin(), obs(4, 1, commands=(Command(CommandKind.PROMOTE_FULL, "f"),)), 0)
    assert d.state.phase is Phase.PROMOTING
    d = step(plan, d.state, obs(4, 3, commands=(Command(CommandKind.ABORT, "a"),)), 10)
    assert d.state.phase is Phase.ROLLING_BACK
    assert weights(d) == {STABLE: 100, CANARY: 0}


def test_a_command_is_applied_once_even_when_seen_again_after_a_restart():
    plan = strategy(SetWeightStep(10), PauseStep(None), SetWeightStep(20), PauseStep(None), SetWeightStep(30))
    promote = Command(CommandKind.PROMOTE, "promote-1")
    d = step(plan, begin(), obs(4, 2, commands=(promote,)), 0)  # skips setWeight 10
    assert d.state.step_index == 1
    restored = RolloutState.from_dict(json.loads(json.dumps(d.state.to_dict())))
    d = step(plan, restored, obs(4, 2, commands=(promote,)), 5)
    assert d.state.step_index == 1 and d.state.pause_reason is PauseReason.STEP


def test_start_rollout_refuses_while_one_runs():
    with pytest.raises(ValueError, match="cannot start a rollout of rev-c while the rollout of rev-b"):
        start_rollout(begin(), "rev-c", 0)
    with pytest.raises(ValueError, match="already the stable revision"):
        start_rollout(RolloutState(STABLE), STABLE, 0)


def test_state_from_a_broken_status_names_the_problem():
    with pytest.raises(ValueError, match="status.rollout is not a valid rollout state"):
        RolloutState.from_dict({"phase": "Sideways", "stableRevision": "x"})


# --- properties under random runs ------------------------------------------------------------------------

step_strategy = st.one_of(
    st.builds(SetWeightStep, st.integers(0, 100)),
    st.builds(PauseStep, st.one_of(st.none(), st.sampled_from([0.0, 20.0, 60.0]))),
    st.builds(ShadowStep, st.sampled_from([0.1, 0.5, 1.0]), st.sampled_from([10.0, 40.0]), st.booleans()),
    st.builds(AnalysisStep, st.sampled_from([10.0, 60.0])),
)
tick = st.tuples(
    st.integers(0, 4),  # stable ready groups
    st.integers(0, 6),  # canary ready groups
    st.sampled_from(
        [
            None,
            AnalysisDecision.PENDING,
            AnalysisDecision.PASS,
            AnalysisDecision.FAIL,
            AnalysisDecision.INCONCLUSIVE,
        ]
    ),
    st.sampled_from([None, *CommandKind]),
)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(step_strategy, max_size=6),
    replicas=st.integers(1, 4),
    max_surge=st.one_of(st.none(), st.integers(1, 3)),
    auto_rollback=st.booleans(),
    ticks=st.lists(tick, max_size=40),
)
def test_invariants_hold_and_every_rollout_ends(steps, replicas, max_surge, auto_rollback, ticks):
    plan = Strategy(
        tuple(steps),
        replicas,
        max_surge,
        drain_timeout_s=30,
        progress_deadline_s=300,
        auto_rollback=auto_rollback,
    )
    state = begin()
    promoted = False
    rollback_started_at = None
    now = 0.0

    def check(d, stable_ready, canary_ready):
        nonlocal promoted, rollback_started_at
        ready = {STABLE: stable_ready, CANARY: canary_ready}
        for revision, weight in weights(d).items():
            assert weight == 0 or ready[revision] > 0, f"weight {weight} to unready {revision}"
        shadow = action(d, SetShadow)
        assert shadow.revision is None or ready[shadow.revision] > 0
        if action(d, PromoteRevision):
            promoted = True
            assert canary_ready >= replicas, "promoted before every canary group was ready"
        if not promoted:
            assert groups(d)[STABLE] == replicas, "stable capacity reduced before promotion"
            assert RemoveGroups(STABLE) not in d.actions
        if d.state.phase is Phase.ROLLING_BACK and rollback_started_at is None:
            rollback_started_at = now
        if rollback_started_at is not None:
            assert weights(d).get(CANARY, 0) == 0
            if RemoveGroups(CANARY) in d.actions:
                assert now >= rollback_started_at + plan.drain_timeout_s
        # the state survives the trip through the resource's status
        assert RolloutState.from_dict(json.loads(json.dumps(d.state.to_dict()))) == d.state

    for i, (stable_ready, canary_ready, verdict, command) in enumerate(ticks):
        commands = () if command is None else (Command(command, f"c{i}"),)
        d = step(plan, state, obs(stable_ready, canary_ready, verdict, "v", commands), now)
        check(d, stable_ready, canary_ready)
        state = d.state
        now += 7.0

    # Then the world settles: every group ready, the analysis passes, and someone presses promote
    # from time to time. The rollout must end.
    for i in range(200):
        if state.phase.terminal:
            break
        commands = (Command(CommandKind.PROMOTE, f"settle{i}"),) if i % 10 == 9 else ()
        d = step(plan, state, obs(replicas, max(replicas, 6), AnalysisDecision.PASS, "ok", commands), now)
        check(d, replicas, max(replicas, 6))
        state = d.state
        now += 7.0
    assert state.phase.terminal, state
    assert state.canary_revision is None
    event(f"ended {state.phase}, promoted={promoted}")
