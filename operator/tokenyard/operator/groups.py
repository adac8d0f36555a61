"""The pure core of group reconciliation: observed groups in, what to delete and how many to create out.

A group is a gang: Ready only when every member is Ready, and recreated whole when a member fails,
disappears, or cannot bind to its planned node (another workload took the GPUs) for longer than the bind
timeout. Counting is by groups, never by pods.

Updates roll group by group: new groups (at the update revision) are created up to `replicas + maxSurge`
groups in all, and an old group is removed only when the Ready groups left stay at or above
`replicas - maxUnavailable`, so serving capacity never drops below what is asked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PENDING, PLACED, READY, FAILED, TERMINATING = "Pending", "Placed", "Ready", "Failed", "Terminating"


@dataclass(frozen=True)
class MemberView:
    """One pod of a group, as the adapter read it."""

    name: str
    rank: int
    node: str | None = None  # spec.nodeName once bound
    phase: str = "Pending"  # the pod's status.phase
    ready: bool = False
    unschedulable_since: float | None = None  # when PodScheduled turned False/Unschedulable
    terminating: bool = False


@dataclass(frozen=True)
class GroupView:
    index: int
    revision: str
    size: int  # pods the group needs
    members: tuple[MemberView, ...] = ()
    planned_nodes: tuple[str, ...] = ()  # the node each live member was pinned to
    # the planned node of every rank, as recorded on the members (known even when a member's pod is gone)
    recorded_nodes: tuple[str, ...] = ()

    @property
    def phase(self) -> str:
        if any(m.terminating for m in self.members):
            return TERMINATING
        ranks = {m.rank for m in self.members}
        if ranks != set(range(self.size)) or any(m.phase in ("Failed", "Succeeded") for m in self.members):
            return FAILED
        if all(m.ready for m in self.members):
            return READY
        if all(m.node for m in self.members):
            return PLACED
        return PENDING

    @property
    def ready(self) -> bool:
        return self.phase == READY

    @property
    def ready_pods(self) -> int:
        return sum(1 for m in self.members if m.ready)

    def unbound_for(self, now: float) -> float:
        """How long the longest-waiting member has been unschedulable (0 when none is)."""
        waits = [
            now - m.unschedulable_since
            for m in self.members
            if m.unschedulable_since is not None and not m.node
        ]
        return max(waits, default=0.0)


@dataclass
class GroupDecision:
    delete: list[tuple[GroupView, str]] = field(default_factory=list)  # group and why
    create: int = 0  # new groups at the update revision
    scale_down: int = 0  # further groups of the update revision to remove; the adapter picks which
    scale_down_candidates: list[GroupView] = field(default_factory=list)


def _split_broken(
    groups: Sequence[GroupView], now: float, bind_timeout: float, decision: GroupDecision
) -> list[GroupView]:
    """Queue failed and unbindable groups for deletion (to be recreated whole); return the live ones."""
    live: list[GroupView] = []
    for group in groups:
        phase = group.phase
        if phase == TERMINATING:
            continue
        if phase == FAILED:
            decision.delete.append((group, "a member failed or disappeared; recreating the whole group"))
        elif phase == PENDING and group.unbound_for(now) > bind_timeout:
            decision.delete.append(
                (
                    group,
                    f"members did not bind to their planned nodes within {bind_timeout:.0f}s; re-planning the group",
                )
            )
        else:
            live.append(group)
    return live


def _scale_down(groups: list[GroupView], target: int, decision: GroupDecision) -> None:
    """Remove groups beyond `target`: not-ready ones first (they serve nothing); among ready ones the
    adapter asks the placement planner which removals free the most useful capacity."""
    surplus = len(groups) - target
    if surplus <= 0:
        return
    not_ready = [g for g in groups if not g.ready]
    for group in not_ready[:surplus]:
        decision.delete.append((group, f"scaling down to {target} groups"))
    decision.scale_down += surplus - min(surplus, len(not_ready))
    decision.scale_down_candidates += [g for g in groups if g.ready]


def decide(
    groups: Sequence[GroupView],
    replicas: int,
    update_revision: str,
    max_surge: int,
    max_unavailable: int,
    now: float,
    bind_timeout: float = 30.0,
) -> GroupDecision:
    """Rolling update: every group converges to `update_revision`, within the surge and unavailability budget."""
    decision = GroupDecision()
    live = _split_broken(groups, now, bind_timeout, decision)

    new = [g for g in live if g.revision == update_revision]
    old = [g for g in live if g.revision != update_revision]

    if len(new) > replicas:
        _scale_down(new, replicas, decision)
        new = new[:replicas]

    allowed_total = replicas + max_surge
    min_ready = max(0, replicas - max_unavailable)
    ready_new = sum(1 for g in new if g.ready)
    ready_total = ready_new + sum(1 for g in old if g.ready)

    # Old groups still needed: as many as the update revision lacks Ready groups.
    keep_old = max(0, replicas - ready_new)
    if len(new) < replicas and len(new) + len(old) >= allowed_total:
        # No room to surge: make room by removing old groups, as far as maxUnavailable allows.
        keep_old = min(keep_old, len(old) - (len(new) + len(old) - allowed_total + 1))
    removed_old = 0
    for group in sorted(old, key=lambda g: (g.ready, -g.index)):  # not-ready first, then newest index
        if len(old) - removed_old <= keep_old:
            break
        if group.ready and ready_total - 1 < min_ready:
            break
        decision.delete.append((group, f"replaced by revision {update_revision}"))
        removed_old += 1
        if group.ready:
            ready_total -= 1

    groups_after = len(new) + len(old) - removed_old
    decision.create = max(0, min(replicas - len(new), allowed_total - groups_after))
    return decision


@dataclass
class TargetDecision(GroupDecision):
    create_per_revision: dict[str, int] = field(default_factory=dict)


def decide_targets(
    groups: Sequence[GroupView], targets: dict[str, int], now: float, bind_timeout: float = 30.0
) -> TargetDecision:
    """Canary rollouts: each revision converges to its own group count (from the rollout state machine);
    the groups of a revision it no longer names are removed (it names a draining revision until its
    streams have finished)."""
    decision = TargetDecision()
    live = _split_broken(groups, now, bind_timeout, decision)
    for revision, target in targets.items():
        mine = [g for g in live if g.revision == revision]
        _scale_down(mine, target, decision)
        if len(mine) < target:
            decision.create_per_revision[revision] = target - len(mine)
    for group in live:
        if group.revision not in targets:
            decision.delete.append((group, f"revision {group.revision} is no longer part of the rollout"))
    return decision


def next_indices(used: set[int], count: int) -> list[int]:
    """The smallest group indices not in `used` (the indices of every group, of any revision)."""
    out: list[int] = []
    candidate = 0
    while len(out) < count:
        if candidate not in used:
            out.append(candidate)
        candidate += 1
    return out


def reusable_nodes(
    previous: Sequence[str], free_gpus: Mapping[str, int], gpus_per_pod: int
) -> tuple[str, ...] | None:
    """The nodes a recreated group ran on, when they can hold it again; else None (plan it afresh).

    A gang recreated after a member failed goes back where it was when those GPUs are still free: the
    placement was already a good one, and the nodes may hold the model's weights in their page cache.
    `free_gpus` is per eligible node (right product, ready, schedulable), the dead group's own GPUs counted free.
    """
    if not previous or any(not node for node in previous):
        return None
    for node, pods in Counter(previous).items():
        if free_gpus.get(node, 0) < pods * gpus_per_pod:
            return None
    return tuple(previous)


def return_to_previous_nodes(
    indices: Sequence[int], previous: Sequence[Sequence[str]], free_gpus: Mapping[str, int], gpus_per_pod: int
) -> dict[int, tuple[str, ...]]:
    """The new groups that go back to the nodes of the groups they replace (the others are planned afresh).

    Each new index, in order, takes the next recorded node set that still fits (`reusable_nodes`); a set that
    no longer fits is given up for good, so one taken node does not keep the other replacements from their
    own free nodes. The GPUs a returning group takes are no longer free for the sets after it.
    """
    free = dict(free_gpus)
    waiting = list(previous)
    returned: dict[int, tuple[str, ...]] = {}
    for index in indices:
        nodes = None
        while waiting and nodes is None:
            nodes = reusable_nodes(waiting.pop(0), free, gpus_per_pod)
        if nodes is None:
            continue
        for node in nodes:
            free[node] -= gpus_per_pod
        returned[index] = nodes
    return returned
