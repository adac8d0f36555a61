"""Scorer ``outstandingTokens`` and ``expected_load``: the tokens a replica would owe if it took the request."""

from __future__ import annotations

from collections.abc import Sequence

from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest, Scorer
from tokenyard.router.plugins.free_slot import known_to_wait, shown_to_start, slot_caps
from tokenyard.router.plugins.prefix_cache import HotSpotGuard


def expected_load(
    request: RoutingRequest,
    replica: ReplicaSnapshot,
    miss_penalty: float = 0.0,
    prefill_interference: bool = False,
    cache_counts: bool = True,
    batch_cap: int | None = None,
) -> float:
    """Outstanding tokens on the replica if this request went there: what it already owes plus the part of
    this prompt it would have to prefill (its cached prefix excluded). Both are tokens, so locality and load
    meet in one unit; the request's decode tokens are the same everywhere and left out.

    ``miss_penalty``: each uncached token counts 1 + miss_penalty times. A miss costs more than its own prefill:
    the prompt then takes KV blocks on that replica and pushes older prefixes out, which later requests miss.

    ``prefill_interference``: each uncached token also counts once per request in flight on the replica. An
    engine's step carries its prefill chunks and its running requests' next tokens together, so a prompt's
    prefill holds back every request running there for as long as it takes: placed beside n running requests,
    a miss costs them n times its prefill time in all (a request in flight is one more that waits). Off by
    default: it steadied zipf_tenants' tail but raised TTFT p99 on two tuning workloads (core.py, issue 14).

    ``cache_counts`` False: the replica's cached prefix saves it nothing here (the hot-spot guard holds it, see
    OutstandingTokensScorer).

    ``batch_cap``: the replica's batch size (configured or learned, free_slot.slot_caps). Given, each uncached
    token is dearer by the share of that batch already in flight (1 + n / cap): an engine's step slows as its
    batch fills (more sequences' KV read per step), and a prefill placed there crawls through the slower steps.
    A share, not a count: near nothing where the batch is large and mostly empty (vLLM's 256), up to double where
    a small batch is full."""
    cached = request.prefix_match_tokens.get(replica.name, 0) if cache_counts else 0
    uncached = max(0, request.prompt_tokens - cached)
    per_token = 1.0 + miss_penalty
    if prefill_interference:
        per_token += replica.outstanding_requests
    if batch_cap:
        per_token *= 1.0 + min(replica.outstanding_requests, batch_cap) / batch_cap
    return replica.outstanding_tokens + uncached * per_token


class OutstandingTokensScorer(Scorer, name="outstandingTokens"):
    """``expected_load`` of each candidate, lower is better.

    ``guard``: a replica that would make the request wait for a batch slot and that has far more requests in
    flight than the fewest among the candidates (the hot-spot guard's request bound, prefix_cache.HotSpotGuard)
    is scored as if it cached none of the prompt. Tokens cannot see a request's slot: a request whose prompt is
    cached owes few prefill tokens yet holds a place in the engine's batch for its whole answer, and past the
    engine's batch size it waits for a running one to end. Priced only in tokens, a popular prefix's holder
    looks cheapest however many requests it already queues, and the guard's withholding of prefixCache's
    credit alone does not stop it.

    Which replicas would make it wait: by default only those whose batch size is configured (ModelView
    .batch_size, free_slot.known_to_wait) and that hold that many requests or more; known from the first
    request, and never reached where the batch is not what binds (vLLM's default of 256). With
    ``guard_unconfigured`` (--guarded-load) also the others, judged by their learned cap or, with none
    confirmed, by the most requests any replica was seen running (free_slot.shown_to_start): a learned cap is
    confirmed only once requests have queued, after the pile-up this guard is meant to prevent, while the count
    seen stops at a small batch from the first busy scrape. On an engine bound by its KV cache or step budget
    the count seen is only the most it has run so far, and a long prefix would still be cheapest where it is
    cached: that is why the wider form stays opt-in (core.py has the figures of the forms tried).

    Why the request bound as well: where the engine starts the request at once, the holder's cached prefix
    really is prefill saved, and where every replica is full the holder is no worse a place to wait unless it
    queues far more than the others. The guard's token bound is not applied: tokens are this score's own
    measure.

    ``batch_stretch`` (a default): each candidate's uncached tokens are stretched by the share of its batch in
    flight (``expected_load``'s ``batch_cap``, the cap freeSlot judges by: learned, else the fleet's learned,
    else configured). Tokens alone price a prompt the same beside one running request or seven; on an engine
    with a small batch the seven slow its prefill by most of a step's worth each."""

    higher_is_better = False

    def __init__(
        self,
        miss_penalty: float = 0.0,
        prefill_interference: bool = False,
        guard: HotSpotGuard | None = None,
        guard_unconfigured: bool = False,
        batch_stretch: bool = False,
    ) -> None:
        self.miss_penalty = miss_penalty
        self.prefill_interference = prefill_interference
        self.guard = guard
        self.guard_unconfigured = guard_unconfigured
        self.batch_stretch = batch_stretch

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        if self.guard:
            within_bound = self.guard.admits_requests(candidates)
            if self.guard_unconfigured:
                starts = shown_to_start(candidates)
            else:
                starts = [not waits for waits in known_to_wait(candidates)]
            admitted = [ok or start for ok, start in zip(within_bound, starts, strict=True)]
        else:
            admitted = [True] * len(candidates)
        caps = slot_caps(candidates) if self.batch_stretch else [None] * len(candidates)
        return [
            expected_load(request, replica, self.miss_penalty, self.prefill_interference, cache_counts, cap)
            for replica, cache_counts, cap in zip(candidates, admitted, caps, strict=True)
        ]
