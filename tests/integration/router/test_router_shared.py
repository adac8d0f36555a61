"""Two router processes sharing load and prefix state through a real redis-server, and Redis going away."""

from __future__ import annotations

import grpc
import pytest
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
