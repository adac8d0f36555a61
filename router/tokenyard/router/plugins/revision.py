"""Filter ``revision`` and ``choose_revision``: the canary split picks a revision, the filter keeps it."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


class RevisionFilter(Filter, name="revision"):
    """Keeps the revision the canary split chose for this request (``request.state.revision``)."""

    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        wanted = request.state.revision
        return wanted is None or replica.revision == wanted


def choose_revision(traffic: Sequence[tuple[str, float]], available: set[str], draw: float) -> str | None:
    """The revision a request goes to, given the traffic weights and a uniform draw in [0, 1).

    Weights of revisions with no available replica are dropped and the rest renormalised, so a canary whose
    pods are all down does not turn its share into errors. Returns None (no constraint) when no weight
    applies: empty traffic means every ready replica regardless of revision."""
    usable = [(rev, float(weight)) for rev, weight in traffic if weight > 0 and rev in available]
    total = sum(weight for _, weight in usable)
    if total <= 0:
        return None
    point = draw * total
    for rev, weight in usable:
        point -= weight
        if point < 0:
            return rev
    return usable[-1][0]
