"""The router as the Inference Extension's endpoint picker, driven by the gateway stand-in
(devcluster/gateway-standin: Go on Envoy's go-control-plane, the proxy's side of ext_proc with bodies
FULL_DUPLEX_STREAMED): simulated engines, an in-process router with its EPP port, the stand-in as a
subprocess (stopped by pid). Every request goes client -> stand-in -> (picker) -> engine -> stand-in ->
client, as through a gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenyard.devcluster.gateway_standin import ensure_gateway_standin
from tokenyard.router.discovery import Endpoint
from tokenyard.router.epp_protocol import SERVICE_NAME, endpoint_address
from tokenyard.router.openai_wire import carries_token
from tokenyard.router.server import RouterServer

from .conftest import MODEL, backends_of, wait_for

pytestmark = pytest.mark.integration


class GatewayStandin:
    def __init__(self, binary: Path, epp_port: int, log_path: Path) -> None:
        self.binary, self.epp_port, self.log_path = binary, epp_port, log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.binary),
                "--listen",
                "127.0.0.1:0",
                "--epp",
                f"127.0.0.1:{self.epp_port}",
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
            )
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 20)).decode().strip()
        assert line.startswith("listening on "), f"stand-in said {line!r}; log: {self.log_path.read_text()}"
        self.url = "http://" + line.removeprefix("listening on ")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                os.kill(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()


@pytest.fixture(scope="session")
def standin_binary() -> Path:
    return ensure_gateway_standin()


@pytest.fixture
async def gateway(standin_binary, tmp_path):
    started: list[GatewayStandin] = []

    async def make(server: RouterServer) -> GatewayStandin:
        standin = GatewayStandin(
            standin_binary, server.ports["epp"], tmp_path / f"standin-{len(started)}.log"
        )
        started.append(standin)
        await standin.start()
        return standin

    yield make
    for standin in started:
        await standin.stop()


async def complete(
    http: aiohttp.ClientSession,
    base_url: str,
    prompt: str,
    max_tokens: int = 4,
    stream: bool = True,
    model: str = MODEL,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], str]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    async with http.post(base_url + "/v1/completions", json=body, headers=headers) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, await response.text()


def http_front(server: RouterServer) -> str:
    return f"http://127.0.0.1:{server.ports['http']}"


def idle(server: RouterServer) -> bool:
    return server.state.ledger.open_tickets() == 0 and server.forwarder.in_flight == 0


def answers(server: RouterServer, replica: str, code: str) -> float:
    labels = {"namespace": "", "model": MODEL, "revision": "", "replica": replica, "code": code}
    return server.metrics.registry.get_sample_value("tokenyard_router_requests_total", labels) or 0.0


def served_by(headers: dict[str, str], server: RouterServer) -> str:
    """The replica a response really came from: the stand-in's upstream, by the router's name for it; and
    the picker's own account of it (its response header) must agree."""
    if "x-standin-upstream" not in headers:
        return headers["x-tokenyard-replica"]  # the HTTP front's answer
    names = {endpoint_address(e.url): e.name for e in server.state.endpoints()}
    replica = names[headers["x-standin-upstream"]]
    assert headers["x-tokenyard-replica"] == replica, headers
    return replica


def document(topic: int) -> str:
    return f"Background document {topic}: " + " ".join(f"fact-{topic}-{i}" for i in range(120))


async def test_requests_through_the_standin_are_served_and_accounted(engines, router, gateway, http):
    fleet = await engines(2)
    server = await router(backends_of(fleet), epp_port=0)
    standin = await gateway(server)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['epp']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("liveness", "readiness", SERVICE_NAME):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

    status, headers, text = await complete(http, standin.url, "hello through the gateway", max_tokens=6)
    assert status == 200, text
    replica = served_by(headers, server)
    assert replica in ("e0", "e1")
    assert text.rstrip().endswith("data: [DONE]")
    assert sum(line.startswith("data: {") for line in text.splitlines()) >= 6
    await wait_for(lambda: idle(server), what="the picker to release the request")
    assert answers(server, replica, "200") == 1
    ttft = server.metrics.registry.get_sample_value(
        "tokenyard_router_time_to_first_token_seconds_count",
        {"namespace": "", "model": MODEL, "revision": ""},
    )
    assert ttft == 1  # the first token was seen in the response body passing through the picker

    status, headers, text = await complete(http, standin.url, "a whole answer", stream=False)
    assert status == 200, text
    assert '"choices"' in text
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with http.post(standin.url + "/v1/chat/completions", json=chat) as response:
        assert response.status == 200
        assert (await response.json())["object"] == "chat.completion"
    async with http.get(standin.url + "/v1/models") as response:  # not an inference request: any replica
        assert response.status == 200
        assert [m["id"] for m in (await response.json())["data"]] == [MODEL]
    await wait_for(lambda: idle(server), what="the picker to release every request")
    assert server.state.ledger.snapshot() == {}


