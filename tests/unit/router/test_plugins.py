"""The built-in plug-ins (router/tokenyard/router/plugins/), one section per plug-in file."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.router.core import DEFAULT_FILTERS, DEFAULT_MISS_PENALTY, Pipeline
from tokenyard.router.framework import NEUTRAL_SCORE, RoutingRequest
from tokenyard.router.plugins.free_slot import FreeSlotFilter, slot_caps
from tokenyard.router.plugins.kv_cache import KvCacheScorer
from tokenyard.router.plugins.kv_fits import KvFitsFilter
from tokenyard.router.plugins.not_saturated import NotSaturatedFilter, SaturationLimits
from tokenyard.router.plugins.outstanding_tokens import OutstandingTokensScorer
from tokenyard.router.plugins.prefix_cache import HotSpotGuard, PrefixCacheScorer
from tokenyard.router.plugins.queue import QueueScorer
from tokenyard.router.plugins.revision import choose_revision

from .test_core import request, snap

# --- notSaturated -----------------------------------------------------------------------------------------


def test_pipeline_reports_saturation():
    pipeline = Pipeline.from_config(saturation=SaturationLimits(max_outstanding_requests=2))
    req = request()
    decision = pipeline.decide(req, [snap("a", outstanding_requests=2)], random.Random(0))
    assert decision.replica is None and req.state.saturated


def test_saturation_is_a_filter_of_the_pipeline():
    limits = SaturationLimits(max_outstanding_requests=2)
    pipeline = Pipeline.from_config(saturation=limits)
    saturated = [f for f in pipeline.filters if isinstance(f, NotSaturatedFilter)]
    assert len(saturated) == 1 and saturated[0].limits is limits
    # the filters that may reject all run before it; only those that never leave none follow
    later = pipeline.filters[pipeline.filters.index(saturated[0]) + 1 :]
    assert all(f.name in ("freeSlot", "kvFits") for f in later)
    request = RoutingRequest("m", 10, 10)
    decision = pipeline.decide(request, [snap("full", outstanding_requests=2), snap("ok")], random.Random(0))
    assert decision.replica.name == "ok" and not request.state.saturated
    # a configuration without the filter routes to a full replica (the check is the plug-in, nowhere else)
    unchecked = Pipeline.from_config(filters=("healthy",), saturation=limits)
    assert unchecked.decide(
        RoutingRequest("m", 10, 10), [snap("full", outstanding_requests=2)], random.Random(0)
    ).ok


# --- revision ---------------------------------------------------------------------------------------------


def test_choose_revision_follows_weights_and_skips_unavailable():
    traffic = [("r1", 90), ("r2", 10)]
    assert choose_revision(traffic, {"r1", "r2"}, 0.0) == "r1"
    assert choose_revision(traffic, {"r1", "r2"}, 0.95) == "r2"
    assert choose_revision(traffic, {"r1"}, 0.95) == "r1"
    assert choose_revision([], {"r1"}, 0.5) is None
    assert choose_revision(traffic, {"r9"}, 0.5) is None
    draws = [i / 1000 for i in range(1000)]
    share = sum(choose_revision(traffic, {"r1", "r2"}, d) == "r2" for d in draws) / len(draws)
    assert share == pytest.approx(0.10, abs=0.002)


# --- outstandingTokens ------------------------------------------------------------------------------------


def test_outstanding_tokens_scorer_counts_uncached_prompt_as_load():
    # b owes more, but a would have to prefill the whole prompt again while b holds it
    candidates = [snap("a", outstanding_tokens=100), snap("b", outstanding_tokens=500)]
    scores = OutstandingTokensScorer().score(request(2000, {"b": 2000}), candidates)
    assert scores == [0.0, 1.0]


# --- prefixCache ------------------------------------------------------------------------------------------


def test_prefix_scorer_prefers_longer_match():
    candidates = [snap("a"), snap("b"), snap("c")]
    scores = PrefixCacheScorer().score(request(1000, {"a": 200, "b": 800}), candidates)
    assert scores == [0.25, 1.0, 0.0]


def test_hot_spot_guard_removes_prefix_credit_from_an_overloaded_replica():
    guard = HotSpotGuard(max_ratio=1.5, slack_tokens=1000, slack_requests=2)
    candidates = [snap("hot", outstanding_tokens=5000), snap("idle", outstanding_tokens=0)]
    req = request(1000, {"hot": 1000})
    assert PrefixCacheScorer(guard).score(req, candidates) == [1.0, 1.0]  # no credit: all equal
    assert req.state.hotspot_guarded == ["hot"]
    # cheap cached requests piling up: few tokens owed, but too many requests in flight
    crowded = [
        snap("hot", outstanding_tokens=300, outstanding_requests=9),
        snap("idle", outstanding_requests=2),
    ]
    assert PrefixCacheScorer(guard).score(request(1000, {"hot": 1000}), crowded) == [1.0, 1.0]
    fine = [snap("hot", outstanding_tokens=300, outstanding_requests=5), snap("idle", outstanding_requests=2)]
    assert PrefixCacheScorer(guard).score(request(1000, {"hot": 1000}), fine) == [1.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(
    n_replicas=st.integers(2, 8),
    prompts=st.lists(st.integers(200, 3000), min_size=1, max_size=80),
    ratio=st.floats(1.0, 3.0),
    slack=st.integers(0, 5000),
    slack_requests=st.integers(0, 8),
)
def test_hot_prefix_never_piles_load_beyond_the_guard(n_replicas, prompts, ratio, slack, slack_requests):
    """Every request carries the same hot prefix, which replica 0 caches fully and nobody ever finishes:
    the chosen replica's load before the request stays within the guard's bound (or within one prompt, its
    uncached tokens counted with the miss penalty, of the least-loaded replica: the load scorer's own
    choice)."""
    guard = HotSpotGuard(max_ratio=ratio, slack_tokens=slack, slack_requests=slack_requests)
    pipeline = Pipeline.from_config({"outstandingTokens": 1, "prefixCache": 1}, guard=guard)
    loads = {f"r{i}": 0 for i in range(n_replicas)}
    counts = {f"r{i}": 0 for i in range(n_replicas)}
    cached = {"r0"}
    rng = random.Random(1)
    for prompt_tokens in prompts:
        replicas = [
            snap(name, outstanding_tokens=load, outstanding_requests=counts[name])
            for name, load in loads.items()
        ]
        matches = {name: prompt_tokens for name in cached}
        decision = pipeline.decide(request(prompt_tokens, matches), replicas, rng)
        chosen = decision.replica.name
        least = min(loads.values())
        guarded = loads[chosen] > guard.bound(least) or counts[chosen] > guard.request_bound(
            min(counts.values())
        )
        one_prompt = prompt_tokens * (1 + DEFAULT_MISS_PENALTY)  # what a miss costs in the load score
        if guarded:  # no prefix credit: it won on load alone, so it is within one prompt of the least loaded
            assert loads[chosen] <= least + one_prompt
        else:
            assert loads[chosen] <= max(guard.bound(least), least + one_prompt)
        uncached = 0 if chosen in cached else prompt_tokens
        loads[chosen] += uncached + 10
        counts[chosen] += 1
        cached.add(chosen)


# --- kvCache and queue ------------------------------------------------------------------------------------


def test_kv_and_queue_scorers_treat_stale_as_unknown():
    candidates = [
        snap("a", kv_usage=None, queue_waiting=None),
        snap("b", kv_usage=0.9, queue_waiting=4),
        snap("c", kv_usage=0.1, queue_waiting=0),
    ]
    assert KvCacheScorer().score(request(), candidates) == [NEUTRAL_SCORE, 0.0, 1.0]
    assert QueueScorer().score(request(), candidates) == [NEUTRAL_SCORE, 0.0, 1.0]


def test_a_miss_penalty_makes_a_cold_replica_pay_for_the_prefixes_it_would_push_out():
    # warm holds 900 of the 1,000 prompt tokens but owes 800 more than cold
    candidates = [snap("warm", outstanding_tokens=1_000), snap("cold", outstanding_tokens=200)]
    req = request(prompt_tokens=1_000, matches={"warm": 900})
    plain = OutstandingTokensScorer().raw(req, candidates)
    assert plain == [1_100.0, 1_200.0]  # the prefill alone already favours warm, by 100 tokens
    penalised = OutstandingTokensScorer(miss_penalty=1.0).raw(req, candidates)
    assert penalised == [1_200.0, 2_200.0]  # each uncached token counted twice
    built = Pipeline.from_config({"outstandingTokens": 1.0}, miss_penalty=0.5)
    assert built.scorers[0][0].miss_penalty == 0.5


def test_prefill_interference_sends_a_miss_where_fewer_running_requests_would_wait_for_it():
    # Neither replica holds the prompt; busy owes fewer tokens (its 12 requests are decoding cached prompts)
    # but its 12 requests would all wait on this prefill, idle's 2 only.
    candidates = [
        snap("busy", outstanding_tokens=300, outstanding_requests=12),
        snap("idle", outstanding_tokens=1_500, outstanding_requests=2),
    ]
    req = request(prompt_tokens=1_000)
    assert OutstandingTokensScorer(miss_penalty=0.5).raw(req, candidates) == [1_800.0, 3_000.0]
    interfering = OutstandingTokensScorer(miss_penalty=0.5, prefill_interference=True)
    assert interfering.raw(req, candidates) == [300 + 1_000 * 13.5, 1_500 + 1_000 * 3.5]
    # A cached prompt holds nobody back: where it is cached, only the load counts.
    assert interfering.raw(request(prompt_tokens=1_000, matches={"busy": 1_000}), candidates)[0] == 300.0
    built = Pipeline.from_config({"outstandingTokens": 1.0}, prefill_interference=True)
    assert built.scorers[0][0].prefill_interference


def test_batch_stretch_prices_a_prompt_by_how_full_the_replicas_batch_already_is():
    # Neither holds the prompt; half owes fewer tokens but runs half its batch of 8, quiet one of 8.
    candidates = [
        snap("half", outstanding_tokens=100, outstanding_requests=4, batch_size=8),
        snap("quiet", outstanding_tokens=400, outstanding_requests=1, batch_size=8),
    ]
    req = request(prompt_tokens=1_000)
    assert OutstandingTokensScorer(miss_penalty=0.5).raw(req, candidates) == [1_600.0, 1_900.0]
    stretched = OutstandingTokensScorer(miss_penalty=0.5, batch_stretch=True)
    assert stretched.raw(req, candidates) == [100 + 1_500 * 1.5, 400 + 1_500 * 1.125]
    # Past a full batch the share stops at 1 (those beyond it wait; freeSlot and the guard judge that).
    queued = [snap("queued", outstanding_tokens=0, outstanding_requests=20, batch_size=8)]
    assert stretched.raw(req, queued) == [1_500 * 2.0]
    # Where no batch size is known, nothing is stretched; where it is large, a few running barely count.
    assert stretched.raw(req, [snap("unknown", outstanding_requests=4)]) == [1_500.0]
    assert stretched.raw(req, [snap("vllm", outstanding_requests=4, batch_size=256)]) == [
        1_500 * (1 + 4 / 256)
    ]
    built = Pipeline.from_config({"outstandingTokens": 1.0}, batch_stretch=True)
    assert built.scorers[0][0].batch_stretch


def test_kv_fits_keeps_the_replicas_where_the_request_fits_beside_what_is_in_flight():
    replicas = [
        snap("full", kv_held_tokens=30_000, kv_capacity_tokens=32_768),
        snap("holds_the_prefix", kv_held_tokens=30_000, kv_capacity_tokens=32_768),
        snap("roomy", kv_held_tokens=10_000, kv_capacity_tokens=32_768),
        snap("unreported", kv_held_tokens=40_000),  # no capacity figure: never judged on memory
    ]
    req = request(prompt_tokens=3_000)
    req.kv_new_tokens = {"full": 3_016, "holds_the_prefix": 16, "roomy": 3_016, "unreported": 3_016}
    kept = KvFitsFilter().apply(req, replicas)
    assert [r.name for r in kept] == ["holds_the_prefix", "roomy", "unreported"]
    assert not req.state.fits_nowhere


def test_kv_fits_never_leaves_no_candidate():
    replicas = [snap(name, kv_held_tokens=32_000, kv_capacity_tokens=32_768) for name in ("a", "b")]
    req = request(prompt_tokens=3_000)
    req.kv_new_tokens = {"a": 3_000, "b": 3_000}
    assert KvFitsFilter().apply(req, replicas) == replicas and req.state.fits_nowhere


def test_a_cold_tenant_goes_where_its_blocks_fit_not_where_compute_is_lightest():
    """The load scorer sees only compute owed: a replica busy with cheap cached requests of other tenants looks
    light while its KV is full; with kvFits a new tenant goes where its blocks fit instead."""
    replicas = [
        snap(
            "kv_full_light_compute", outstanding_tokens=200, kv_held_tokens=31_000, kv_capacity_tokens=32_768
        ),
        snap(
            "kv_roomy_more_compute", outstanding_tokens=2_000, kv_held_tokens=8_000, kv_capacity_tokens=32_768
        ),
    ]
    req = request(prompt_tokens=3_000)
    req.kv_new_tokens = {r.name: 3_050.0 for r in replicas}
    with_kv_fits = Pipeline.from_config(filters=(*DEFAULT_FILTERS, "kvFits"))
    decision = with_kv_fits.decide(req, replicas, random.Random(1))
    assert decision.replica.name == "kv_roomy_more_compute"
    req = request(prompt_tokens=3_000)  # without the footprint the load scorer would pick the other one
    decision = with_kv_fits.decide(req, replicas, random.Random(1))
    assert decision.replica.name == "kv_full_light_compute"


# --- freeSlot -----------------------------------------------------------------------------------------------


def test_free_slot_keeps_the_replicas_that_can_start_the_request_at_once():
    replicas = [
        snap("full", outstanding_requests=8, concurrency=8),
        snap("one_free", outstanding_requests=7, concurrency=8),
        snap("cap_unknown_light", outstanding_requests=5),  # taken to have the smallest known cap (8)
        snap("cap_unknown_busy", outstanding_requests=8),
    ]
    kept = FreeSlotFilter().apply(request(), replicas)
    assert [r.name for r in kept] == ["one_free", "cap_unknown_light"]
    # no cap known anywhere: every replica is free
    unknown = [snap(name, outstanding_requests=40) for name in ("a", "b")]
    assert FreeSlotFilter().apply(request(), unknown) == unknown


def test_free_slot_keeps_the_replicas_where_all_of_a_requests_n_answers_start_at_once():
    replicas = [
        snap("three_free", outstanding_requests=5, concurrency=8),
        snap("four_free", outstanding_requests=4, concurrency=8),
    ]
    asks_four = request()
    asks_four.samples = 4
    assert [r.name for r in FreeSlotFilter().apply(asks_four, replicas)] == ["four_free"]
    assert len(FreeSlotFilter().apply(request(), replicas)) == 2


def test_free_slot_never_leaves_no_candidate():
    replicas = [snap(name, outstanding_requests=9, concurrency=8) for name in ("a", "b")]
    assert FreeSlotFilter().apply(request(), replicas) == replicas


def test_a_cached_prefix_does_not_draw_a_request_into_an_engines_queue():
    """Token load and locality both favour the replica holding the prefix; with its slots all taken, the request
    would wait there for a running one to end, so freeSlot sends it where it starts at once."""
    replicas = [
        snap("holds_the_prefix", outstanding_tokens=1_000, outstanding_requests=5, concurrency=5),
        snap("cold_with_a_slot", outstanding_tokens=1_500, outstanding_requests=3, concurrency=5),
    ]
    without = tuple(name for name in DEFAULT_FILTERS if name != "freeSlot")
    plain = Pipeline.from_config(filters=without).decide(
        request(2_000, {"holds_the_prefix": 1_900}), replicas, random.Random(1)
    )
    assert plain.replica is not None and plain.replica.name == "holds_the_prefix"
    slots = Pipeline.from_config()  # freeSlot is a default
    decision = slots.decide(
        request(2_000, {"holds_the_prefix": 1_900}),
        replicas,
        random.Random(1),
    )
    assert decision.replica is not None and decision.replica.name == "cold_with_a_slot"


# --- outstandingTokens under the hot-spot guard -------------------------------------------------------------


def test_guarded_load_stops_a_full_holder_drawing_requests_past_the_guard():
    """Every replica is at its learned cap of 2 (freeSlot keeps them all); the prefix holder already runs 13
    requests, the other 2: the guard withholds prefixCache's credit, but the load score alone still prices the
    holder's cache as prefill saved and sends the request there; with guarded_load the holder's cache saves it
    nothing until its requests come back within the guard's request bound (1.5 x 2 + 4 = 7)."""
    replicas = [
        snap("holder", outstanding_tokens=1_700, outstanding_requests=13, concurrency=2),
        snap("cold", outstanding_tokens=300, outstanding_requests=2, concurrency=2),
    ]
    matches = {"holder": 1_500}
    plain = Pipeline.from_config().decide(request(1_600, matches), replicas, random.Random(1))
    assert plain.replica is not None and plain.replica.name == "holder"
    guarded = Pipeline.from_config(guarded_load=True).decide(
        request(1_600, matches), replicas, random.Random(1)
    )
    assert guarded.replica is not None and guarded.replica.name == "cold"
    # within the request bound the cache still counts: the holder with 5 requests keeps the request, though it
    # owes far more tokens than the cold replica (tokens are the score's own measure)
    near = [snap("holder", outstanding_tokens=2_300, outstanding_requests=5, concurrency=2), replicas[1]]
    kept = Pipeline.from_config(guarded_load=True).decide(request(1_600, matches), near, random.Random(1))
    assert kept.replica is not None and kept.replica.name == "holder"


