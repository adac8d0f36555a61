"""What one step of the canary state machine asks of the reconcile: groups per revision, and the traffic,
shadow and rollout fields of the status (the router reads the first two)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenyard.operator.rollout import RolloutDecision, ScaleGroups, SetShadow, SetWeights


@dataclass(frozen=True)
class CanaryPlan:
    targets: Mapping[str, int]  # groups wanted per revision
    stable_revision: str  # the revision that serves (status.currentRevision)
    traffic: list[dict[str, Any]]  # [{"revision", "weight"}]
    shadow: dict[str, Any] | None  # {"revision", "fraction"}, or None when nothing is shadowed
    rollout: dict[str, Any]  # status.rollout

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
