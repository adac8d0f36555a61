"""One request exchange behind both fronts: a stream through HTTP and one through gRPC are counted in flight,
have a broken upstream stream recorded, release their load when the client goes, and are drained alike."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import grpc
import pytest
from tokenyard.v1 import router_pb2, router_pb2_grpc

from .conftest import MODEL, backends_of, parse_metric, wait_for

pytestmark = pytest.mark.integration

FRONTS = pytest.mark.parametrize("front", ["http", "grpc"])
# At time scale 1 the simulated engine decodes a token in ~7 ms: this many tokens stream for a few seconds.
LONG_STREAM_TOKENS = 400


async def metric(http, server, name: str, **labels: str) -> float | None:
    async with http.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as response:
        return parse_metric(await response.text(), name, **labels)


class HttpStream:
    """A streamed completion through the HTTP front."""

    def __init__(self, http: aiohttp.ClientSession, server, prompt: str, max_tokens: int) -> None:
        self.http, self.server = http, server
        self.body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        self.response: aiohttp.ClientResponse | None = None
        self.rest = b""  # what finish() read

    async def start(self) -> None:
        """Sends the request and reads the first piece of the answer."""
        url = f"http://127.0.0.1:{self.server.ports['http']}/v1/completions"
        self.response = await self.http.post(url, json=self.body)
        assert self.response.status == 200
        await self.response.content.readany()

    async def finish(self) -> bool:
        """Reads to the end; whether the whole answer came (the stream ended with [DONE])."""
        assert self.response is not None
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async for chunk in self.response.content.iter_any():
                self.rest += chunk
        return self.rest.rstrip().endswith(b"data: [DONE]")

    async def cancel(self) -> None:
        assert self.response is not None
        self.response.close()

    async def close(self) -> None:
        if self.response is not None:
            self.response.close()

    async def refused_while_draining(self) -> bool:
        url = f"http://127.0.0.1:{self.server.ports['http']}/v1/completions"
        async with self.http.post(url, json={**self.body, "max_tokens": 1}) as response:
            return response.status == 503


class GrpcStream:
    """A streamed Generate through the gRPC front."""

    def __init__(self, http: aiohttp.ClientSession, server, prompt: str, max_tokens: int) -> None:
        self.server = server
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
        self.stub = router_pb2_grpc.RouterStub(self.channel)
        self.request = router_pb2.GenerateRequest(
            model=MODEL,
            prompt=prompt,
            sampling=router_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        self.call = None

    async def start(self) -> None:
        self.call = self.stub.Generate(self.request)
        first = await self.call.read()
        assert first is not grpc.aio.EOF and first.endpoint.replica

    async def finish(self) -> bool:
        last = None
        with contextlib.suppress(grpc.aio.AioRpcError):
            while (reply := await self.call.read()) is not grpc.aio.EOF:
                last = reply
        return last is not None and last.usage.completion_tokens == self.request.sampling.max_tokens

    async def cancel(self) -> None:
        self.call.cancel()

    async def close(self) -> None:
        await self.channel.close()

    async def refused_while_draining(self) -> bool:
        request = router_pb2.GenerateRequest(
            model=MODEL, prompt="late", sampling=router_pb2.SamplingParams(max_tokens=1)
        )
        try:
            async for _ in self.stub.Generate(request):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.UNAVAILABLE and "draining" in (error.details() or "")
        return False


@contextlib.asynccontextmanager
async def streamed(front: str, http, server, prompt: str = "tell me a long story", max_tokens: int = 5000):
    stream = (HttpStream if front == "http" else GrpcStream)(http, server, prompt, max_tokens)
    try:
        yield stream
    finally:
        await stream.close()


@FRONTS
async def test_a_stream_is_in_flight_until_it_ends(front, engines, router, http):
    server = await router(backends_of(await engines(1, time_scale=1.0)))
    async with streamed(front, http, server, max_tokens=LONG_STREAM_TOKENS // 4) as stream:
        await stream.start()
        assert await metric(http, server, "tokenyard_router_in_flight_requests") == 1
        assert server.forwarder.in_flight == 1
        assert await stream.finish()
    await wait_for(lambda: server.forwarder.in_flight == 0, 5, "the exchange to end")
    assert await metric(http, server, "tokenyard_router_in_flight_requests") == 0
    assert await metric(http, server, "tokenyard_router_requests_total", model=MODEL, code="200") == 1


@FRONTS
async def test_a_broken_upstream_stream_is_counted_and_released(front, engines, router, http):
    # The engine crashes (drops every connection) when a second request reaches it.
    fleet = await engines(1, time_scale=1.0, crash_after_requests=1)
    server = await router(backends_of(fleet))
    async with streamed(front, http, server) as stream:
        await stream.start()
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(fleet[0].url + "/v1/completions", json={"model": MODEL, "prompt": "x"}):
                pass
        assert not await stream.finish()  # the client never gets the whole answer
        if front == "http":  # and the stream says so: it cannot end like a whole answer
            last_event = stream.rest.strip().split(b"\n\n")[-1]
            assert last_event.startswith(b"data: ") and json.loads(last_event[6:])["error"]["code"] == 502
    await wait_for(lambda: server.state.ledger.open_tickets() == 0, 5, "the ticket to close")
    assert await metric(http, server, "tokenyard_router_errors_total", model=MODEL, code="502") == 1
    assert await metric(http, server, "tokenyard_router_requests_total", model=MODEL, code="502") == 1
    assert await metric(http, server, "tokenyard_router_in_flight_requests") == 0


@FRONTS
async def test_load_is_released_when_the_client_goes_away(front, engines, router, http):
    fleet = await engines(1, time_scale=1.0)
    server = await router(backends_of(fleet))
    async with streamed(front, http, server) as stream:
        await stream.start()
        assert server.state.ledger.load("e0").tokens > 0
        assert fleet[0]._streams  # the engine is generating
        await stream.cancel()  # the client goes away mid-stream
        await wait_for(lambda: server.state.ledger.open_tickets() == 0, 5, "the ticket to close")
    assert server.state.ledger.load("e0").tokens == 0
    await wait_for(lambda: not fleet[0]._streams, 5, "the engine to abort the request")
    assert await metric(http, server, "tokenyard_router_requests_total", code="499") == 1
    assert await metric(http, server, "tokenyard_router_in_flight_requests") == 0


@FRONTS
async def test_drain_lets_a_stream_finish_within_the_drain_timeout(front, engines, router, http):
    # The stream lasts a few seconds: longer than the 1 s grace the gRPC front once had, within the drain.
    server = await router(backends_of(await engines(1, time_scale=1.0)), drain_timeout_s=30.0)
    async with streamed(front, http, server, max_tokens=LONG_STREAM_TOKENS) as stream:
        await stream.start()
        drain = asyncio.create_task(server.drain_and_stop())
        await wait_for(lambda: server.draining, 5, "the drain to begin")
        assert await stream.refused_while_draining()
        assert await stream.finish()  # the whole answer came
        await asyncio.wait_for(drain, 10)
