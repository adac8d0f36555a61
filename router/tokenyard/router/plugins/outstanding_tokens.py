"""Scorer ``outstandingTokens`` and ``expected_load``: the tokens a replica would owe if it took the request."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


def expected_load(request: RoutingRequest, replica: ReplicaSnapshot, miss_penalty: float = 0.0) -> float:
    """Outstanding tokens on the replica if this request went there: what it already owes plus the part of
    this prompt it would have to prefill (its cached prefix excluded). Both are tokens, so locality and load
    meet in one unit; the request's decode tokens are the same everywhere and left out.

    ``miss_penalty``: each uncached token counts 1 + miss_penalty times. A miss costs more than its own prefill:
    the prompt then takes KV blocks on that replica and pushes older prefixes out, which later requests miss."""
    uncached = max(0, request.prompt_tokens - request.prefix_match_tokens.get(replica.name, 0))
    return replica.outstanding_tokens + uncached * (1.0 + miss_penalty)


class OutstandingTokensScorer(Scorer, name="outstandingTokens"):
    higher_is_better = False

    def __init__(self, miss_penalty: float = 0.0) -> None:
        self.miss_penalty = miss_penalty

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [expected_load(request, replica, self.miss_penalty) for replica in candidates]
