"""Scorer ``kvCache``: the free KV cache the replica reports on its /metrics."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


class KvCacheScorer(Scorer, name="kvCache"):
    """Free KV cache from the replica's own report (vllm:kv_cache_usage_perc, sglang:token_usage); unknown when
    stale or unreadable."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [replica.kv_usage for replica in candidates]
