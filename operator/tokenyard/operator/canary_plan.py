"""What one step of the canary state machine asks of the reconcile: groups per revision, and the traffic,
shadow and rollout fields of the status (the router reads the first two).

From the spec and the status: the state machine's `Strategy` (`strategy_from_spec`), its saved state
(`state_from_status`), and manual commands (`commands_from`: the `tokenyard.dev/rollout-command` annotation
that `kubectl tokenyard rollout promote|abort|pause|resume` writes, and `spec.paused`).

Pure: the analysis verdict is an input. The adapter asks `rollout_position` where the rollout stands (what the
analysis is to judge), fetches the verdict for it (`canary.PrometheusAnalysis.observe`, the only I/O), and
hands it to the plan (`reconcile_plan.plan`, which calls `canary_step`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.analysis import AnalysisDecision
from tokenyard.operator.groups import GroupView
from tokenyard.operator.revision import revision_hash
from tokenyard.operator.rollout import (
    AnalysisStep,
    Command,
    CommandKind,
    Observations,
    PauseReason,
    PauseStep,
    RolloutDecision,
    RolloutState,
    ScaleGroups,
    SetShadow,
    SetWeights,
    SetWeightStep,
    ShadowStep,
    Strategy,
    start_rollout,
)
from tokenyard.operator.rollout import step as rollout_step
from tokenyard.operator.snapshot import DeploymentSnapshot, Event

COMMAND_ANNOTATION = "tokenyard.dev/rollout-command"


def strategy_from_spec(spec: ModelDeploymentSpec) -> Strategy:
    steps = []
    for step in spec.rollout.steps:
        if step.set_weight is not None:
            steps.append(SetWeightStep(step.set_weight))
        elif step.pause is not None:
            steps.append(
                PauseStep(None if step.pause.duration_seconds is None else float(step.pause.duration_seconds))
            )
        elif step.shadow is not None:
            steps.append(ShadowStep(step.shadow.fraction, float(step.shadow.duration_seconds)))
        elif step.analysis is not None:
            steps.append(AnalysisStep(float(step.analysis.timeout_seconds)))
    return Strategy(
        tuple(steps),
        replicas=max(1, spec.replicas),
        # The canary gets the groups its traffic weight needs (the stable revision keeps all of its own);
        # rollout.maxSurge bounds rolling updates, not the canary's size.
        max_surge=None,
        drain_timeout_s=float(spec.rollout.drain_seconds),
        auto_rollback=spec.rollout.auto_rollback,
        analysis_interval_s=float(spec.rollout.analysis.interval_seconds),
    )


def state_from_status(status: Mapping[str, Any], update_revision: str) -> RolloutState:
    """The rollout state saved in the status, or a finished rollout of the first revision seen."""
    saved = ((status or {}).get("rollout") or {}).get("state")
    if saved:
        return RolloutState.from_dict(saved)
    return RolloutState(stable_revision=(status or {}).get("currentRevision") or update_revision)


def commands_from(annotations: Mapping[str, str], paused: bool, state: RolloutState) -> tuple[Command, ...]:
    commands: list[Command] = []
    raw = annotations.get(COMMAND_ANNOTATION)
    if raw:
        try:
            parsed = json.loads(raw)
            commands.append(Command(CommandKind(parsed["command"]), str(parsed["id"])))
        except (ValueError, KeyError, TypeError):
            pass  # a malformed annotation is reported by the adapter's event, and ignored here
    # spec.paused is level-based: translate its value into the matching command once per change.
    if paused and state.pause_reason is None and not state.phase.terminal:
        commands.append(Command(CommandKind.PAUSE, f"spec.paused@{state.canary_revision}"))
    if not paused and state.pause_reason is PauseReason.USER:
        commands.append(
            Command(CommandKind.RESUME, f"spec.unpaused@{state.canary_revision}@{state.paused_at}")
        )
    return tuple(commands)


@dataclass(frozen=True)
class AnalysisObservation:
    """What the analysis says in this reconcile: a new look (``looked_at`` set, ``status`` its status
    form), the standing verdict of the last look, or nothing (``decision`` None: no analysis running)."""

    decision: AnalysisDecision | None = None
    reason: str = ""
    looked_at: float | None = None
    status: dict | None = None


@dataclass(frozen=True)
class CanaryPlan:
    targets: Mapping[str, int]  # groups wanted per revision
    stable_revision: str  # the revision that serves (status.currentRevision)
    traffic: list[dict[str, Any]]  # [{"revision", "weight"}]
    shadow: dict[str, Any] | None  # {"revision", "fraction"}, or None when nothing is shadowed
    rollout: dict[str, Any]  # status.rollout
    # set by `canary_step`: the state before and after the step (for the rollout metrics), the events of its
    # transitions, and the status form of the analysis look made in this step (None when none was made)
    state: RolloutState | None = None
    previous_state: RolloutState | None = None
    events: tuple[Event, ...] = ()
    analysis: Mapping[str, Any] | None = None

    def status_fields(self) -> dict[str, Any]:
        return {"traffic": self.traffic, "shadow": self.shadow, "rollout": self.rollout}


# Without a canary the router spreads traffic over every ready group, whatever its revision.
NO_CANARY_STATUS: dict[str, Any] = {"traffic": [], "shadow": None, "rollout": None}


def canary_plan(
    decision: RolloutDecision, analysis_status: Mapping[str, Any] | None, previous_analysis: Any
) -> CanaryPlan:
    """The plan from the state machine's decision. The analysis shown is the one just run, or else the last
    one the status showed (between analysis intervals nothing new is measured)."""
    targets: dict[str, int] = {}
    traffic: list[dict[str, Any]] = []
    shadow = None
    for action in decision.actions:
        if isinstance(action, ScaleGroups):
            targets[action.revision] = action.groups
        elif isinstance(action, SetWeights):
            traffic = [{"revision": r, "weight": w} for r, w in action.weights.items()]
        elif isinstance(action, SetShadow) and action.revision:
            shadow = {"revision": action.revision, "fraction": action.fraction}
    state = decision.state
    return CanaryPlan(
        state=state,
        analysis=analysis_status,
        targets=targets,
        stable_revision=state.stable_revision,
        traffic=traffic,
        shadow=shadow,
        rollout={
            "phase": str(state.phase),
            "step": state.step_index,
            "reason": decision.reason,
            "stableRevision": state.stable_revision,
            "canaryRevision": state.canary_revision,
            "analysis": analysis_status or previous_analysis,
            "state": state.to_dict(),
        },
    )


@dataclass(frozen=True)
class RolloutPosition:
    """Where the canary rollout stands when a reconcile begins: what its analysis is to judge."""

    strategy: Strategy
    state: RolloutState  # from the status; a new rollout started when the spec has a new revision
    model: str  # the served model name, whose router metrics the analysis reads


def rollout_position(snapshot: DeploymentSnapshot, now: float) -> RolloutPosition:
    spec = snapshot.spec
    update_revision = revision_hash(spec)
    state = state_from_status(snapshot.status, update_revision)
    if state.phase.terminal and update_revision not in (state.stable_revision, state.rolled_back_revision):
        state = start_rollout(state, update_revision, now)
    return RolloutPosition(strategy_from_spec(spec), state, spec.model.served_model_name or snapshot.name)


def canary_step(
    snapshot: DeploymentSnapshot, groups: Sequence[GroupView], verdict: AnalysisObservation, now: float
) -> CanaryPlan:
    """One step of the canary state machine from the snapshot, the groups and the analysis verdict that the
    adapter fetched for `rollout_position(snapshot, now)` at the same `now`."""
    position = rollout_position(snapshot, now)
    observed = Observations(
        ready_groups=dict(Counter(g.revision for g in groups if g.ready)),
        analysis=verdict.decision,
        analysis_reason=verdict.reason,
        analysis_at=verdict.looked_at,
        commands=commands_from(snapshot.meta.annotations, snapshot.spec.paused, position.state),
    )
    decision = rollout_step(position.strategy, position.state, observed, now)
    plan = canary_plan(decision, verdict.status, (snapshot.status.get("rollout") or {}).get("analysis"))
    return replace(
        plan,
        previous_state=position.state,
        events=tuple(Event("Rollout", message) for message in decision.events),
    )
