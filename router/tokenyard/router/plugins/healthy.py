"""Filter ``healthy``: drops replicas that fail their health check (``ReplicaSnapshot.healthy``)."""

from __future__ import annotations

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


class HealthyFilter(Filter, name="healthy"):
    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        return replica.healthy
