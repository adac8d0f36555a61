import random
from dataclasses import replace

import pytest
from tokenyard.router.__main__ import build_parser, options_from_args, parse_weights
from tokenyard.router.accounting import PrefillOverlap, PrefillRate
from tokenyard.router.core import DEFAULT_FILTERS
from tokenyard.router.discovery import ConfigError, Endpoint, ModelView, Shadow
from tokenyard.router.enginestats import EngineStats, parse_engine_metrics
from tokenyard.router.learned_sizes import CAP_CONFIRMATIONS, FLEET_CAP_REPLICAS
from tokenyard.router.openai_wire import prompt_of, render_chat
from tokenyard.router.state import (
    MAX_ANSWERS_LEARNED_AT_ONCE,
    RouterSettings,
    RouterState,
    RoutingError,
    routing_block_size,
)

PROMPT = "shared system prompt " * 100

VLLM_METRICS = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.42
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 100.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 400.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1234",enable_prefix_caching="True"} 1.0
"""


def state_with(endpoints, **view) -> RouterState:
    state = RouterState(rng=random.Random(0))
    state.set_models({"m": ModelView("m", tuple(endpoints), **view)})
    return state


def test_parse_engine_metrics_and_freshness():
    stats = parse_engine_metrics(VLLM_METRICS, scraped_at=10.0)
    assert (stats.waiting, stats.running, stats.kv_usage) == (3.0, 7.0, 0.42)
    assert (stats.block_size, stats.num_gpu_blocks) == (16, 1234)
    assert (stats.prefix_hits, stats.prefix_queries) == (100.0, 400.0)
    assert stats.fresh(now=14.0, max_age_s=5) and not stats.fresh(now=16.0, max_age_s=5)


def test_stale_engine_stats_are_unknown_not_zero():
    state = state_with([Endpoint("a", "http://a")])
    state.record_stats("a", parse_engine_metrics(VLLM_METRICS, scraped_at=0.0))
    assert state.snapshot(state.models["m"].endpoints[0], now=1.0).queue_waiting == 3.0
    state.route("m", PROMPT, 1, now=1.0)  # the index takes the capacity at the next decision
    assert state.index.replica("a").capacity_blocks == 1234
    stale = state.snapshot(state.models["m"].endpoints[0], now=100.0)
    assert stale.queue_waiting is None and stale.kv_usage is None


def test_failed_metrics_make_signals_unknown_at_once_but_keep_the_cache_geometry():
    state = state_with([Endpoint("a", "http://a")])
    endpoint = state.models["m"].endpoints[0]
    state.record_stats("a", EngineStats(scraped_at=0.0, kv_usage=0.9, waiting=7.0, block_size=32))
    assert state.snapshot(endpoint, now=1.0).kv_usage == 0.9
    state.forget_signals("a")  # the next scrape failed
    snap = state.snapshot(endpoint, now=1.0)
    assert snap.kv_usage is None and snap.queue_waiting is None  # unknown, as if stale
    assert snap.block_size == 32 and snap.healthy  # same prefix hashing; still routable
    state.forget_signals("nobody")  # a replica never scraped: nothing to forget
    assert "nobody" not in state.stats


def test_a_replicas_concurrency_is_learned_when_it_reports_requests_waiting():
    state = state_with([Endpoint("a", "http://a")])
    endpoint = state.models["m"].endpoints[0]
    state.record_stats("a", EngineStats(scraped_at=0.0, waiting=0.0, running=3.0))
    assert state.snapshot(endpoint, now=0.0).concurrency is None  # nothing waits: no limit seen
    # A vLLM-like scheduler makes requests wait below its cap too (a step's token budget, a full KV cache):
    # running counts that differ while requests wait are not a cap.
    for running in (4.0, 6.0, 5.0, 6.0):
        state.record_stats("a", EngineStats(scraped_at=1.0, waiting=2.0, running=running))
    assert state.snapshot(endpoint, now=1.0).concurrency is None
    for _ in range(CAP_CONFIRMATIONS):  # requests waiting, always with 7 running (VLLM_METRICS): a cap
        assert state.snapshot(endpoint, now=1.0).concurrency is None
        state.record_stats("a", parse_engine_metrics(VLLM_METRICS, scraped_at=1.0))
    assert state.snapshot(endpoint, now=1.0).concurrency == 7
    state.record_stats("a", EngineStats(scraped_at=2.0, waiting=0.0, running=9.0))  # more ran at once: no cap
    assert state.snapshot(endpoint, now=2.0).concurrency is None
    # a replica of the same fleet with no cap of its own takes the fleet's
    fleet = state_with([Endpoint(name, f"http://{name}") for name in "abc"])
    fleet.record_stats("a", EngineStats(scraped_at=0.0, waiting=1.0, running=8.0))
    fleet.record_stats("a", EngineStats(scraped_at=1.0, waiting=1.0, running=8.0))
    assert fleet.concurrency_of("c") is None  # one replica twice: it could be its wandering count
    assert FLEET_CAP_REPLICAS == 2
    fleet.record_stats("b", EngineStats(scraped_at=1.0, waiting=1.0, running=8.0))  # a second replica at it
    assert [fleet.concurrency_of(name) for name in "abc"] == [8, 8, 8]

    assert fleet.concurrency["a"].cap is None  # one scrape of its own is not enough for a replica
    fleet.record_stats(
        "a", EngineStats(scraped_at=1.0, waiting=0.0, running=12.0)
    )  # caps differ: no fleet cap
    assert fleet.concurrency_of("b") is None
    # the most any replica was seen running is every replica's running_seen (guarded_load, free_slot.shown_to_start)
    seen = {fleet.snapshot(endpoint, now=1.0).running_seen for endpoint in fleet.models["m"].endpoints}
    assert seen == {12}
    # a fleet replaced by replicas with a smaller cap learns it: the old cap left with the replicas that showed it
    replaced = state_with([Endpoint(name, f"http://{name}") for name in "ab"])
    for name in "ab":
        replaced.record_stats(name, EngineStats(scraped_at=0.0, waiting=1.0, running=8.0))
    assert replaced.concurrency_of("a") == 8
    replaced.set_models({"m": ModelView("m", tuple(Endpoint(name, f"http://{name}") for name in "cd"))})
    for name in "cd":
        replaced.record_stats(name, EngineStats(scraped_at=1.0, waiting=1.0, running=4.0))
    assert [replaced.concurrency_of(name) for name in "cd"] == [4, 4]
    assert replaced.running_seen == 4  # what the replicas that left ran is no longer evidence
    state.set_models({})  # the replica went away: what was learned of it goes too
    assert "a" not in state.concurrency


def test_a_configured_batch_size_is_the_cap_until_the_engine_shows_a_smaller_one():
    state = state_with([Endpoint("a", "http://a"), Endpoint("b", "http://b")], batch_size=8)
    a, b = state.models["m"].endpoints
    first = state.snapshot(a, now=0.0)
    assert (first.batch_size, first.concurrency, state.cap_of("a")) == (8, None, 8)  # configured, not learned
    # a's KV cache holds only 5 at once: requests wait with 5 running, scrape after scrape
    for second in range(CAP_CONFIRMATIONS):
        state.record_stats("a", EngineStats(scraped_at=float(second), waiting=2.0, running=5.0))
    assert state.snapshot(a, now=3.0).concurrency == 5 and state.cap_of("a") == 5
    assert state.cap_of("b") == 8  # b showed nothing: its configured size holds
    state.set_models({"m": replace(state.models["m"], batch_size=None)})  # the deployment dropped the flag
    assert state.snapshot(b, now=3.0).batch_size is None and state.cap_of("b") is None


def test_routing_blocks_follow_the_engine_block_or_group_small_pages():
    assert routing_block_size(None) == 16
    assert [routing_block_size(b) for b in (8, 16, 32, 64)] == [8, 16, 32, 64]  # vLLM block sizes as they are
    assert [routing_block_size(p) for p in (1, 2, 4, 5)] == [16, 16, 16, 20]  # SGLang pages, whole pages


def test_sglang_capacity_in_tokens_sizes_the_prefix_index_in_routing_blocks():
    state = state_with([Endpoint("a", "http://a")])
    state.record_stats("a", EngineStats(scraped_at=0.0, block_size=1, kv_capacity_tokens=227604))
    state.route("m", PROMPT, 1, now=0.0)
    assert state.index.replica("a").capacity_blocks == round(227604 / 16)
    assert state.snapshot(state.models["m"].endpoints[0], now=0.0).block_size == 16
    state.record_stats("a", EngineStats(scraped_at=0.0, block_size=32, num_gpu_blocks=500))
    state.route("m", PROMPT, 1, now=0.0)
    assert state.index.replica("a").capacity_blocks == 500  # capacity in blocks only (no token figure)


def test_route_opens_a_ticket_indexes_the_prompt_and_follows_the_prefix():
    state = state_with([Endpoint("a", "http://a"), Endpoint("b", "http://b")])
    first = state.route("m", PROMPT + "one", 50, now=0)
    assert first.prefix_match_tokens == 0
    # no filter reads the KV footprint by default: the ledger is not made to count it per block
    assert first.ticket.kv is None and state.ledger.kv_held_tokens(first.endpoint.name) == 0
    assert state.ledger.load(first.endpoint.name).tokens == first.prompt_tokens + 50
    state.ledger.close(first.ticket)
    second = state.route("m", PROMPT + "two", 50, now=1)
    assert second.endpoint == first.endpoint and second.prefix_match_tokens > 400
    # only the uncached part counts as prefill work
    assert second.ticket.prefill_left == second.prompt_tokens - second.prefix_match_tokens


def test_route_counts_the_kv_in_flight_and_sends_a_new_prefix_where_it_fits():
    state = state_with([Endpoint("a", "http://a"), Endpoint("b", "http://b")])
    state.settings.filters = (*DEFAULT_FILTERS, "kvFits")
    for name in ("a", "b"):  # each holds ~1,000 tokens of KV (vLLM's cache_config_info, as scraped): less
        # than two prompts of ~530 tokens with their outputs, more than one prompt asked twice
        state.record_stats(name, EngineStats(scraped_at=0.0, block_size=16, num_gpu_blocks=1000 // 16))
    first = state.route("m", PROMPT + "one", 50, now=0)
    held = state.ledger.kv_held_tokens(first.endpoint.name)
    assert first.ticket.kv is not None and held >= first.prompt_tokens
    # The same prefix on the same replica adds only its private blocks: it still fits there.
    second = state.route("m", PROMPT + "two", 50, now=0)
    assert second.endpoint == first.endpoint
    assert state.ledger.kv_held_tokens(first.endpoint.name) < 2 * held
    # A different prompt as long would not fit beside them: the replica holding them is not even a candidate.
    other = state.route("m", "a different system prompt " * 80, 50, now=0)
    assert other.endpoint != first.endpoint and first.endpoint.name not in other.decision.scores
    for route in (first, second, other):
        state.ledger.close(route.ticket)
    assert state.ledger.kv_held_tokens("a") == state.ledger.kv_held_tokens("b") == 0


def test_a_request_served_by_a_fallback_moves_its_ticket_and_its_prefix_there():
    a, b = Endpoint("a", "http://a"), Endpoint("b", "http://b")
    state = state_with([a, b])
    route = state.route("m", PROMPT + "one", 50, now=0)
    fallback = b if route.endpoint == a else a
    moved = state.served_elsewhere(route, fallback, now=1)
    assert moved.endpoint == fallback and route.ticket.closed and not moved.ticket.closed
    assert (
        state.ledger.load(route.endpoint.name).requests == 0
        and state.ledger.load(fallback.name).requests == 1
    )
    # The fallback computed the prompt: the next request with that prefix finds it cached there.
    state.ledger.close(moved.ticket)
    again = state.route("m", PROMPT + "two", 50, now=2, exclude=[route.endpoint.name])
    assert again.endpoint == fallback and again.prefix_match_tokens > 400


def test_route_errors_name_the_problem():
    state = state_with([Endpoint("a", "http://a")])
    with pytest.raises(RoutingError) as unknown:
        state.route("x", "hi", 1, now=0)
    assert unknown.value.status == 404 and "'x'" in unknown.value.message
    with pytest.raises(RoutingError) as none_left:
        state.route("m", "hi", 1, now=0, exclude=["a"])
    assert none_left.value.status == 503
    state.unreachable.add("a")
    with pytest.raises(RoutingError) as unhealthy:
        state.route("m", "hi", 1, now=0)
    assert unhealthy.value.status == 503 and "healthy" in unhealthy.value.message


def test_shadow_revision_gets_only_copies_and_canary_split_applies():
    endpoints = [Endpoint("a", "http://a", "v1"), Endpoint("b", "http://b", "v2")]
    state = state_with(endpoints, shadow=Shadow("v2", 1.0))
    for i in range(20):
        assert state.route("m", f"p{i}", 1, now=i).endpoint.name == "a"
        assert state.route("m", f"p{i}", 1, now=i, shadow=True).endpoint.name == "b"
    assert state.shadow_wanted("m")
    canary = state_with(endpoints, traffic=(("v1", 0), ("v2", 100)))
    assert {canary.route("m", f"p{i}", 1, now=i).endpoint.name for i in range(20)} == {"b"}


def test_chat_rendering_keeps_earlier_turns_as_a_prefix():
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert render_chat(turn2).startswith(render_chat(turn1))
    assert prompt_of({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}).endswith(
        "x\n"
    )
    with pytest.raises(ValueError):
        prompt_of({"prompt": 3})


def test_cli_arguments():
    parser = build_parser()
    options = options_from_args(
        parser.parse_args(
            [
                "--backend",
                "a=http://127.0.0.1:1#v1",
                "--backend",
                "http://127.0.0.1:2",
                "--traffic",
                "v1=100",
                "--weights",
                "prefixCache=2,queue=0",
                "--grpc-port",
                "-1",
            ]
        )
    )
    assert [b.name for b in options.static.backends] == ["a", "127.0.0.1:2"]
    assert options.static.weights == {"prefixCache": 2.0, "queue": 0.0}
    assert options.grpc_port is None
    with pytest.raises(ConfigError, match="exactly one"):
        options_from_args(parser.parse_args([]))
    with pytest.raises(ConfigError, match="duplicate"):
        options_from_args(
            parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--backend", "a=http://127.0.0.1:2"])
        )
    with pytest.raises(ConfigError, match="--weights"):
        parse_weights("bogus=1")
    backend = ["--backend", "a=http://127.0.0.1:1"]
    assert options_from_args(parser.parse_args(backend)).static.batch_size is None
    configured = options_from_args(parser.parse_args([*backend, "--engine-max-num-seqs", "8"]))
    assert configured.static.batch_size == 8
    with pytest.raises(ConfigError, match="--engine-max-num-seqs '0'"):
        options_from_args(parser.parse_args([*backend, "--engine-max-num-seqs", "0"]))
    with pytest.raises(ConfigError, match="ModelDeployment"):  # a cluster's deployments say it themselves
        options_from_args(parser.parse_args(["--in-cluster", "--engine-max-num-seqs", "8"]))
    with pytest.raises(SystemExit) as bad:
        parser.parse_args(["--port", "x"])
    assert bad.value.code == 2


def test_an_engine_report_close_to_the_prediction_corrects_nothing_a_shortfall_drops_the_older_blocks():
    state = state_with([Endpoint("a", "http://a")])
    state.settings.prefix_feedback = True
    other = "another tenant's system prompt " * 40
    for now, text in enumerate((other, PROMPT)):
        state.ledger.close(state.route("m", text, 1, now=now).ticket)
    again = state.route("m", PROMPT + "again", 1, now=5)
    assert again.prefix_match_tokens > 400 and again.tokens_per_block == 16  # 64 characters at 4 per token
    # The engine matches its own blocks: a report one block short is not an eviction.
    assert state.learn_cached_tokens(again, again.prefix_match_tokens - 16) == 0
    assert state.prefix_corrections == 0
    # Half of it: the engine lost PROMPT's tail, and so everything sent there no later (the other tenant).
    dropped = state.learn_cached_tokens(again, again.prefix_match_tokens // 2)
    assert dropped >= len(other) // 64 and state.prefix_corrections == 1
    assert state.route("m", other, 1, now=6).prefix_match_tokens == 0
    assert state.route("m", PROMPT, 1, now=6).prefix_match_tokens > 400  # sent again at 5: still held


def test_without_prefix_feedback_engine_reports_leave_the_index_alone():
    state = state_with([Endpoint("a", "http://a")])
    state.ledger.close(state.route("m", PROMPT, 1, now=0).ticket)
    again = state.route("m", PROMPT, 1, now=1)
    assert state.learn_cached_tokens(again, 0) == 0 and state.prefix_corrections == 0
    assert state.route("m", PROMPT, 1, now=2).prefix_match_tokens > 400


def test_cli_switches_for_prefix_feedback_and_prefill_interference():
    parser = build_parser()
    plain = options_from_args(parser.parse_args(["--backend", "a=http://127.0.0.1:1"]))
    assert not plain.settings.prefix_feedback and not plain.settings.prefill_interference
    both = options_from_args(
        parser.parse_args(
            ["--backend", "a=http://127.0.0.1:1", "--prefix-feedback", "--prefill-interference"]
        )
    )
    assert both.settings.prefix_feedback and both.settings.prefill_interference


def test_a_replica_near_the_end_of_its_prompt_looks_lighter_than_one_that_just_began():
    state = state_with([Endpoint("a", "http://a"), Endpoint("b", "http://b")])
    state.settings.prefill_progress = True  # --prefill-progress
    for name in ("a", "b"):  # each replica's prefill rate measured: 1,000 tokens in 0.5 s, five times
        for i in range(PrefillRate.min_samples):
            probe = state.ledger.open(name, 1000, 0, now=i * 0.1 - 1.0)
            state.ledger.first_token(probe, now=i * 0.1 - 0.5)
            state.ledger.close(probe)
    early = state.ledger.open("a", 1000, 10, now=1.0)
    late = state.ledger.open("b", 1000, 10, now=1.4)
    snapshots = {e.name: state.snapshot(e, 1.45) for e in state.models["m"].endpoints}
    # a has prefilled ~900 of its 1000 tokens by now, b ~100: what each still owes
    assert snapshots["a"].outstanding_tokens == 1010 - 900
    assert snapshots["b"].outstanding_tokens == 1010 - 100
    state.settings.prefill_progress = False  # the default: the whole debt
    assert state.snapshot(state.models["m"].endpoints[0], 1.45).outstanding_tokens == 1010
    state.settings.prefill_progress = True
    routed = state.route("m", "unique prompt " * 50, 10, now=1.45)
    assert routed.endpoint.name == "a"
    for ticket in (early, late, routed.ticket):
        state.ledger.close(ticket)


def test_batch_stretch_is_on_unless_switched_off():
    parser = build_parser()
    plain = options_from_args(parser.parse_args(["--backend", "a=http://127.0.0.1:1"])).settings
    assert plain.batch_stretch
    off = options_from_args(
        parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--no-batch-stretch"])
    ).settings
    assert not off.batch_stretch
    state = state_with([Endpoint("a", "http://a")])
    state.settings = off
    assert not state.pipeline_for(state.models["m"]).scorers[0][0].batch_stretch


def test_once_prefills_are_seen_side_by_side_the_prefill_owed_is_no_load_with_prefill_overlap():
    state = state_with([Endpoint("a", "http://a"), Endpoint("b", "http://b")])
    assert state.settings.prefill_overlap  # the default
    busy = state.ledger.open("a", 4000, 10, now=0.0)  # a is prefilling a long prompt, b runs a short one
    state.ledger.open("b", 0, 300, now=0.0)
    endpoint_a = state.models["m"].endpoints[0]
    assert state.snapshot(endpoint_a, 0.1).outstanding_tokens == 4010  # prefills taken to queue (the default)
    # short prompts seen overtaking long ones: the engines prefill side by side
    for i in range(PrefillOverlap.min_samples):
        long = state.ledger.open("b", 4000, 0, now=10.0 + i)
        short = state.ledger.open("b", 50, 0, now=10.1 + i)
        state.ledger.generated(short, 1, now=10.15 + i)
        state.ledger.generated(long, 1, now=10.6 + i)
        state.ledger.close(long)
        state.ledger.close(short)
    assert state.ledger.prefills_side_by_side
    assert state.snapshot(endpoint_a, 20.0).outstanding_tokens == 10  # the decode it still owes
    # a short prompt goes where a long prefill runs beside few others, not where a short answer is decoding
    routed = state.route("m", "unique prompt " * 20, 10, now=20.0)
    assert routed.endpoint.name == "a"
    state.ledger.close(routed.ticket)
    state.settings.prefill_overlap = False
    assert state.snapshot(endpoint_a, 20.0).outstanding_tokens == 4010
    state.ledger.close(busy)


def test_with_prefill_overlap_off_nothing_is_sampled():
    state = state_with([Endpoint("a", "http://a")])
    long = state.ledger.open("a", 4000, 10, now=0.0)
    state.settings.prefill_overlap = False  # --no-prefill-overlap
    off = state.route("m", "unique prompt " * 5, 10, now=0.1)
    assert long.followers == []
    state.settings.prefill_overlap = True
    on = state.route("m", "unique prompt " * 5, 10, now=0.2)
    assert long.followers == [on.ticket]  # a short prompt behind a long one, a slot free (no cap known)
    for ticket in (long, off.ticket, on.ticket):
        state.ledger.close(ticket)


def test_prefill_overlap_is_on_unless_switched_off():
    parser = build_parser()
    assert options_from_args(
        parser.parse_args(["--backend", "a=http://127.0.0.1:1"])
    ).settings.prefill_overlap
    off = parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--no-prefill-overlap"])
    assert not options_from_args(off).settings.prefill_overlap


def test_cli_switch_for_prefill_progress():
    parser = build_parser()
    plain = parser.parse_args(["--backend", "a=http://127.0.0.1:1"])
    assert not options_from_args(plain).settings.prefill_progress
    on = parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--prefill-progress"])
    assert options_from_args(on).settings.prefill_progress


def test_a_cap_a_peer_confirmed_serves_until_this_router_sees_it_exceeded():
    state = state_with([Endpoint(name, f"http://{name}") for name in "ab"])
    state.peer_caps = {"a": 8}
    assert state.concurrency_of("a") == 8 and state.concurrency_of("b") is None  # b: nobody confirmed one
    assert state.confirmed_caps() == {}  # a peer's cap is not this router's to share
    state.record_stats("a", EngineStats(scraped_at=0.0, waiting=0.0, running=6.0))
    assert state.concurrency_of("a") == 8 and state.contradicted_peer_caps() == []
    state.record_stats(
        "a", EngineStats(scraped_at=1.0, waiting=0.0, running=12.0)
    )  # restarted with a larger cap
    assert state.concurrency_of("a") is None and state.contradicted_peer_caps() == ["a"]
    for _ in range(CAP_CONFIRMATIONS):
        state.record_stats("a", EngineStats(scraped_at=2.0, waiting=3.0, running=12.0))
    assert state.concurrency_of("a") == 12 and state.confirmed_caps() == {"a": 12}


def test_output_by_age_is_on_unless_switched_off_and_decides_the_tickets_charge():
    parser = build_parser()
    on = options_from_args(parser.parse_args(["--backend", "a=http://127.0.0.1:1"])).settings
    off = options_from_args(parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--no-output-by-age"]))
    assert on.output_by_age and not off.settings.output_by_age
    for by_age in (True, False):
        state = RouterState(settings=RouterSettings(output_by_age=by_age))
        state.set_models({"m": ModelView("m", [Endpoint("a", "http://a")])})
        for i in range(100):  # half the answers 10 tokens, half 1,000
            state.learn_output_tokens("m", 10 if i % 2 else 1_000)
        route = state.route("m", "x" * 400, 2048, now=0.0)
        state.ledger.generated(route.ticket, 20)  # past the short answers
        expected = 980 if by_age else 505 - 20  # what the long ones still write / the mean counted down
        assert abs(route.ticket.decode_left - expected) <= 2, (by_age, route.ticket.decode_left)


def test_with_a_decode_horizon_only_that_much_of_each_answer_left_is_load():
    parser = build_parser()
    assert (
        options_from_args(parser.parse_args(["--backend", "a=http://127.0.0.1:1"])).settings.decode_horizon
        is None
    )
    negative = parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--decode-horizon", "-1"])
    with pytest.raises(ConfigError, match="--decode-horizon -1: must be >= 0"):
        options_from_args(negative)
    told = parser.parse_args(["--backend", "a=http://127.0.0.1:1", "--decode-horizon", "8"])
    state = RouterState(settings=options_from_args(told).settings)
    state.set_models({"m": ModelView("m", [Endpoint("a", "http://a")])})
    route = state.route("m", "x" * 400, 500, now=0.0)
    state.ledger.first_token(route.ticket, 0.1)
    assert state.ledger.load("a").tokens == 500  # the ledger still counts the whole answer (and shares it)...
    assert state.snapshot(state.models["m"].endpoints[0], 0.2).outstanding_tokens == 8  # ...the score 8 of it
    state.ledger.generated(route.ticket, 495)
    assert state.snapshot(state.models["m"].endpoints[0], 0.3).outstanding_tokens == 5  # 5 left, all counted
    state.ledger.close(route.ticket)
    assert state.snapshot(state.models["m"].endpoints[0], 0.4).outstanding_tokens == 0


def test_a_request_of_many_answers_teaches_a_few_answers_of_their_mean_not_one_per_answer():
    state = RouterState()
    state.learn_output_tokens("m", 30, samples=3)
    assert state.output_length_for("m").observations == 3
    state.learn_output_tokens(
        "m", 50_000, samples=1_000
    )  # one figure, the mean: it must not crowd out the rest
    lengths = state.output_length_for("m")
    assert lengths.observations == 3 + MAX_ANSWERS_LEARNED_AT_ONCE
