"""Scorer ``prefixCache`` and its ``HotSpotGuard``: prompt tokens a replica likely caches, never piling load."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


@dataclass(frozen=True)
class HotSpotGuard:
    """Locality never piles load on one replica: a replica earns prefix credit only while its outstanding
    tokens are within ``max_ratio`` x the least-loaded candidate's plus ``slack_tokens``, and its requests in
    flight within ``max_ratio`` x the fewest plus ``slack_requests``.

    Why this shape: a popular prefix makes one replica the best match for every request that carries it; a
    pure locality score would send them all there while the others idle (the failure sglang-router's
    cache-aware policy guards with its balance thresholds). Beyond the bound the request is placed on load
    alone, which is exactly where the prefix then gets replicated - so a hot prefix spreads over as many
    replicas as its load needs. Two dimensions because a request whose prompt is cached owes few prefill
    tokens yet still occupies a decode slot for its whole output: counting tokens alone lets cheap-looking
    cached requests pile up. The slacks keep light load from flapping on small differences."""

    max_ratio: float = 1.5
    slack_tokens: int = 2048
    slack_requests: int = 4

    def bound(self, least_load: int) -> float:
        return least_load * self.max_ratio + self.slack_tokens

    def request_bound(self, fewest_requests: int) -> float:
        return fewest_requests * self.max_ratio + self.slack_requests

    def eligible(self, loads: Sequence[int], requests: Sequence[int] | None = None) -> list[bool]:
        if not loads:
            return []
        limit = self.bound(min(loads))
        if requests is None:
            return [load <= limit for load in loads]
        within = self.within_request_bound(requests)
        return [load <= limit and ok for load, ok in zip(loads, within, strict=True)]

    def within_request_bound(self, requests: Sequence[int]) -> list[bool]:
        """For each count of requests in flight, whether it is within ``request_bound`` of the fewest."""
        if not requests:
            return []
        limit = self.request_bound(min(requests))
        return [count <= limit for count in requests]

    def admits_requests(self, candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
        """For each candidate, whether its requests in flight are within ``request_bound`` of the fewest."""
        return self.within_request_bound([replica.outstanding_requests for replica in candidates])

    def admits(self, candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
        """For each candidate, whether its locality may count (``eligible`` on its tokens and requests)."""
        return self.eligible(
            [replica.outstanding_tokens for replica in candidates],
            [replica.outstanding_requests for replica in candidates],
        )


class PrefixCacheScorer(Scorer, name="prefixCache"):
    """Prompt tokens the replica most likely still caches, with the hot-spot guard applied."""

    def __init__(self, guard: HotSpotGuard | None = None) -> None:
        self.guard = guard or HotSpotGuard()

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        eligible = self.guard.admits(candidates)
        request.state.hotspot_guarded = [
            replica.name for replica, ok in zip(candidates, eligible, strict=True) if not ok
        ]
        return [
            float(request.prefix_match_tokens.get(replica.name, 0)) if ok else 0.0
            for replica, ok in zip(candidates, eligible, strict=True)
        ]
