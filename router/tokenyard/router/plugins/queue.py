"""Scorer ``queue``: the requests waiting in the replica's scheduler, from its /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


class QueueScorer(Scorer, name="queue"):
    """Requests waiting in the replica's scheduler (vllm:num_requests_waiting, sglang:num_queue_reqs); unknown
    when stale or unreadable."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [replica.queue_waiting for replica in candidates]
