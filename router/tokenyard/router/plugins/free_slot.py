"""Filter ``freeSlot``: prefer the replicas that can start the request at once."""

from __future__ import annotations

from collections.abc import Sequence

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
        kept = [replica for replica, free in zip(candidates, has_free_slot(candidates), strict=True) if free]
        return kept or list(candidates)


def slot_caps(candidates: Sequence[ReplicaSnapshot]) -> list[int | None]:
    """Each candidate's concurrency cap as freeSlot judges it: its own, else the smallest confirmed among the
    candidates, else None (no cap known anywhere)."""
    confirmed = [replica.concurrency for replica in candidates if replica.concurrency is not None]
    fleet_cap = min(confirmed) if confirmed else None
    return [replica.concurrency if replica.concurrency is not None else fleet_cap for replica in candidates]


def has_free_slot(candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
    """For each candidate, whether a request sent now would start at once (True where no cap is known)."""
    return [
        cap is None or replica.outstanding_requests < cap
        for replica, cap in zip(candidates, slot_caps(candidates), strict=True)
    ]


def waits_for_a_slot(request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
    """For each candidate, whether the engines have shown that this request would wait there for a batch slot
    (for a running request to end) rather than for KV blocks: its requests in flight at or past its confirmed
    cap, or with none confirmed, past the most requests any replica was seen running at once
    (``running_seen``), while its KV cache, by its last fresh scrape, has room for a prompt this long.

    Why the running count seen: a cap is confirmed only once requests have queued, which is the pile-up this is
    meant to prevent; a batch-bound engine (llm-d-inference-sim's 8 sequences) shows its cap as the fleet's
    largest running count from the first busy scrape. Why the room: an engine bound by its KV cache (a vLLM-like
    one under long prompts) runs fewer requests than it has before whenever its blocks are taken, and then a
    request waits for blocks, which the holder of its prefix needs fewest of; a cache without room for the
    whole prompt is that case. Unknown usage or capacity shows nothing. Stricter than ``has_free_slot`` in that
    an unknown cap is not free: this is for taking a credit back, not for passing a replica over."""
    caps = slot_caps(candidates)
    return [
        replica.outstanding_requests >= (cap if cap is not None else max(1, replica.running_seen))
        and replica.kv_usage is not None
        and replica.kv_capacity_tokens is not None
        and (1.0 - replica.kv_usage) * replica.kv_capacity_tokens >= request.prompt_tokens
        for replica, cap in zip(candidates, caps, strict=True)
    ]