async def test_a_stream_through_the_gateway_teaches_the_router_without_showing_the_client_usage(
    engines, router, gateway, http
):
    fleet = await engines(1)
    server = await router(backends_of(fleet), epp_port=0)
    standin = await gateway(server)
    status, _, text = await complete(http, standin.url, document(1), max_tokens=5)
    assert status == 200, text
    # the picker asked the engine for the usage (its Content-Length set to the longer body) and dropped it
    assert text.rstrip().endswith("data: [DONE]") and '"usage"' not in text
    assert sum(carries_token(line.encode()) for line in text.splitlines()) == 5
    await wait_for(lambda: idle(server), what="the picker to release the request")
    learned = server.state.ratio_for(MODEL)
    assert (learned.observations, learned.observed_bytes) == (1, len(document(1).encode()))

    body = {"model": MODEL, "prompt": document(2), "max_tokens": 3, "stream": True}
    body["stream_options"] = {"include_usage": True}
    async with http.post(standin.url + "/v1/completions", json=body) as response:
        assert response.status == 200
        text = await response.text()
    assert '"completion_tokens":3' in text.replace(" ", "")  # asked for by the client: relayed
    await wait_for(lambda: server.state.ratio_for(MODEL).observations == 2, what="the second usage")


async def test_through_the_gateway_an_engine_that_refuses_stream_options_is_remembered(
    router, gateway, http, old_engine
):
    engine_url, got = old_engine
    server = await router([Endpoint("old", engine_url, "")], epp_port=0)
    standin = await gateway(server)
    # The gateway has sent the first request when the refusal comes back and cannot resend it: the client gets
    # the engine's error, as it would from that engine without a router that adds the member.
    status, _, text = await complete(http, standin.url, "Hi", max_tokens=2)
    assert status == 400 and "stream_options" in text
    await wait_for(lambda: server.state.usage_refused == {engine_url}, what="the refusal to be remembered")
    for _ in range(2):
        status, _, text = await complete(http, standin.url, "Hi", max_tokens=2)
        assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
        assert sum(carries_token(line.encode()) for line in text.splitlines()) == 2
    assert got == {"invalid": 0, "with": 1, "without": 2}


async def test_the_standin_and_the_http_front_pick_alike(engines, router, gateway, http):
    """Same state, same pick: a prompt routed by one front goes to the same replica through the other
    (prefix locality), both ways round."""
    fleet = await engines(3)
    server = await router(backends_of(fleet), epp_port=0)
    standin = await gateway(server)
    picks: dict[str, set[str]] = {}
    for topic in range(8):
        first, second = (standin.url, http_front(server)) if topic % 2 else (http_front(server), standin.url)
        for base in (first, second):
            status, headers, text = await complete(http, base, document(topic) + " Question?")
            assert status == 200, text
            picks.setdefault(f"topic {topic}", set()).add(served_by(headers, server))
            await wait_for(lambda: idle(server), what="the request to end")
    assert all(len(replicas) == 1 for replicas in picks.values()), picks
    assert len(set().union(*picks.values())) > 1, picks  # load and locality spread the topics


# A streamed answer long enough to be cut while it runs.
LONG_STREAM = {
    "model": MODEL,
    "prompt": "a long answer please",
    "max_tokens": 2000,
    "stream": True,
    "ignore_eos": True,
}


async def test_client_abort_releases_the_load(engines, router, gateway, http):
    fleet = await engines(1, time_scale=0.5)  # slow enough to be cut mid-stream
    server = await router(backends_of(fleet), epp_port=0)
    standin = await gateway(server)
    response = await http.post(standin.url + "/v1/completions", json=LONG_STREAM)
    assert response.status == 200
    await response.content.readuntil(b"\n\n")  # the first event: the request is running
    load = server.state.ledger.load("e0")
    assert load.requests == 1 and 0 < load.tokens <= 2000 + 100
    response.close()  # the client goes away
    await wait_for(lambda: idle(server), what="the picker to release the aborted request")
    assert answers(server, "e0", "499") == 1


async def test_a_dead_primary_falls_back_and_is_released(engines, router, gateway, http, caplog):
    caplog.set_level(logging.INFO, logger="tokenyard.router")
    fleet = await engines(2)
    # Probes far apart: the router still believes in the dead replica, as it would between two probes.
    server = await router(backends_of(fleet), epp_port=0, probe_interval_s=60.0)
    standin = await gateway(server)
    prompt = document(99) + " Question?"
    status, headers, _ = await complete(http, http_front(server), prompt)
    assert status == 200
    warm = served_by(headers, server)  # the replica that now holds the prompt's prefix
    other = "e1" if warm == "e0" else "e0"
    await fleet[int(warm[1])].stop(drain_timeout_s=0.1)

    status, headers, text = await complete(http, standin.url, prompt)  # locality picks the dead one first
    assert status == 200, text
    assert served_by(headers, server) == other  # and the picker's account moved to the fallback that served
    await wait_for(lambda: idle(server), what="the request served by the fallback to be released")
    assert answers(server, other, "200") >= 1
    dead_url = fleet[int(warm[1])].url
    assert any(
        f"replica {warm} failed: the gateway could not reach {dead_url}" in r.message for r in caplog.records
    )


