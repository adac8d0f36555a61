"""The status of a ModelDeployment, computed from what a reconcile observed and decided (no I/O, no clock).

The way the ReplicaSet controller has `calculateStatus`: the adapter gathers the groups, the nodes and what
the rollout said, calls `compute_status`, and patches the result as it is.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.core.types import TopologyLevel as TopologyLevelSpec
from tokenyard.operator.groups import FAILED, GroupView
from tokenyard.operator.manifests import selector
from tokenyard.operator.placement import Node
from tokenyard.operator.revision import revision_template
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot

HISTORY_LIMIT = 10  # revisions kept in status.revisionHistory (what a rollback or an undo can go back to)


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: str  # "True" or "False"
    reason: str
    message: str


TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # how Kubernetes writes times: RFC 3339, seconds, UTC


def timestamp(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime(TIMESTAMP_FORMAT)


def parse_timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.strptime(value, TIMESTAMP_FORMAT).replace(tzinfo=dt.UTC).timestamp()


def merge_conditions(
    previous: Sequence[Mapping[str, Any]],
    updates: Sequence[ConditionUpdate],
    generation: int | None,
    now: float,
) -> list[dict[str, Any]]:
    """The previous conditions with `updates` applied. lastTransitionTime moves only when a condition's
    status changes; conditions not updated are kept as they were."""
    merged = {c["type"]: dict(c) for c in previous}
    for update in updates:
        old = merged.get(update.type)
        changed = old is None or old.get("status") != update.status
        merged[update.type] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": timestamp(now)
            if changed
            else old.get("lastTransitionTime", timestamp(now)),
            "observedGeneration": generation,
        }
    return list(merged.values())


def group_conditions(
    spec: ModelDeploymentSpec, groups: Sequence[GroupView], update_revision: str, capacity_problem: str | None
) -> list[ConditionUpdate]:
    ready = sum(1 for g in groups if g.ready)
    updated = [g for g in groups if g.revision == update_revision]
    failed = sum(1 for g in groups if g.phase == FAILED)
    min_ready = max(0, spec.replicas - spec.rollout.max_unavailable)
    available = ready >= min_ready and (spec.replicas == 0 or ready > 0)
    done = len(updated) == spec.replicas == len(groups) and all(g.ready for g in updated)
    return [
        ConditionUpdate(
            "Available",
            "True" if available else "False",
            "MinimumGroupsReady" if available else "TooFewGroupsReady",
            f"{ready} of {spec.replicas} groups ready",
        ),
        ConditionUpdate(
            "Progressing",
            "False" if done else "True",
            "Converged" if done else "ReconcilingGroups",
            f"{len(updated)} of {spec.replicas} groups at revision {update_revision}",
        ),
        ConditionUpdate(
            "Degraded",
            "True" if failed else "False",
            "GroupFailed" if failed else "AllGroupsHealthy",
            f"{failed} group(s) failed and are being recreated" if failed else "no failed group",
        ),
        ConditionUpdate(
            "InsufficientCapacity",
            "True" if capacity_problem else "False",
            "NotEnoughGPUs" if capacity_problem else "Placed",
            capacity_problem or "every group is placed",
        ),
    ]


def current_revision(
    groups: Sequence[GroupView], update_revision: str, previous: str | None, rollout_stable: str | None
) -> str:
    """The revision that serves: the rollout's stable revision when a canary runs; otherwise the one with the
    most ready groups (the update revision on a tie); otherwise what it was; the update revision at first."""
    if rollout_stable:
        return rollout_stable
    ready = Counter(g.revision for g in groups if g.ready)
    if ready:
        return max(ready, key=lambda r: (ready[r], r == update_revision))
    return previous or update_revision


def revision_history(
    previous: Sequence[Mapping[str, Any]],
    spec: ModelDeploymentSpec,
    update_revision: str,
    now: float,
    limit: int = HISTORY_LIMIT,
) -> list[Mapping[str, Any]]:
    """The history with the update revision recorded (its template, for rollback and undo), oldest first and
    at most `limit` long; a revision already recorded keeps its place and its creation time."""
    history = list(previous)
    if any(h.get("revision") == update_revision for h in history):
        return history
    history.append(
        {"revision": update_revision, "created": timestamp(now), "template": revision_template(spec)}
    )
    return history[-limit:]


def group_domain(
    group: GroupView, nodes_by_name: Mapping[str, Node], topology: Sequence[TopologyLevelSpec]
) -> str | None:
    """The innermost topology domain ("level/value") holding every member of the group, if all are bound."""
    members = [nodes_by_name.get(m.node or "") for m in group.members]
    if not members or any(n is None for n in members):
        return None
    for level in topology:
        values = {n.labels.get(level.node_label) for n in members}
        if len(values) == 1 and None not in values:
            return f"{level.name}/{values.pop()}"
    return None


def compute_status(
    snapshot: DeploymentSnapshot,
    update_revision: str,
    groups: Sequence[GroupView],
    nodes: Sequence[Node],
    capacity_problem: str | None,
    rollout_status: Mapping[str, Any],
    rollout_stable: str | None,
    now: float,
) -> dict[str, Any]:
    """The status patch after a reconcile. `groups` are those left after its deletions; `rollout_status` is
    the traffic, shadow and rollout fields; `rollout_stable` the canary's stable revision, when a canary runs."""
    spec, previous = snapshot.spec, snapshot.status
    nodes_by_name = {n.name: n for n in nodes}
    conditions = group_conditions(spec, groups, update_revision, capacity_problem)
    return {
        "observedGeneration": snapshot.meta.generation,
        "replicas": len(groups),
        "placedReplicas": sum(1 for g in groups if all(m.node for m in g.members)),
        "readyReplicas": sum(1 for g in groups if g.ready),
        "updatedReplicas": sum(1 for g in groups if g.revision == update_revision),
        "selector": selector(snapshot.name),
        "currentRevision": current_revision(
            groups, update_revision, previous.get("currentRevision"), rollout_stable
        ),
        "updateRevision": update_revision,
        "revisionHistory": revision_history(
            previous.get("revisionHistory") or [], spec, update_revision, now
        ),
        "groups": [
            {
                "index": g.index,
                "revision": g.revision,
                "phase": g.phase,
                "nodes": [m.node or planned for m, planned in zip(g.members, g.planned_nodes, strict=False)],
                "domain": group_domain(g, nodes_by_name, spec.placement.topology),
                "readyPods": g.ready_pods,
                "pods": g.size,
            }
            for g in groups
        ],
        "conditions": merge_conditions(
            previous.get("conditions") or [], conditions, snapshot.meta.generation, now
        ),
        **rollout_status,
    }


def invalid_spec_status(meta: DeploymentMeta, error: str, now: float) -> dict[str, Any]:
    """The status patch when the spec does not parse: Degraded, and nothing else touched."""
    degraded = ConditionUpdate("Degraded", "True", "InvalidSpec", error)
    return {
        "conditions": merge_conditions(meta.status.get("conditions") or [], [degraded], meta.generation, now)
    }
