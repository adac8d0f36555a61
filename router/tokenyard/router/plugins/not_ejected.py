"""Filter ``notEjected``: drops replicas that outlier ejection took out (``ReplicaSnapshot.ejected``)."""

from __future__ import annotations

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


class NotEjectedFilter(Filter, name="notEjected"):
    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        return not replica.ejected