async def test_no_endpoint_gets_the_protocols_errors(engines, router, gateway, http):
    fleet = await engines(2)
    server = await router(backends_of(fleet), epp_port=0)
    standin = await gateway(server)

    status, headers, text = await complete(http, standin.url, "x", model="nope")
    assert (status, headers.get("x-standin-immediate")) == (404, "true")
    assert "'nope'" in text
    async with http.post(standin.url + "/v1/completions", data=b"{not json") as response:
        assert response.status == 400
        assert "not valid JSON" in (await response.json())["error"]["message"]
    # The gateway's subset hint names no replica of the pool: 503, as the protocol says.
    subset = {"x-standin-subset": "127.0.0.1:9"}
    status, headers, text = await complete(http, standin.url, "x", headers=subset)
    assert (status, headers.get("x-standin-immediate")) == (503, "true"), text
    # ... and a subset of one replica is honoured.
    only = endpoint_address(fleet[1].url)
    for _ in range(3):
        status, headers, _ = await complete(http, standin.url, "x", headers={"x-standin-subset": only})
        assert (status, served_by(headers, server)) == (200, "e1")

    for engine in fleet:
        await engine.stop(drain_timeout_s=0.1)
    await wait_for(
        lambda: server.state.unreachable == {"e0", "e1"}, what="the probes to see both engines down"
    )
    status, headers, text = await complete(http, standin.url, "x")
    assert (status, headers.get("x-standin-immediate")) == (503, "true"), text
    assert "no ready replica" in text or "healthy" in text
    assert idle(server)


async def test_canary_weights_hold_through_the_picker(engines, router, gateway, http):
    fleet = await engines(3)
    server = await router(
        backends_of(fleet, ["stable", "stable", "canary"]),
        traffic=(("stable", 80), ("canary", 20)),
        epp_port=0,
    )
    standin = await gateway(server)
    counts = {"stable": 0, "canary": 0}

    async def one(i: int) -> None:
        status, headers, _ = await complete(http, standin.url, f"request {i} " * 3, max_tokens=1)
        assert status == 200
        counts[headers["x-tokenyard-revision"]] += 1

    total = 200
    for start in range(0, total, 25):
        await asyncio.gather(*(one(i) for i in range(start, start + 25)))
    share = counts["canary"] / total
    assert 0.11 <= share <= 0.29, counts  # 20% +- 9 points (3 sigma for n=200)
    await wait_for(lambda: idle(server), what="every request to be released")


async def test_draining_router_refuses_new_streams_and_finishes_running_ones(engines, router, gateway, http):
    fleet = await engines(1, time_scale=0.2)
    server = await router(backends_of(fleet), epp_port=0, drain_timeout_s=10.0)
    standin = await gateway(server)
    body = {"model": MODEL, "prompt": "finish me", "max_tokens": 40, "stream": True}
    running = await http.post(standin.url + "/v1/completions", json=body)
    assert running.status == 200
    drain = asyncio.create_task(server.drain_and_stop())
    await wait_for(lambda: server.draining, what="the drain to begin")
    status, headers, text = await complete(http, standin.url, "too late")
    assert (status, headers.get("x-standin-immediate")) == (503, "true"), text
    assert "draining" in text
    rest = await running.text()  # the running stream is finished before the router stops
    assert rest.rstrip().endswith("data: [DONE]")
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(drain, 15)
    assert drain.done()


async def test_an_engine_dying_mid_stream_releases_the_load(engines, router, gateway, http):
    (engine,) = await engines(1, time_scale=1.0, crash_after_requests=1)
    server = await router(backends_of([engine]), epp_port=0)
    standin = await gateway(server)
    response = await http.post(standin.url + "/v1/completions", json=LONG_STREAM)
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    assert server.state.ledger.load("e0").requests == 1
    # A second request's arrival crashes the engine (it drops every connection): the stream breaks mid-way.
    with contextlib.suppress(aiohttp.ClientError):
        async with http.post(engine.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}):
            pass
    with pytest.raises(aiohttp.ClientPayloadError):
        await response.read()  # the client sees its stream cut, as a gateway resets it
    await wait_for(lambda: idle(server), what="the picker to release the broken request")
