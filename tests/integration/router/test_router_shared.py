"""Two router processes sharing load and prefix state through a real redis-server, and Redis going away."""

from __future__ import annotations

import grpc
import pytest
from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.enginestats import EngineStats
from tokenyard.router.learned_sizes import CAP_CONFIRMATIONS
from tokenyard.router.shared import CAPS_TTL_S, RedisShare, pack_hashes
from tokenyard.router.state import RouterSettings, RouterState
from tokenyard.router.telemetry import RouterMetrics
from tokenyard.v1 import router_pb2, router_pb2_grpc

from .conftest import MODEL, wait_for

pytestmark = pytest.mark.integration

SYSTEM_PROMPT = "Tenant 42 system prompt: answer in formal English, cite the policy. " * 30


def backend_args(fleet) -> list[str]:
    args = ["--served-model", MODEL]
    for i, engine in enumerate(fleet):
        args += ["--backend", f"e{i}={engine.url}"]
    return args


async def pick(process, prompt: str) -> router_pb2.PickEndpointResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{process.grpc_port}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        return await stub.PickEndpoint(router_pb2.PickEndpointRequest(model=MODEL, prompt=prompt))


async def complete(http, process, prompt: str, **extra) -> tuple[int, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}
    async with http.post(process.url + "/v1/completions", json=body) as response:
        await response.read()
        return response.status, response.headers.get("x-tokenyard-replica", "")


async def test_two_routers_share_prefixes_and_load_and_survive_redis_loss(
    engines, router_processes, redis_server, http
):
    fleet = await engines(4, time_scale=1.0)
    args = backend_args(fleet) + ["--redis-url", redis_server.url, "--probe-interval", "0.2"]
    a = await router_processes(args + ["--router-id", "a"], http)
    b = await router_processes(args + ["--router-id", "b"], http)

    async def redis_up(process, expected: float):
        async def check() -> bool:
            return await process.metric(http, "tokenyard_router_redis_up") == expected

        return check

    for process in (a, b):
        await wait_for(await redis_up(process, 1), 10, "redis_up=1")
        assert await process.metric(http, "tokenyard_router_redis_configured") == 1

    # a prompt routed by router a is known to router b: b picks the same replica and expects the cached prefix
    status, replica = await complete(http, a, SYSTEM_PROMPT + "question 1")
    assert status == 200

    async def b_knows_prefix() -> bool:
        answer = await pick(b, SYSTEM_PROMPT + "question 2")
        return answer.endpoint.replica == replica and answer.prefix_match > 0

    await wait_for(b_knows_prefix, 5, "router b to learn router a's prefix")

    # load routed through a shows in b's accounting while the stream runs, and goes when it ends
    # ignore_eos: without it the engine ends the stream at a length of its own choosing (as a model would)
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 5000, "stream": True, "ignore_eos": True}
    holder = await http.post(a.url + "/v1/completions", json=body)
    await holder.content.readany()
    held = holder.headers["x-tokenyard-replica"]

    async def b_sees_load(present: bool):
        async def check() -> bool:
            value = await b.metric(http, "tokenyard_router_outstanding_tokens", replica=held) or 0
            return (value > 0) == present

        return check

    try:
        await wait_for(await b_sees_load(True), 10, "router b to see a's outstanding tokens")
    except AssertionError as failure:
        seen = {
            name: await r.metric(http, "tokenyard_router_outstanding_tokens", replica=held)
            for name, r in (("a", a), ("b", b))
        }
        raise AssertionError(f"{failure}; outstanding tokens on {held}: {seen}") from failure
    holder.close()
    await wait_for(await b_sees_load(False), 10, "the shared load to be released")

    # Redis dies mid-run: both routers keep routing on local state and say so
    redis_server.stop()
    for process in (a, b):
        await wait_for(await redis_up(process, 0), 10, "redis_up=0")
    for i in range(10):
        for process in (a, b):
            status, _ = await complete(http, process, f"while redis is down {i}")
            assert status == 200
    assert await a.metric(http, "tokenyard_router_redis_errors_total") > 0

    # Redis returns (empty): sharing resumes and local inserts made meanwhile are published
    status, replica = await complete(http, a, SYSTEM_PROMPT * 2 + "during the outage")
    redis_server.start()
    for process in (a, b):
        await wait_for(await redis_up(process, 1), 15, "redis_up=1 again")

    async def b_learned_outage_prefix() -> bool:
        answer = await pick(b, SYSTEM_PROMPT * 2 + "after")
        return answer.endpoint.replica == replica and answer.prefix_match > 0

    await wait_for(b_learned_outage_prefix, 10, "router b to learn what a routed during the outage")


