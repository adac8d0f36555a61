"""Scorer ``outstandingRequests``: the requests the router(s) have in flight on the replica."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


class OutstandingRequestsScorer(Scorer, name="outstandingRequests"):
    """Requests in flight (the classic least-outstanding-requests balancer), for configurations that want it."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [float(replica.outstanding_requests) for replica in candidates]