def holder_and_cold(**both):
    """A prefix holder with 13 requests in flight and a replica with 2, alike in ``both``."""
    return [
        snap("holder", outstanding_tokens=1_700, outstanding_requests=13, **both),
        snap("cold", outstanding_tokens=300, outstanding_requests=2, **both),
    ]


def test_guarded_load_leaves_the_cache_its_credit_where_the_engines_showed_the_holder_would_start_it():
    """Past the request bound, the holder keeps its cache's credit where it is below its confirmed cap, or with
    no cap confirmed, below the most requests a replica was seen running at once (an engine with a large batch);
    with nothing shown (no cap, no scrape yet, or fewer seen running) the guard holds."""

    def choice(cap, running_seen):
        decision = Pipeline.from_config(guarded_load=True).decide(
            request(1_600, {"holder": 1_500}),
            holder_and_cold(concurrency=cap, running_seen=running_seen),
            random.Random(1),
        )
        assert decision.replica is not None
        return decision.replica.name

    assert choice(cap=16, running_seen=16) == "holder"
    assert choice(cap=None, running_seen=20) == "holder"
    assert choice(cap=None, running_seen=0) == "cold"
    assert choice(cap=None, running_seen=8) == "cold"


def test_the_default_load_score_guards_only_replicas_whose_configured_batch_is_full():
    """Shipped defaults: both replicas hold their configured batch of 2 or more (freeSlot keeps both), and the
    prefix holder is past the request bound (13 in flight, 1.5 x 2 + 4 = 7): its cache saves it nothing. With a
    batch of 256, or none configured (nothing known before a queue shows), its cache keeps its credit."""

    def choice(**both):
        decision = Pipeline.from_config().decide(
            request(1_600, {"holder": 1_500}), holder_and_cold(**both), random.Random(1)
        )
        assert decision.replica is not None
        return decision.replica.name

    assert choice(batch_size=2) == "cold"
    assert choice(batch_size=256) == "holder"
    assert choice() == "holder"
    assert choice(concurrency=2) == "holder"  # a learned cap alone: only with --guarded-load
    # a learned cap below the configured size feeds freeSlot, not this guard: it may be only where a KV-bound
    # engine last queued
    assert choice(batch_size=256, concurrency=2) == "holder"


def test_free_slot_takes_the_configured_batch_size_until_a_cap_is_learned():
    """From the first request a replica whose configured batch is full is passed over; a cap learned on any
    candidate (an engine whose KV cache runs fewer than its batch) comes before the configured size."""
    full, free = (
        snap("full", outstanding_requests=4, batch_size=4),
        snap("free", outstanding_requests=3, batch_size=4),
    )
    assert [r.name for r in FreeSlotFilter().apply(request(), [full, free])] == ["free"]
    assert slot_caps([snap("a", batch_size=8), snap("b", batch_size=8, concurrency=5)]) == [5, 5]
    assert slot_caps([snap("a"), snap("b")]) == [None, None]