def share_pair(redis_server, key_prefix: str) -> tuple[RedisShare, RedisShare]:
    """Two routers' Redis sharing in this process (a and b), each over its own state of one model on e0."""

    def share(router_id: str) -> RedisShare:
        routing = RouterState(RouterSettings())
        routing.set_models(
            {MODEL: ModelView(served_name=MODEL, endpoints=(Endpoint(name="e0", url="http://x"),))}
        )
        return RedisShare(
            redis_server.url, routing, RouterMetrics(), router_id=router_id, key_prefix=key_prefix
        )

    return share("a"), share("b")


async def test_peers_learn_the_blocks_a_request_fills_beyond_its_prompt(redis_server):
    """The index's private-block count travels through the Redis stream with the prompt's hashes, so a peer's
    index ages prefixes out as fast as the routing router's; entries from routers that predate the field
    count none."""

    a, b = share_pair(redis_server, "private-test")
    a_state, b_state = a.state, b.state
    try:
        await b.sync_once()  # b joins first and reads from here on
        a_state.route(MODEL, SYSTEM_PROMPT, max_tokens=100, now=0.0)
        a_blocks = len(a_state.index.replica("e0"))
        prompt_blocks = len(a_state.prefix_outbox[0][1])
        assert a_blocks > prompt_blocks, "the request's output should fill blocks beyond its prompt's"
        await a.sync_once()
        await b.sync_once()
        assert b.up and len(b_state.index.replica("e0")) == a_blocks

        # an entry written without the field (an older router) counts only its prompt blocks
        await a.client.xadd(a.keys["prefix"], {"r": "old", "n": "e1", "h": pack_hashes((1, 2, 3))})
        await b.sync_once()
        assert len(b_state.index.replica("e1")) == 3
    finally:
        await a.close()
        await b.close()


async def test_a_router_starts_with_the_caps_its_peers_confirmed(redis_server):
    """Router a confirms an engine's concurrency cap from its scrapes; router b, which has scraped nothing, reads
    it from Redis at its next sync; once b sees the engine run more than that (restarted with a larger cap),
    it stops trusting the shared cap and deletes it for everyone."""

    a, b = share_pair(redis_server, "caps-test")
    a_state, b_state = a.state, b.state
    try:
        for _ in range(CAP_CONFIRMATIONS):
            a_state.record_stats("e0", EngineStats(scraped_at=0.0, waiting=2.0, running=8.0))
        assert a_state.concurrency_of("e0") == 8
        await b.sync_once()
        assert b.up and b_state.concurrency_of("e0") is None  # nothing shared yet
        await a.sync_once()
        await b.sync_once()
        assert b_state.concurrency_of("e0") == 8
        assert 0 < await b.client.ttl(b.keys["caps"]) <= CAPS_TTL_S

        b_state.record_stats("e0", EngineStats(scraped_at=1.0, waiting=0.0, running=11.0))
        assert b_state.concurrency_of("e0") is None
        a_state.record_stats("e0", EngineStats(scraped_at=1.0, waiting=0.0, running=11.0))  # a sees it too
        await b.sync_once()
        assert await b.client.hget(b.keys["caps"], "e0") is None
        await a.sync_once()  # a's own cap was reset by the larger count: nothing to publish again
        assert await a.client.hget(a.keys["caps"], "e0") is None
    finally:
        await a.close()
        await b.close()
