"""Where a reconcile's new groups go, decided without I/O.

The adapter, under its placement lock, reads the nodes (GPU use from the pod index and the ledger), asks
`return_to_nodes` which replacements of dead groups go back to those groups' nodes, reserves them in the
ledger, reads the nodes again (now with those reservations) and asks `place_new_groups` for the rest. The
placement planner (`placement.plan`) decides; this module turns a revision's new groups into its requests and
its answers into assignments, events and the InsufficientCapacity message, which `CapacityWarnings` posts
once per change rather than on every reconcile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.groups import GroupView, return_to_previous_nodes
from tokenyard.operator.placement import (
    BEST_FIT,
    SPREAD,
    Assignment,
    GroupRequest,
    GroupShape,
    Node,
    TopologyLevel,
    plan,
)
from tokenyard.operator.snapshot import Event

RETURNED = "returned"  # Assignment.level of a recreated gang put back on its previous nodes


@dataclass(frozen=True)
class NewGroups:
    """Groups of one revision that a reconcile creates."""

    revision: str
    spec: ModelDeploymentSpec  # the revision's spec (an older revision's comes from the history)
    count: int
    levels: Sequence[TopologyLevel]
    # groups just deleted because a member died: their replacements return to the same nodes when those
    # still have the GPUs
    dead_groups: Sequence[GroupView]

    def shape(self) -> GroupShape:
        par = self.spec.parallelism
        return GroupShape(par.pods_per_group, par.pod_gpus, self.spec.placement.gpu_product)

    def dead_pods(self, namespace: str) -> frozenset[str]:
        """The dead groups' pods ("namespace/name"): they may still be in the index (deleted a moment ago),
        and their GPUs count as free."""
        return frozenset(f"{namespace}/{m.name}" for g in self.dead_groups for m in g.members)


def group_requests(deployment: str, new: NewGroups, indices: Sequence[int]) -> list[tuple[int, GroupRequest]]:
    """What the planner is asked for each new group index."""
    spec = new.spec
    strategy = SPREAD if spec.placement.strategy == "Spread" else BEST_FIT
    return [
        (
            index,
            GroupRequest(
                key=f"{deployment}/{index}",
                pods=spec.parallelism.pods_per_group,
                gpus_per_pod=spec.parallelism.pod_gpus,
                gpu_product=spec.placement.gpu_product,
                required_level=spec.placement.required,
                preferred_level=spec.placement.preferred,
                strategy=strategy,
            ),
        )
        for index in indices
    ]


def return_to_nodes(
    new: NewGroups, requests: Sequence[tuple[int, GroupRequest]], nodes: Iterable[Node]
) -> list[tuple[int, Assignment]]:
    """The new groups that go back, whole, to the nodes of the dead groups they replace, in index order.
    Only eligible nodes of the wanted GPU product count, with their free GPUs."""
    spec = new.spec
    par, product = spec.parallelism, spec.placement.gpu_product
    free = {n.name: n.gpu_free for n in nodes if n.eligible and (not product or n.gpu_product == product)}
    previous = [g.recorded_nodes for g in new.dead_groups if len(g.recorded_nodes) == par.pods_per_group]
    returned = return_to_previous_nodes([index for index, _ in requests], previous, free, par.pod_gpus)
    return [
        (index, Assignment(request.key, returned[index], par.pod_gpus, product or "", RETURNED))
        for index, request in requests
        if index in returned
    ]


@dataclass(frozen=True)
class NewPlacement:
    placed: tuple[tuple[int, Assignment], ...]  # (group index, where it goes), in index order
    unplaceable: tuple[str, ...]  # why each group that cannot be placed cannot

    @property
    def capacity_problem(self) -> str | None:
        """The InsufficientCapacity message (None when every group is placed)."""
        return capacity_message(self.unplaceable)


def place_new_groups(
    nodes: Iterable[Node],
    requests: Sequence[tuple[int, GroupRequest]],
    levels: Sequence[TopologyLevel],
    shapes_in_use: Iterable[GroupShape],
) -> NewPlacement:
    """Place the groups that do not return to previous nodes. `shapes_in_use` are the shapes of every
    deployment the operator runs (best fit protects their capacity); the requests' own are added."""
    shapes = {*shapes_in_use, *(request.shape for _, request in requests)}
    result = plan(nodes, [request for _, request in requests], list(levels), shapes_in_use=list(shapes))
    placed = []
    for index, request in requests:
        outcome = result.results[request.key]
        if isinstance(outcome, Assignment):
            placed.append((index, outcome))
    return NewPlacement(tuple(placed), tuple(u.reason for u in result.unplaceable))


def capacity_message(unplaceable: Sequence[str]) -> str | None:
    if not unplaceable:
        return None
    return f"{len(unplaceable)} group(s) cannot be placed: {unplaceable[0]}"


def placed_event(index: int, revision: str, assignment: Assignment) -> Event:
    where = (
        "back on the nodes of the group it replaces"
        if assignment.level == RETURNED
        else f"within one {assignment.level}"
    )
    return Event(
        "GroupPlaced", f"group {index} (revision {revision}) on {', '.join(assignment.nodes)} {where}"
    )


class CapacityWarnings:
    """The last InsufficientCapacity message posted per deployment: a message is posted when it changes, not on
    every reconcile that finds it again; once every group is placed, the next problem is posted anew."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], str] = {}

    def report(self, key: tuple[str, str], message: str | None) -> Event | None:
        """The warning to post for this reconcile's capacity problem, if any."""
        if message is None:
            self._last.pop(key, None)
            return None
        if self._last.get(key) == message:
            return None
        self._last[key] = message
        return Event("InsufficientCapacity", message, warning=True)

    @property
    def last(self) -> Mapping[tuple[str, str], str]:
        return dict(self._last)
