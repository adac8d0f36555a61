"""Filter ``kvFits``: prefer the replicas where the request's KV blocks fit beside the requests in flight."""

from __future__ import annotations

from tokenyard.router.framework import Filter, ReplicaSnapshot, RoutingRequest


class KvFitsFilter(Filter, name="kvFits"):
    """Keeps the replicas whose KV cache can take the request now: the blocks the requests in flight there
    hold (``kv_held_tokens``, shared prefixes once) plus the blocks this request would add
    (``RoutingRequest.kv_new_tokens``: its prefix is free where requests carrying it are in flight) within the
    capacity the replica reports. An engine admits a waiting request only when its blocks fit (vLLM's
    scheduler and SGLang's alike, first come first served), so where they do not it waits for other requests
    to finish, however little compute that replica owes: the load scorers, which count compute, cannot see it.

    A preference, never a rejection: when the request fits nowhere every candidate is kept (and
    ``RequestState.fits_nowhere`` says so), since waiting somewhere is the best there is. A replica whose
    capacity is not reported, or that the request has no estimate for, always fits. It has no knob: the
    capacity is the engine's own figure and the footprint is counted, not tuned."""

    def fits(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        new = request.kv_new_tokens.get(replica.name)
        if replica.kv_capacity_tokens is None or new is None:
            return True
        return replica.kv_held_tokens + new <= replica.kv_capacity_tokens

    def apply(self, request: RoutingRequest, candidates: list[ReplicaSnapshot]) -> list[ReplicaSnapshot]:
        kept = [replica for replica in candidates if self.fits(request, replica)]
        if kept:
            return kept
        request.state.fits_nowhere = True
        return list(candidates)
