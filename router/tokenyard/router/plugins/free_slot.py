"""Filter ``freeSlot``: prefer the replicas that can start the request at once."""

from __future__ import annotations

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


class FreeSlotFilter(Filter, name="freeSlot"):
    """Keeps the replicas with fewer requests in flight (``outstanding_requests``, this router's and its peers')
    than they run at once (``concurrency``, learned from their /metrics: learned_sizes.ConcurrencyCap). A request
    beyond that waits in the engine's queue until a running one ends, a whole request's time, however few tokens
    the replica owes; the load scorers, which count tokens, cannot see that cliff. It is steepest on engines
    with a small batch (llm-d-inference-sim's --max-num-seqs defaults to 5; the README's router section has
    the figures).

    A replica whose cap has not been confirmed is taken to have the smallest cap confirmed among the candidates
    (the replicas of one model are alike as a rule): counted as free, it would draw every request the others
    turn away. With no cap known anywhere every replica is free. A preference, never a rejection: when no
    replica has a free slot every candidate is kept, since waiting somewhere is the best there is. No knob: the
    cap is the engine's own, as observed."""

    def apply(self, request: RoutingRequest, candidates: list[ReplicaSnapshot]) -> list[ReplicaSnapshot]:
        caps = [replica.concurrency for replica in candidates if replica.concurrency is not None]
        if not caps:
            return list(candidates)
        fleet_cap = min(caps)
        kept = [
            replica
            for replica in candidates
            if replica.outstanding_requests
            < (replica.concurrency if replica.concurrency is not None else fleet_cap)
        ]
        return kept or list(candidates)
