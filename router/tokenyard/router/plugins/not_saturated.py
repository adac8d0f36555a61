"""Filter ``notSaturated`` and its ``SaturationLimits``: drops full replicas, and says so when none is left."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


@dataclass
class SaturationLimits:
    """A replica is saturated when the router already has this many requests in flight on it, or when it
    reports this many waiting requests (fresh metrics only)."""

    max_outstanding_requests: int = 256
    max_queue_waiting: float = 128


class NotSaturatedFilter(Filter, name="notSaturated"):
    """Drops saturated replicas; when none is left, marks the request ``saturated`` (a 429 with Retry-After,
    not a 503: the replicas are there, only full). Runs after the other filters that may reject (only kvFits,
    and freeSlot, which never leave none, may follow), so that saturation is judged among the replicas the request may go to."""

    def __init__(self, limits: SaturationLimits | None = None) -> None:
        self.limits = limits or SaturationLimits()

    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        if replica.outstanding_requests >= self.limits.max_outstanding_requests:
            return False
        return replica.queue_waiting is None or replica.queue_waiting < self.limits.max_queue_waiting

    def none_left(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> str:
        request.state.saturated = True
        return f"all {len(candidates)} replicas are saturated"
