"""Scorer ``outstandingTokens`` and ``expected_load``: the tokens a replica would owe if it took the request."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer


def expected_load(request: RoutingRequest, replica: ReplicaSnapshot) -> int:
    """Outstanding tokens on the replica if this request went there: what it already owes plus the part of
    this prompt it would have to prefill (its cached prefix excluded). Both are tokens, so locality and load
    meet in one unit; the request's decode tokens are the same everywhere and left out."""
    uncached = max(0, request.prompt_tokens - request.prefix_match_tokens.get(replica.name, 0))
    return replica.outstanding_tokens + uncached


class OutstandingTokensScorer(Scorer, name="outstandingTokens"):
    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [float(expected_load(request, replica)) for replica in candidates]
