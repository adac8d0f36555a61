"""Metrics other components read, over real sockets with simulated engines: inter-token latency, paired shadow
comparison, the namespace label, and gRPC routing failures counted like HTTP ones."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from tokenyard.router.discovery import Shadow
from tokenyard.v1 import router_pb2, router_pb2_grpc

from .conftest import MODEL, backends_of, parse_metric, wait_for

pytestmark = pytest.mark.integration


def url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.ports['http']}{path}"


async def metrics_text(http, server) -> str:
    async with http.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as response:
        return await response.text()


async def stream(http, server, prompt: str, max_tokens: int, **extra) -> list[bytes]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, **extra}
    chunks = []
    async with http.post(url(server, "/v1/completions"), json=body) as response:
        assert response.status == 200
        async for chunk in response.content.iter_any():
            chunks.append(chunk)
    return chunks


async def test_inter_token_gaps_are_observed_per_streamed_chunk(engines, router, http):
    server = await router(backends_of(await engines(1, time_scale=1.0)))
    await stream(http, server, "count slowly " * 10, max_tokens=20, ignore_eos=True)
    text = await metrics_text(http, server)
    labels = {"namespace": "", "model": MODEL, "revision": ""}
    gaps = parse_metric(text, "tokenyard_router_inter_token_latency_seconds_count", **labels)
    # 20 tokens streamed one by one: up to 19 gaps after the first (fewer if TCP joined some chunks)
    assert gaps is not None and 10 <= gaps <= 19
    total_gap = parse_metric(text, "tokenyard_router_inter_token_latency_seconds_sum", **labels)
    duration = parse_metric(text, "tokenyard_router_request_duration_seconds_sum", **labels)
    ttft = parse_metric(text, "tokenyard_router_time_to_first_token_seconds_sum", **labels)
    assert 0 < total_gap <= duration - ttft + 1e-6  # the gaps lie between the first token and the end
    # a non-streamed answer arrives in one piece: no gaps to observe
    async with http.post(
        url(server, "/v1/completions"), json={"model": MODEL, "prompt": "whole", "max_tokens": 5}
    ) as response:
        assert response.status == 200
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_inter_token_latency_seconds_count", **labels) == gaps


async def test_shadow_pairs_are_counted_with_the_outcome_of_both_sides(engines, router, http):
    primary = await engines(1)
    shadow = await engines(1)
    server = await router(
        backends_of(primary + shadow, ["v1", "v2"]), traffic=(("v1", 100),), shadow=Shadow("v2", 1.0)
    )

    async def pairs(**labels) -> float:
        text = await metrics_text(http, server)
        return parse_metric(text, "tokenyard_router_shadow_pairs_total", revision="v2", **labels) or 0

    def pairs_are(expected: float, **labels):
        async def check() -> bool:
            return await pairs(**labels) == expected

        return check

    async def matches(match: str) -> float:
        text = await metrics_text(http, server)
        return (
            parse_metric(text, "tokenyard_router_shadow_output_match_total", revision="v2", match=match) or 0
        )

    # greedy requests on two healthy revisions of the same (simulated) model: same outputs
    for i in range(3):
        await stream(http, server, f"greedy question {i} " * 10, max_tokens=8, temperature=0)
    await wait_for(pairs_are(3, outcome="both_ok"), 30, "three both_ok pairs")
    assert await matches("true") == 3 and await matches("false") == 0

    # a sampled request is paired but its outputs are not compared
    await stream(http, server, "sampled question " * 10, max_tokens=8)
    await wait_for(pairs_are(4, outcome="both_ok"), 30, "the sampled pair")
    assert await matches("true") == 3

    # the shadow revision now fails every copy: the client sees nothing of it, the pairs say shadow_only_error
    shadow[0].knobs.error_rate = 1.0
    for i in range(2):
        chunks = await stream(http, server, f"after the failure {i} " * 10, max_tokens=8, temperature=0)
        assert b"".join(chunks).rstrip().endswith(b"data: [DONE]")
    await wait_for(pairs_are(2, outcome="shadow_only_error"), 30, "two shadow_only_error pairs")
    assert await pairs(outcome="primary_only_error") == 0 and await pairs(outcome="both_error") == 0
    assert await matches("true") == 3 and await matches("false") == 0  # failed copies are not compared
    text = await metrics_text(http, server)
    assert parse_metric(
        text, "tokenyard_router_shadow_requests_total", namespace="", revision="v2", outcome="error"
    )


async def freeze_discovery(server):
    """Stops static discovery, so that a model view a test sets stays; returns the current view."""
    discovery = next(task for task in server._tasks if task.get_name() == "static-discovery")
    discovery.cancel()
    await asyncio.gather(discovery, return_exceptions=True)
    return server.state.models[MODEL]


async def test_namespace_label_on_the_client_metrics(engines, router, http):
    server = await router(backends_of(await engines(1)))
    # Static backends have no namespace: the label is there, empty.
    await stream(http, server, "static " * 10, max_tokens=3)
    text = await metrics_text(http, server)
    for name in (
        "tokenyard_router_requests_total",
        "tokenyard_router_time_to_first_token_seconds_count",
        "tokenyard_router_request_duration_seconds_count",
        "tokenyard_router_inter_token_latency_seconds_count",
    ):
        assert parse_metric(text, name, namespace="", model=MODEL) is not None, name

    # A model discovered from a ModelDeployment carries its namespace (static discovery stopped, so that the
    # view set here stays).
    view = await freeze_discovery(server)
    server.state.set_models({MODEL: dataclasses.replace(view, namespace="team-a")})
    await stream(http, server, "discovered " * 10, max_tokens=3)
    server.state.set_models({MODEL: dataclasses.replace(view, namespace="team-a", endpoints=())})
    async with http.post(url(server, "/v1/completions"), json={"model": MODEL, "prompt": "x"}) as response:
        assert response.status == 503
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_requests_total", namespace="team-a", code="200") == 1
    assert parse_metric(text, "tokenyard_router_errors_total", namespace="team-a", code="503") == 1
    assert parse_metric(text, "tokenyard_router_time_to_first_token_seconds_count", namespace="team-a") == 1


async def test_grpc_routing_failures_are_counted_like_http_ones(engines, router, http):
    server = await router(backends_of(await engines(1)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            async for _ in stub.Generate(router_pb2.GenerateRequest(model="nope", prompt="x")):
                pass
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        view = await freeze_discovery(server)
        server.state.set_models({MODEL: dataclasses.replace(view, endpoints=())})  # no replica is ready
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            async for _ in stub.Generate(router_pb2.GenerateRequest(model=MODEL, prompt="x")):
                pass
        assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
    text = await metrics_text(http, server)
    assert parse_metric(text, "tokenyard_router_errors_total", model="", code="404") == 1
    assert parse_metric(text, "tokenyard_router_errors_total", model=MODEL, code="503") == 1
    assert parse_metric(text, "tokenyard_router_requests_total", model=MODEL, code="503") == 1
