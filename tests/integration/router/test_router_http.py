"""The router over real sockets with simulated engines: streaming, locality, canary, shadow, failures."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenyard.router.core import DEFAULT_FILTERS
from tokenyard.router.discovery import Endpoint, Shadow
from tokenyard.router.openai_wire import carries_token, render_chat
from tokenyard.router.plugins.not_saturated import SaturationLimits
from tokenyard.router.state import RouterSettings
from tokenyard.sim.options import EngineOptions
from tokenyard.sim.server import SimEngine
from tokenyard.v1 import router_pb2, router_pb2_grpc

from .conftest import MODEL, backends_of, parse_metric, wait_for

pytestmark = pytest.mark.integration

SYSTEM_PROMPT = "You are a careful assistant for the billing team. " * 40


def url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.ports['http']}{path}"


async def metrics_text(http, server) -> str:
    async with http.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as response:
        return await response.text()


async def complete(http, server, prompt: str, max_tokens: int = 4, stream: bool = False, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **extra}
    async with http.post(url(server, "/v1/completions"), json=body) as response:
        payload = await response.read()
        return response.status, response.headers, payload


async def test_streams_chunk_by_chunk_and_reuses_the_cached_replica(engines, router, http):
    fleet = await engines(3, time_scale=0.5)
    server = await router(backends_of(fleet))
    body = {
        "model": MODEL,
        "prompt": SYSTEM_PROMPT + "first question",
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    arrivals = []
    chunks = b""
    async with http.post(url(server, "/v1/completions"), json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        first_replica = response.headers["x-tokenyard-replica"]
        async for chunk in response.content.iter_any():
            arrivals.append(time.monotonic())
            chunks += chunk
    assert chunks.rstrip().endswith(b"data: [DONE]")
    # streamed, not buffered: the chunks arrive spread over the decode, not all at the end
    assert len(arrivals) >= 10 and arrivals[-1] - arrivals[0] > 0.05
    # the same system prompt goes back to the replica that caches it, and the engine confirms the hit
    status, headers, payload = await complete(http, server, SYSTEM_PROMPT + "second question")
    assert status == 200 and headers["x-tokenyard-replica"] == first_replica
    assert json.loads(payload)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert server.state.ledger.open_tickets() == 0
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_requests_total", model=MODEL, code="200") == 2
    assert parse_metric(text, "tokenyard_router_time_to_first_token_seconds_count", model=MODEL) == 2


async def stream_events(http, server, path: str, body: dict) -> list[bytes]:
    """The data of each event the client got, in order."""
    async with http.post(url(server, path), json={"model": MODEL, "stream": True, **body}) as response:
        assert response.status == 200
        payload = await response.read()
    return [line[6:] for line in payload.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize("ask_usage", [True, False])
async def test_a_stream_teaches_the_router_its_token_sizes_whether_or_not_the_client_asks_usage(
    engines, router, http, ask_usage
):
    fleet = await engines(1)
    server = await router(backends_of(fleet), settings=RouterSettings(stream_usage=ask_usage))
    chat = {"messages": [{"role": "user", "content": SYSTEM_PROMPT}], "max_tokens": 5}
    events = await stream_events(http, server, "/v1/chat/completions", chat)
    # the client asked for no usage and sees none, whatever the router asked of the engine
    assert events[-1] == b"[DONE]" and not any(b'"usage"' in event for event in events)
    assert sum(carries_token(event) for event in events) == 5
    learned = server.state.ratio_for(MODEL)
    assert learned.observations == (1 if ask_usage else 0)
    assert learned.observed_bytes == (len(render_chat(chat["messages"]).encode()) if ask_usage else 0)

    # a client that asks for its usage gets it, as the engine sent it
    completion = {"prompt": SYSTEM_PROMPT, "max_tokens": 3, "stream_options": {"include_usage": True}}
    events = await stream_events(http, server, "/v1/completions", completion)
    usage = json.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
    assert server.state.ratio_for(MODEL).observations == (2 if ask_usage else 1)


async def test_an_engine_that_refuses_stream_options_serves_what_the_client_sent(router, http, old_engine):
    engine_url, got = old_engine
    server = await router([Endpoint("old", engine_url, "")])
    # a client's own error, not about the member, is the client's: relayed, not resent, the replica not marked
    status, _, payload = await complete(http, server, "Hi", max_tokens=-1, stream=True)
    assert status == 400 and b"max_tokens" in payload
    assert got == {"invalid": 1, "with": 0, "without": 0} and not server.state.usage_refused
    for _ in range(3):
        events = await stream_events(http, server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert events == [events[0], events[1], b"[DONE]"] and sum(carries_token(e) for e in events) == 2
    # refused once, then remembered: every request was served, and only the first one was sent twice
    assert got == {"invalid": 1, "with": 1, "without": 3}
    assert server.state.usage_refused == {engine_url}


async def test_bad_input_gets_clear_4xx_errors(engines, router, http):
    server = await router(backends_of(await engines(1)), max_body_bytes=10_000)
    async with http.post(url(server, "/v1/completions"), data=b"{not json") as response:
        assert response.status == 400
        assert "not valid JSON" in (await response.json())["error"]["message"]
    status, _, payload = await complete(http, server, "x" * 20_000)
    assert status == 413 and b"limit" in payload
    async with http.post(url(server, "/v1/completions"), json={"model": "nope", "prompt": "hi"}) as response:
        assert response.status == 404
        assert "'nope'" in (await response.json())["error"]["message"]
    async with http.post(url(server, "/v1/chat/completions"), json={"model": MODEL}) as response:
        assert response.status == 400
    async with http.get(url(server, "/v1/models")) as response:
        assert [m["id"] for m in (await response.json())["data"]] == [MODEL]
    # a path or method the router does not serve: a JSON error naming it and what is served, not plain text
    async with http.post(url(server, "/v1/embeddings"), json={"model": MODEL, "input": "hi"}) as response:
        assert response.status == 404
        message = (await response.json())["error"]["message"]
        assert "POST /v1/embeddings" in message and "POST /v1/chat/completions" in message
    async with http.get(url(server, "/v1/completions")) as response:
        assert response.status == 405 and response.headers["Allow"] == "POST"
        assert "GET is not allowed on /v1/completions" in (await response.json())["error"]["message"]


async def test_canary_weights_are_honoured(engines, router, http):
    fleet = await engines(3)
    server = await router(
        backends_of(fleet, ["stable", "stable", "canary"]), traffic=(("stable", 80), ("canary", 20))
    )
    counts = {"stable": 0, "canary": 0}

    async def one(i: int) -> None:
        status, headers, _ = await complete(http, server, f"request {i} " * 3, max_tokens=1)
        assert status == 200
        counts[headers["x-tokenyard-revision"]] += 1

    for start in range(0, 400, 50):
        await asyncio.gather(*(one(i) for i in range(start, start + 50)))
    share = counts["canary"] / 400
    assert 0.14 <= share <= 0.26, counts  # 20% +- 6 points (>3 sigma for n=400)


async def test_shadow_copies_never_reach_or_slow_the_client(engines, router, http):
    primary = await engines(1)
    shadow = await engines(1, latency_multiplier=100.0)  # the shadow revision is very slow
    server = await router(
        backends_of(primary + shadow, ["v1", "v2"]), traffic=(("v1", 100),), shadow=Shadow("v2", 1.0)
    )

    async def client_requests(n: int) -> float:
        started = time.monotonic()
        for i in range(n):
            status, headers, payload = await complete(http, server, f"shadowed {i} " * 20, max_tokens=8)
            assert status == 200 and headers["x-tokenyard-revision"] == "v1"
            assert json.loads(payload)["choices"][0]["text"]
        return time.monotonic() - started

    async def shadow_count(**labels) -> float:
        text = await metrics_text(http, server)
        return parse_metric(text, "tokenyard_router_shadow_requests_total", revision="v2", **labels) or 0

    def shadow_count_is(expected: float, **labels):
        async def check() -> bool:
            return await shadow_count(**labels) == expected

        return check

    client_time = await client_requests(10)
    await wait_for(shadow_count_is(10, outcome="ok"), 60, "ten shadow copies read to the end")
    text = await metrics_text(http, server)
    # the client never waited for the slow shadow: its ten requests took less time than the copies did
    assert client_time < parse_metric(text, "tokenyard_router_shadow_duration_seconds_sum", revision="v2")
    assert parse_metric(text, "tokenyard_router_requests_total", revision="v2") is None

    shadow[0].knobs.error_rate = 1.0  # now the shadow fails every request: the client still sees none of it
    await client_requests(5)
    await wait_for(shadow_count_is(15), 30, "five more shadow copies to end")
    # failed, or dropped once the failing shadow replica got ejected
    assert await shadow_count(outcome="error") >= server.state.settings.ejection.consecutive_failures


async def test_retry_on_another_replica_and_ejection_of_a_dead_one(engines, router, http):
    fleet = await engines(2)
    settings = RouterSettings()
    settings.ejection.consecutive_failures = 2
    settings.ejection.base_s = 60
    server = await router(backends_of(fleet), settings=settings)
    server.state.rng.seed(3)
    await fleet[0].stop(drain_timeout_s=0)  # e0 dies: connections are refused
    server.state.unreachable.discard("e0")  # before the prober notices, only retries can save requests
    for i in range(12):
        status, headers, _ = await complete(http, server, f"q{i}", max_tokens=1)
        assert status == 200 and headers["x-tokenyard-replica"] == "e1"
        server.state.unreachable.discard("e0")
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_retries_total", replica="e0") >= 1
    assert parse_metric(text, "tokenyard_router_ejections_total", replica="e0") == 1
    assert server.state.failures.is_ejected("e0", server.forwarder.clock())
    assert server.state.ledger.open_tickets() == 0


async def test_client_disconnect_cancels_upstream_and_frees_accounting(engines, router, http):
    fleet = await engines(1, time_scale=1.0)
    server = await router(backends_of(fleet))
    body = {
        "model": MODEL,
        "prompt": "tell me a long story",
        "max_tokens": 5000,
        "stream": True,
        "ignore_eos": True,
    }
    response = await http.post(url(server, "/v1/completions"), json=body)
    await response.content.readany()
    assert server.state.ledger.load("e0").tokens > 0
    assert fleet[0]._streams  # the engine is generating
    response.close()  # the client goes away mid-stream
    await wait_for(lambda: server.state.ledger.open_tickets() == 0, 5, "the ticket to close")
    assert server.state.ledger.load("e0").tokens == 0
    await wait_for(lambda: not fleet[0]._streams, 5, "the engine to abort the request")
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_requests_total", code="499") == 1


async def test_all_replicas_saturated_answers_429_with_retry_after(engines, router, http):
    fleet = await engines(1, time_scale=1.0)
    settings = RouterSettings(saturation=SaturationLimits(max_outstanding_requests=1))
    server = await router(backends_of(fleet), settings=settings)
    body = {
        "model": MODEL,
        "prompt": "hold the replica",
        "max_tokens": 5000,
        "stream": True,
        "ignore_eos": True,
    }
    holder = await http.post(url(server, "/v1/completions"), json=body)
    await holder.content.readany()
    status, headers, payload = await complete(http, server, "one more")
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert b"saturated" in payload
    holder.close()
    await wait_for(lambda: server.state.ledger.open_tickets() == 0, 5, "the holder to be released")
    status, _, _ = await complete(http, server, "now it fits")
    assert status == 200


async def test_grpc_generate_pick_endpoint_and_health(engines, router):
    fleet = await engines(2)
    server = await router(backends_of(fleet, ["r1", "r1"]))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        request = router_pb2.GenerateRequest(
            model=MODEL, prompt=SYSTEM_PROMPT + "grpc", sampling=router_pb2.SamplingParams(max_tokens=8)
        )
        replies = [reply async for reply in stub.Generate(request)]
        assert replies[0].endpoint.replica in {"e0", "e1"} and replies[0].endpoint.revision == "r1"
        assert "".join(r.text for r in replies).strip()
        assert replies[-1].finish_reason == "length" and replies[-1].usage.completion_tokens == 8
        pick = await stub.PickEndpoint(
            router_pb2.PickEndpointRequest(model=MODEL, prompt=SYSTEM_PROMPT + "more")
        )
        assert pick.endpoint.replica == replies[0].endpoint.replica and pick.prefix_match > 0
        assert "scored" in pick.reason
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.PickEndpoint(router_pb2.PickEndpointRequest(model="nope", prompt="x"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert server.state.ledger.open_tickets() == 0


@pytest.mark.parametrize("free_slot", [True, False])
async def test_a_request_goes_where_it_starts_at_once_not_into_a_cached_replicas_queue(
    router, http, free_slot
):
    """Engines that run one request at a time (--max-num-seqs 1). The router learns that cap from their
    /metrics, and a second request on the first one's long prompt, which locality and token load both send to
    the replica already serving it, goes to the idle one instead: there it starts at once, where the holder would
    make it wait for the whole first answer. Without freeSlot it queues behind the first."""
    fleet = []
    for _ in range(2):
        engine = SimEngine(EngineOptions(port=0, time_scale=1.0, served_model_name=MODEL, max_num_seqs=1))
        await engine.start()
        fleet.append(engine)
    try:
        filters = DEFAULT_FILTERS if free_slot else tuple(f for f in DEFAULT_FILTERS if f != "freeSlot")
        server = await router(
            backends_of(fleet), settings=RouterSettings(filters=filters), probe_interval_s=0.05
        )

        async def occupy(base_url: str, max_tokens: int) -> None:
            body = {
                "model": MODEL,
                "prompt": "fill",
                "max_tokens": max_tokens,
                "stream": True,
                "ignore_eos": True,
            }
            async with http.post(base_url + "/v1/completions", json=body) as response:
                await response.read()

        # Three requests on each engine straight from the client: one runs, two wait, and the scrapes see it.
        fillers = [asyncio.create_task(occupy(engine.url, 150)) for engine in fleet for _ in range(3)]
        await wait_for(
            lambda: [server.state.concurrency_of(name) for name in ("e0", "e1")] == [1, 1],
            what="both engines' cap of one running request to be learned",
        )
        # and it is shown on the router's /metrics (exported every probe interval)
        await wait_for(
            lambda: metric_is_one(http, server, "tokenyard_router_replica_concurrency", replica="e0"),
            what="the learned cap on /metrics",
        )
        for task in fillers:
            task.cancel()  # the engines abort them when the connections close
        await asyncio.gather(*fillers, return_exceptions=True)
        await wait_for(
            lambda: all(not e.core.running and not e.core.waiting for e in fleet), what="the engines idle"
        )

        long_body = {"model": MODEL, "prompt": SYSTEM_PROMPT, "max_tokens": 150, "stream": True}
        long_body["ignore_eos"] = True
        async with http.post(url(server, "/v1/completions"), json=long_body) as first:
            assert first.status == 200
            await first.content.readline()  # its first token: it runs
            status, headers, _ = await complete(
                http, server, SYSTEM_PROMPT + " And one more thing?", max_tokens=2
            )
            assert status == 200
            same = headers["x-tokenyard-replica"] == first.headers["x-tokenyard-replica"]
            assert same is not free_slot
            await first.read()
    finally:
        for engine in fleet:
            await engine.stop(drain_timeout_s=0.5)


async def metric_is_one(http, server, name: str, **labels: str) -> bool:
    return parse_metric(await metrics_text(http, server), name, **labels) == 1.0


async def test_a_request_for_n_answers_holds_n_places_on_its_replica_until_they_end(engines, router, http):
    """n = 4 through the router to a vLLM-like engine: the client gets its four choices, and while they stream
    the router counts four requests in flight on the replica (what freeSlot and the load score read), as the
    engine counts four running."""
    fleet = await engines(2, time_scale=0.5)
    server = await router(backends_of(fleet))
    answered = asyncio.create_task(
        complete(http, server, "four takes on one prompt", max_tokens=60, ignore_eos=True, n=4)
    )

    def four_in_flight_and_running() -> bool:
        (load,) = server.state.ledger.snapshot().values() or (None,)
        return load is not None and load.requests == 4 and sum(e.core.num_running for e in fleet) == 4

    await wait_for(four_in_flight_and_running, what="4 requests in flight on the ledger and running")
    status, _, payload = await answered
    assert status == 200
    answer = json.loads(payload)
    assert sorted(c["index"] for c in answer["choices"]) == [0, 1, 2, 3]
    assert answer["usage"]["completion_tokens"] == 4 * 60
    assert server.state.ledger.snapshot() == {}
    lengths = server.state.output_length_for(MODEL)
    assert lengths.observations == 4 and lengths.total_tokens / lengths.answers == pytest.approx(60)
