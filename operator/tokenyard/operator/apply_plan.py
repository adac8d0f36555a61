"""Applying a reconcile's plan (`reconcile_plan.ReconcilePlan`): the rollout's events and metrics, the
deletions, then the new groups, placed under the placement lock (where GPU use is read again, since another
deployment may have just placed groups) and created all at once. What goes where is decided by
`group_placement`; this module does the I/O, the ledger's reservations and the events."""

from __future__ import annotations

import asyncio
import logging
import time

from tokenyard.operator import group_placement as placing
from tokenyard.operator.group_placement import NewGroups
from tokenyard.operator.groups import next_indices
from tokenyard.operator.kube_writes import Events
from tokenyard.operator.ledger import GpuLedger
from tokenyard.operator.manifests import GroupNames
from tokenyard.operator.node_view import ClusterView
from tokenyard.operator.placement import Assignment
from tokenyard.operator.reconcile_plan import RECREATED, REMOVED, ReconcilePlan
from tokenyard.operator.runtime import Runtime
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot


async def apply_plan(
    runtime: Runtime,
    snapshot: DeploymentSnapshot,
    planned: ReconcilePlan,
    cluster: ClusterView,
    events: Events,
    logger: logging.Logger,
) -> str | None:
    """Apply everything but the status; return the capacity problem (None when every new group was placed)."""
    key = snapshot.meta.key
    if planned.canary is not None:
        canary = planned.canary
        for event in canary.events:
            events.emit(event)
        runtime.metrics.export_rollout(
            key, canary.state, canary.previous_state, canary.traffic, canary.analysis
        )

    for deletion in planned.deletions:
        group = deletion.group
        names = GroupNames(snapshot.name, snapshot.namespace, group.revision, group.index)
        # Only a group that serves has streams to drain; a not-ready one goes at once and frees its GPUs.
        await runtime.writes.delete_group(names, group, drain=deletion.kind == REMOVED and group.ready)
        if deletion.kind == RECREATED:
            runtime.metrics.groups_recreated.labels(*key).inc()
        events.emit(deletion.event)

    capacity_problem = None
    used_indices = {g.index for g in planned.remaining} | {d.group.index for d in planned.deletions}
    for revision, count in planned.creates.items():
        revision_spec = snapshot.spec_of_revision(revision, planned.update_revision)
        if revision_spec is None:
            logger.warning(
                f"cannot recreate groups of revision {revision}: its template is not in the history"
            )
            continue
        new = NewGroups(revision, revision_spec, count, planned.levels, planned.return_to.get(revision, ()))
        problem = await create_groups(runtime, snapshot.meta, events, cluster, new, used_indices)
        capacity_problem = capacity_problem or problem
    return capacity_problem


async def create_groups(
    runtime: Runtime,
    meta: DeploymentMeta,
    events: Events,
    cluster: ClusterView,
    new: NewGroups,
    used_indices: set[int],
) -> str | None:
    """Place and create the new groups; return the capacity problem when some could not be placed.
    `used_indices` is shared by every revision created in one reconcile, and grows with the new groups."""
    indices = next_indices(used_indices, new.count)
    used_indices.update(indices)
    requests = placing.group_requests(meta.name, new, indices)
    dead_pods = new.dead_pods(meta.namespace)
    gpus_per_pod = new.spec.parallelism.pod_gpus
    async with runtime.placement_lock:
        # Read GPU use inside the lock: another deployment may have just placed groups.
        started = time.perf_counter()
        now = time.time()
        returned = placing.return_to_nodes(new, requests, cluster.nodes(now, dead_pods))
        for index, assignment in returned:
            _reserve(cluster.ledger, _names(meta, new, index), assignment.nodes, gpus_per_pod, now)
        returned_indices = {index for index, _ in returned}
        # Nodes read again: the returned groups' reservations are in them now.
        placement = placing.place_new_groups(
            cluster.nodes(now, dead_pods),
            [(i, r) for i, r in requests if i not in returned_indices],
            new.levels,
            runtime.shapes.values(),
        )
        runtime.metrics.placement_seconds.observe(time.perf_counter() - started)
        for index, assignment in placement.placed:
            _reserve(cluster.ledger, _names(meta, new, index), assignment.nodes, gpus_per_pod, now)
        placed: list[tuple[int, Assignment]] = [*returned, *placement.placed]
        # Groups are independent: create them all at once (a burst of API calls, not one round trip after
        # another), and only then report the first failure, so one bad call does not hold back the rest.
        owner = meta.owner_reference()
        outcomes = await asyncio.gather(
            *(runtime.writes.create_group(owner, new.spec, _names(meta, new, i), a.nodes) for i, a in placed),
            return_exceptions=True,
        )
    first_error: BaseException | None = None
    for (index, assignment), outcome in zip(placed, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            # Its GPUs must not stay reserved for a group that was not made (pods that were made are in the
            # index and count there); the next reconcile places it again.
            _release(cluster.ledger, _names(meta, new, index), len(assignment.nodes))
            first_error = first_error or outcome
            continue
        events.emit(placing.placed_event(index, new.revision, assignment))
    warning = runtime.capacity_warnings.report(meta.key, placement.capacity_problem)
    if warning is not None:
        events.emit(warning)
    if first_error is not None:
        raise first_error
    return placement.capacity_problem


def _names(meta: DeploymentMeta, new: NewGroups, index: int) -> GroupNames:
    return GroupNames(meta.name, meta.namespace, new.revision, index)


def _reserve(
    ledger: GpuLedger, names: GroupNames, nodes: tuple[str, ...], gpus_per_pod: int, now: float
) -> None:
    for rank, node in enumerate(nodes):
        ledger.reserve(f"{names.namespace}/{names.pod(rank)}", node, gpus_per_pod, now)


def _release(ledger: GpuLedger, names: GroupNames, pods: int) -> None:
    for rank in range(pods):
        ledger.release(f"{names.namespace}/{names.pod(rank)}")
