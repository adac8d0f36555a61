"""What one reconcile of a ModelDeployment does, decided without I/O: `plan` -> `ReconcilePlan`.

The adapter reads (the snapshot, the groups from the pod index, the nodes, and, for a canary rollout, the
analysis verdict it fetched for `canary_plan.rollout_position`), calls `plan`, and applies the plan: posts the
rollout's events, deletes the groups in `deletions` and emits each one's event, creates `creates[revision]`
groups per revision (placing them under the placement lock, where GPU use is read again; the replacements of
`return_to[revision]` go back to those groups' nodes when they still fit), and writes the status computed over
`remaining`.

The counting is `groups.decide` (rolling update) or `groups.decide_targets` (canary targets per revision,
from `canary_plan.canary_step`); which ready groups go on a scale-down is the placement planner's
`choose_scale_down`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenyard.core.types import ModelDeploymentSpec, RolloutStrategy
from tokenyard.operator.canary_plan import NO_CANARY_STATUS, AnalysisObservation, CanaryPlan, canary_step
from tokenyard.operator.groups import FAILED, GroupDecision, GroupView, decide, decide_targets
from tokenyard.operator.placement import Assignment, Node, TopologyLevel, choose_scale_down
from tokenyard.operator.revision import revision_hash
from tokenyard.operator.snapshot import DeploymentSnapshot, Event

RECREATED, REMOVED = "recreated", "removed"  # Deletion.kind


@dataclass(frozen=True)
class Deletion:
    group: GroupView
    reason: str
    kind: str  # RECREATED (a member died, or it could not bind: a new group replaces it) or REMOVED

    @property
    def event(self) -> Event:
        if self.kind == RECREATED:
            return Event("GroupRecreated", f"group {self.group.index}: {self.reason}", warning=True)
        return Event(
            "GroupRemoved", f"group {self.group.index} (revision {self.group.revision}): {self.reason}"
        )


@dataclass(frozen=True)
class ReconcilePlan:
    update_revision: str  # the revision of the current spec
    levels: tuple[TopologyLevel, ...]  # the placement topology, innermost first
    deletions: tuple[Deletion, ...]  # in the order to delete
    creates: Mapping[str, int]  # new groups per revision
    # per revision, the groups deleted because a member died: their replacements return to their nodes
    return_to: Mapping[str, tuple[GroupView, ...]]
    remaining: tuple[GroupView, ...]  # the groups the status counts: every group not deleted
    rollout_status: Mapping[str, Any]  # status.traffic, .shadow and .rollout
    current_revision: str | None  # the revision that serves, when the rollout says (else the status decides)
    canary: CanaryPlan | None = None  # the canary step taken (its events and metrics), when a canary runs

    @property
    def events(self) -> list[Event]:
        """The events of the deletions, in order (the adapter posts each once its group is deleted)."""
        return [d.event for d in self.deletions]


def plan(
    snapshot: DeploymentSnapshot,
    groups: Sequence[GroupView],
    nodes: Sequence[Node],
    verdict: AnalysisObservation | None,
    now: float,
    bind_timeout: float,
) -> ReconcilePlan:
    """The reconcile's plan. `verdict` is what the rollout analysis says for `canary_plan.rollout_position`
    at this `now` (the adapter fetched it), required when the strategy is Canary and ignored otherwise."""
    canary = None
    if snapshot.spec.rollout.strategy == RolloutStrategy.CANARY:
        if verdict is None:
            raise ValueError(
                f"{snapshot.namespace}/{snapshot.name}: a canary rollout needs the analysis verdict"
            )
        canary = canary_step(snapshot, groups, verdict, now)
    return plan_reconcile(snapshot, groups, nodes, canary, now, bind_timeout)


def plan_reconcile(
    snapshot: DeploymentSnapshot,
    groups: Sequence[GroupView],
    nodes: Sequence[Node],
    canary: CanaryPlan | None,
    now: float,
    bind_timeout: float,
) -> ReconcilePlan:
    """`canary` is this reconcile's step of the canary state machine, required when the strategy is Canary
    (and ignored otherwise); `nodes` are the cluster's, with the GPUs in use (to choose what to scale down)."""
    spec = snapshot.spec
    update_revision = revision_hash(spec)
    decision: GroupDecision
    if spec.rollout.strategy == RolloutStrategy.CANARY:
        if canary is None:
            raise ValueError(f"{snapshot.namespace}/{snapshot.name}: a canary rollout needs its canary plan")
        targets = decide_targets(groups, dict(canary.targets), now, bind_timeout)
        decision, creates = targets, dict(targets.create_per_revision)
        rollout_status, current_revision = canary.status_fields(), canary.stable_revision
    else:
        decision = decide(
            groups,
            replicas=spec.replicas,
            update_revision=update_revision,
            max_surge=spec.rollout.max_surge,
            max_unavailable=spec.rollout.max_unavailable,
            now=now,
            bind_timeout=bind_timeout,
        )
        creates = {update_revision: decision.create} if decision.create else {}
        rollout_status, current_revision = NO_CANARY_STATUS, None
    levels = tuple(TopologyLevel(level.name, level.node_label) for level in spec.placement.topology)

    to_delete = list(decision.delete)
    if decision.scale_down:
        chosen = choose_scale_down(
            [_assignment(snapshot.name, g, nodes, spec) for g in decision.scale_down_candidates],
            nodes,
            decision.scale_down,
            list(levels),
        )
        by_key = {_group_key(snapshot.name, g): g for g in decision.scale_down_candidates}
        to_delete += [(by_key[k], f"scaling down to {spec.replicas} groups") for k in chosen]

    deletions = tuple(Deletion(g, reason, _kind(g, reason)) for g, reason in to_delete)
    # Gangs recreated because a member died go back to their nodes when those are still free; groups
    # re-planned because they could not bind do not (their nodes were taken).
    return_to: dict[str, tuple[GroupView, ...]] = {}
    for deletion in deletions:
        if deletion.group.phase == FAILED:
            revision = deletion.group.revision
            return_to[revision] = (*return_to.get(revision, ()), deletion.group)
    deleted = {(d.group.index, d.group.revision) for d in deletions}
    return ReconcilePlan(
        update_revision=update_revision,
        levels=levels,
        deletions=deletions,
        creates=creates,
        return_to=return_to,
        remaining=tuple(g for g in groups if (g.index, g.revision) not in deleted),
        rollout_status=rollout_status,
        current_revision=current_revision,
        canary=canary if spec.rollout.strategy == RolloutStrategy.CANARY else None,
    )


def _kind(group: GroupView, reason: str) -> str:
    # `groups.decide` re-plans a group whose members could not bind: it is replaced, like a failed one.
    return RECREATED if group.phase == FAILED or "re-planning" in reason else REMOVED


def _group_key(name: str, group: GroupView) -> str:
    # Indices are unique per deployment, but during a rollout two revisions' groups are compared together.
    return f"{name}/{group.revision}/{group.index}"


def _assignment(name: str, group: GroupView, nodes: Sequence[Node], spec: ModelDeploymentSpec) -> Assignment:
    nodes_of_group = tuple(m.node or "" for m in group.members)
    products = {n.name: n.gpu_product for n in nodes}
    return Assignment(
        group_key=_group_key(name, group),
        nodes=nodes_of_group,
        gpus_per_pod=spec.parallelism.pod_gpus,
        gpu_product=products.get(nodes_of_group[0], "") if nodes_of_group else "",
        level="cluster",
    )
