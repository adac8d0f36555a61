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
    turn away. With no cap learned anywhere, a replica's configured batch size (ModelView.batch_size) is its cap
    from the first request; with neither, every replica is free. A preference, never a rejection: when no
    replica has a free slot every candidate is kept, since waiting somewhere is the best there is. No knob: the
    cap is the engine's own, as observed or as its arguments configure it."""

    def apply(self, request: RoutingRequest, candidates: list[ReplicaSnapshot]) -> list[ReplicaSnapshot]:
        free_slots = has_free_slot(candidates, request.samples)
        kept = [replica for replica, free in zip(candidates, free_slots, strict=True) if free]
        return kept or list(candidates)


def slot_caps(candidates: Sequence[ReplicaSnapshot]) -> list[int | None]:
    """Each candidate's concurrency cap as freeSlot judges it: its own learned cap, else the smallest learned
    among the candidates, else its configured batch size, else None (nothing known). Learned first: an engine
    whose KV cache is too small for its batch runs fewer than configured."""
    confirmed = [replica.concurrency for replica in candidates if replica.concurrency is not None]
    fleet_cap = min(confirmed) if confirmed else None
    return [
        replica.concurrency
        if replica.concurrency is not None
        else (fleet_cap if fleet_cap is not None else replica.batch_size)
        for replica in candidates
    ]


def has_free_slot(candidates: Sequence[ReplicaSnapshot], samples: int = 1) -> list[bool]:
    """For each candidate, whether a request sent now would start at once (True where no cap is known): all of
    its ``samples`` (its ``n``) fit beside the requests in flight."""
    return [
        cap is None or replica.outstanding_requests + samples <= cap
        for replica, cap in zip(candidates, slot_caps(candidates), strict=True)
    ]


def shown_to_start(candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
    """For each candidate, whether the engines have shown that a request sent now would start at once: below
    its cap where one is confirmed, else below the most requests any replica was seen running at once
    (``running_seen``; nothing is shown before the first scrape). Stricter than ``has_free_slot``, which
    counts an unknown cap as free: this is for taking back a credit, not for passing a replica over."""
    return [
        replica.outstanding_requests < (cap if cap is not None else replica.running_seen)
        for replica, cap in zip(candidates, slot_caps(candidates), strict=True)
    ]


def known_to_wait(candidates: Sequence[ReplicaSnapshot]) -> list[bool]:
    """For each candidate, whether its batch size is configured and full: a request sent now would wait for a
    running one to end. By the configured size alone, not a learned cap: a cap learned on an engine bound by its
    KV cache or step budget is only where it last queued, and a long prefix may still be cheapest where it is
    cached. False wherever no batch size is configured: then nothing is known before a queue shows."""
    return [
        replica.batch_size is not None and replica.outstanding_requests >= replica.batch_size
        for replica in candidates
    ]
