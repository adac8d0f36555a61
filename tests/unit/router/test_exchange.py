"""The router's ``Exchange`` driven directly (no front) against fake engines on loopback sockets: the load
ledger entry taken on entering and released however the exchange ends, the retry policy (one retry on another
replica, after a connect error or a 503 before the first byte; other statuses are relayed), a replica's
failures recorded, the client going away, shadow copies and their pairs, and the metrics each ending counts.

The fake engine writes its stream one piece at a time when the test says so, and the forwarder's clock is the
test's, so that latencies and ledger values are exact."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import pytest
from aiohttp import web
from tokenyard.router.accounting import EjectionPolicy, ReplicaLoad
from tokenyard.router.discovery import Endpoint, ModelView, Shadow
from tokenyard.router.exchange import Ending, StreamBroken
from tokenyard.router.openai_wire import COMPLETIONS_PATH, InferenceRequest, parse_request
from tokenyard.router.proxy import Forwarder
from tokenyard.router.state import RouterSettings, RouterState, RoutingError
from tokenyard.router.telemetry import RouterMetrics

from .test_scrape import count, session  # noqa: F401 - session is a fixture used by the tests

MODEL = "m"
PROMPT = "tell me a story about a lighthouse keeper " * 4
DONE = b"data: [DONE]\n\n"
END = "end"  # the engine finishes its stream: [DONE], then the end of the body
DIE = "die"  # the engine drops the connection mid-stream


def event(text: str) -> bytes:
    return (
        b"data: "
        + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]}).encode()
        + b"\n\n"
    )


class FakeEngine:
    """An OpenAI completions endpoint on 127.0.0.1. It answers ``status`` before any byte when that is not 200
    (a JSON error body), ``json_body`` whole when set, and otherwise an event stream whose writes the test hands
    over one by one (``send``: bytes, END or DIE). ``hold`` keeps the response headers back until it is set.
    ``aborted`` is set when the router closes a request before the engine finished it."""

    def __init__(self, status: int = 200, json_body: dict | None = None) -> None:
        self.status = status
        self.json_body = json_body
        self.hold: asyncio.Event | None = None
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.received = asyncio.Event()
        self.aborted = asyncio.Event()
        self._outbox: asyncio.Queue[bytes | str] = asyncio.Queue()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def send(self, *items: bytes | str) -> None:
        for item in items:
            self._outbox.put_nowait(item)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.read())
        self.paths.append(request.path)
        self.received.set()
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.status != 200:
                return web.json_response({"error": {"message": "engine says no"}}, status=self.status)
            if self.json_body is not None:
                return web.json_response(self.json_body)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            while True:
                item = await self._outbox.get()
                if item == END:
                    await response.write(DONE)
                    await response.write_eof()
                    return response
                if item == DIE:
                    assert request.transport is not None
                    request.transport.abort()  # mid-body: the chunked answer never ends
                    return response
                await response.write(item)
        except asyncio.CancelledError:  # the router closed the connection (handler_cancellation)
            self.aborted.set()
            raise

    async def start(self) -> FakeEngine:
        app = web.Application()
        app.router.add_post(COMPLETIONS_PATH, self.completions)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()


class Clock:
    """The forwarder's monotonic clock, moved by the test."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Router:
    """A forwarder over a router state whose model ``m`` is served by the given replicas. One failure ejects a
    replica (``EjectionPolicy(consecutive_failures=1)``), so that every failure the exchange records shows as
    an ejection."""

    def __init__(self, http, endpoints: list[Endpoint], shadow: Shadow | None = None) -> None:
        self.clock = Clock()
        self.state = RouterState(
            RouterSettings(ejection=EjectionPolicy(consecutive_failures=1)), rng=random.Random(0)
        )
        self.state.set_models({MODEL: ModelView(MODEL, tuple(endpoints), shadow=shadow)})
        self.metrics = RouterMetrics()
        self.forwarder = Forwarder(self.state, self.metrics, http, clock=self.clock)

    def count(self, name: str, **labels: str) -> float:
        return count(self.metrics, name, **labels)

    def answered(self, replica: str, code: int, revision: str = "") -> tuple[float, float]:
        """(requests, errors) counted for the replica with that code."""
        labels = {
            "namespace": "",
            "model": MODEL,
            "revision": revision,
            "replica": replica,
            "code": str(code),
        }
        return (
            self.count("tokenyard_router_requests_total", **labels),
            self.count("tokenyard_router_errors_total", **labels),
        )

    def total(self, name: str) -> float:
        return sum(
            sample.value
            for family in self.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name
        )

    def ejected(self, replica: str) -> bool:
        return self.state.failures.is_ejected(replica, self.clock())

    def first_choice(self, replica: str) -> list:
        """Make ``replica`` the routing's first choice: every other replica looks busy (a big ledger ticket
        each, closed by ``release``)."""
        return [
            self.state.ledger.open(e.name, 0, 10_000) for e in self.state.endpoints() if e.name != replica
        ]

    def release(self, tickets: list) -> None:
        for ticket in tickets:
            self.state.ledger.close(ticket)

    def assert_idle(self) -> None:
        """Nothing left on the ledger, no request in flight."""
        assert self.state.ledger.snapshot() == {}
        assert self.state.ledger.open_tickets() == 0
        assert self.forwarder.in_flight == 0 and self.forwarder.idle.is_set()
        assert self.count("tokenyard_router_in_flight_requests") == 0


def completion(max_tokens: int = 8, stream: bool = True, **fields) -> InferenceRequest:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "stream": stream, **fields}
    return parse_request(COMPLETIONS_PATH, json.dumps(body).encode(), default_max_tokens=256)


@pytest.fixture
async def engines():
    started: list[FakeEngine] = []

    async def make(*fakes: FakeEngine) -> list[FakeEngine]:
        for fake in fakes:
            started.append(await fake.start())
        return list(fakes)

    yield make
    for fake in started:
        await fake.stop()


@pytest.fixture
async def router(session):  # noqa: F811 - the fixture imported above
    made: list[Router] = []

    def make(endpoints: list[Endpoint], shadow: Shadow | None = None) -> Router:
        made.append(Router(session, endpoints, shadow))
        return made[-1]

    yield make
    for each in made:
        await each.forwarder.close()


def refused_endpoint(name: str) -> tuple[Endpoint, socket.socket]:
    """An endpoint whose port is bound but not listening: connecting is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return Endpoint(name, f"http://127.0.0.1:{sock.getsockname()[1]}"), sock


# --- a stream that ends well --------------------------------------------------------------------------------


async def test_a_streamed_completion_reaches_the_caller_and_its_ledger_entry_lives_as_long_as_the_exchange(
    engines, router
):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    request = completion(max_tokens=8)
    started = r.clock()
    async with r.forwarder.exchange(request) as exchange:
        route = exchange.route
        assert route is not None and route.endpoint.name == "e0" and exchange.attempts == 1
        assert exchange.response.status == 200 and exchange.streams
        assert engine.paths == [COMPLETIONS_PATH] and engine.bodies == [request.body]  # forwarded as is
        # entering took the ticket: the whole prompt to prefill (nothing cached yet) plus the expected decode
        assert route.prefix_match_tokens == 0 and route.prompt_tokens == len(PROMPT) // 4
        assert r.state.ledger.load("e0") == ReplicaLoad(route.prompt_tokens + 8, 1)
        assert r.forwarder.in_flight == 1 and not r.forwarder.idle.is_set()
        assert r.count("tokenyard_router_in_flight_requests") == 1

        chunks = exchange.stream()
        r.clock.now = started + 0.5
        engine.send(event("Once"))
        chunk, events = await anext(chunks)
        assert chunk == event("Once") and [e.text for e in events] == ["Once"]
        # the first token ends the prefill and is one decode token
        assert r.state.ledger.load("e0") == ReplicaLoad(7, 1)
        ttft = {"namespace": "", "model": MODEL, "revision": ""}
        assert r.count("tokenyard_router_time_to_first_token_seconds_count", **ttft) == 1
        assert r.count("tokenyard_router_time_to_first_token_seconds_sum", **ttft) == pytest.approx(0.5)

        r.clock.now = started + 0.75
        engine.send(event(" upon"))
        chunk, events = await anext(chunks)
        assert chunk == event(" upon") and [e.text for e in events] == [" upon"]
        assert r.state.ledger.load("e0") == ReplicaLoad(6, 1)
        assert r.count("tokenyard_router_inter_token_latency_seconds_count", **ttft) == 1
        assert r.count("tokenyard_router_inter_token_latency_seconds_sum", **ttft) == pytest.approx(0.25)

        engine.send(END)
        rest = [chunk async for chunk, _ in chunks]
        assert b"".join(rest) == DONE
        assert r.state.ledger.load("e0").requests == 1  # still open until the exchange is left
        r.clock.now = started + 1.0

    assert exchange.ending is Ending.SUCCESS and exchange.code == 200
    r.assert_idle()
    assert r.answered("e0", 200) == (1, 0)
    assert r.total("tokenyard_router_requests_total") == 1 and r.total("tokenyard_router_errors_total") == 0
    assert r.count("tokenyard_router_request_duration_seconds_count", **ttft) == 1
    assert r.count("tokenyard_router_request_duration_seconds_sum", **ttft) == pytest.approx(1.0)
    assert r.count("tokenyard_router_decision_duration_seconds_count") == 1
    assert r.total("tokenyard_router_retries_total") == 0 and not r.ejected("e0")


async def test_a_whole_answer_is_read_accounted_and_released(engines, router):
    answer = {"choices": [{"index": 0, "text": "a whole answer", "finish_reason": "stop"}]}
    (engine,) = await engines(FakeEngine(json_body=answer))
    r = router([Endpoint("e0", engine.url)])
    started = r.clock()
    async with r.forwarder.exchange(completion(stream=False)) as exchange:
        assert not exchange.streams
        r.clock.now = started + 2.0
        assert json.loads(await exchange.read()) == answer
    assert exchange.ending is Ending.SUCCESS
    r.assert_idle()
    assert r.answered("e0", 200) == (1, 0)
    labels = {"namespace": "", "model": MODEL, "revision": ""}
    assert r.count("tokenyard_router_time_to_first_token_seconds_sum", **labels) == pytest.approx(2.0)
    assert r.count("tokenyard_router_inter_token_latency_seconds_count", **labels) == 0


async def test_an_unknown_model_is_a_rejection_that_leaves_nothing_behind(engines, router):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    request = parse_request(COMPLETIONS_PATH, json.dumps({"model": "nope", "prompt": "x"}).encode(), 16)
    with pytest.raises(RoutingError) as error:
        async with r.forwarder.exchange(request):
            pytest.fail("entered an exchange for a model nobody serves")
    assert error.value.status == 404 and not error.value.attempted
    r.assert_idle()
    assert engine.bodies == []
    labels = {"namespace": "", "model": "", "revision": "", "replica": "", "code": "404"}
    assert r.count("tokenyard_router_requests_total", **labels) == 1
    assert r.count("tokenyard_router_errors_total", **labels) == 1


# --- retries and failures before the first byte --------------------------------------------------------------


async def test_a_503_before_the_first_byte_is_retried_once_on_another_replica(engines, router):
    bad, good = await engines(FakeEngine(status=503), FakeEngine())
    r = router([Endpoint("e0", bad.url), Endpoint("e1", good.url)])
    busy = r.first_choice("e0")
    request = completion()
    good.send(event("fine"), END)
    async with r.forwarder.exchange(request) as exchange:
        r.release(busy)
        assert exchange.attempts == 2 and exchange.route.endpoint.name == "e1"
        assert exchange.response.status == 200
        assert bad.bodies == [request.body] and good.bodies == [request.body]
        # the first replica's ticket was returned at the retry; only the second one's is open
        assert r.state.ledger.load("e0") == ReplicaLoad(0, 0)
        assert r.state.ledger.load("e1").requests == 1 and r.state.ledger.open_tickets() == 1
        body = b"".join([chunk async for chunk, _ in exchange.stream()])
    assert body == event("fine") + DONE
    assert exchange.ending is Ending.SUCCESS and exchange.code == 200
    r.assert_idle()
    # the 503 is e0's failure (it is ejected at once under this policy) and one retry; e1's success only
    assert r.ejected("e0") and not r.ejected("e1")
    assert r.count("tokenyard_router_ejections_total", replica="e0") == 1
    assert r.count("tokenyard_router_retries_total", model=MODEL, replica="e0") == 1
    assert r.total("tokenyard_router_retries_total") == 1
    assert r.answered("e1", 200) == (1, 0)
    assert r.total("tokenyard_router_requests_total") == 1 and r.total("tokenyard_router_errors_total") == 0
    assert r.count("tokenyard_router_decision_duration_seconds_count") == 2


async def test_a_refused_connection_is_retried_once_on_another_replica(engines, router):
    (good,) = await engines(FakeEngine())
    dead, sock = refused_endpoint("e0")
    with sock:
        r = router([dead, Endpoint("e1", good.url)])
        busy = r.first_choice("e0")
        good.send(event("fine"), END)
        async with r.forwarder.exchange(completion()) as exchange:
            r.release(busy)
            assert exchange.attempts == 2 and exchange.route.endpoint.name == "e1"
            assert r.state.ledger.load("e0") == ReplicaLoad(0, 0)
            await exchange.discard_answer()
    assert exchange.ending is Ending.SUCCESS
    r.assert_idle()
    assert r.ejected("e0") and r.count("tokenyard_router_retries_total", model=MODEL, replica="e0") == 1
    assert r.answered("e1", 200) == (1, 0)


async def test_a_500_is_not_retried_but_relayed_and_recorded_as_the_replicas_failure(engines, router):
    bad, good = await engines(FakeEngine(status=500), FakeEngine())
    r = router([Endpoint("e0", bad.url), Endpoint("e1", good.url)])
    busy = r.first_choice("e0")
    async with r.forwarder.exchange(completion()) as exchange:
        r.release(busy)
        assert exchange.attempts == 1 and exchange.route.endpoint.name == "e0"
        assert exchange.response.status == 500 and not exchange.streams
        assert json.loads(await exchange.read()) == {"error": {"message": "engine says no"}}
    assert exchange.ending is Ending.UPSTREAM_ERROR and exchange.code == 500
    assert good.bodies == []
    r.assert_idle()
    assert r.ejected("e0") and r.total("tokenyard_router_retries_total") == 0
    assert r.answered("e0", 500) == (1, 1)


async def test_when_the_retry_answers_503_too_that_answer_is_relayed_and_both_failures_recorded(
    engines, router
):
    first, second = await engines(FakeEngine(status=503), FakeEngine(status=503))
    r = router([Endpoint("e0", first.url), Endpoint("e1", second.url)])
    busy = r.first_choice("e0")
    async with r.forwarder.exchange(completion()) as exchange:
        r.release(busy)
        assert exchange.attempts == 2 and exchange.route.endpoint.name == "e1"
        assert exchange.response.status == 503
        await exchange.read()
    assert exchange.ending is Ending.UPSTREAM_ERROR and exchange.code == 503
    r.assert_idle()
    assert r.ejected("e0") and r.ejected("e1")
    assert r.count("tokenyard_router_retries_total", model=MODEL, replica="e0") == 1
    assert r.count("tokenyard_router_retries_total", model=MODEL, replica="e1") == 0  # no third attempt
    assert r.answered("e1", 503) == (1, 1) and r.answered("e0", 503) == (0, 0)


@pytest.fixture(params=["503", "refused"])
async def lone_failing_replica(request, engines):
    """The only replica of the model fails before the first byte: it answers 503, or refuses connections."""
    if request.param == "503":
        (bad,) = await engines(FakeEngine(status=503))
        yield Endpoint("e0", bad.url), 503
    else:
        dead, sock = refused_endpoint("e0")
        with sock:
            yield dead, 502


async def test_a_lone_replica_that_fails_before_the_first_byte_is_a_rejection(lone_failing_replica, router):
    endpoint, client_status = lone_failing_replica
    r = router([endpoint])
    with pytest.raises(RoutingError) as error:
        async with r.forwarder.exchange(completion()):
            pytest.fail("entered an exchange no replica took")
    # what went wrong with the replica, not "no replica left to try"
    assert error.value.status == client_status and error.value.attempted and "e0" in error.value.message
    r.assert_idle()
    assert r.ejected("e0")
    labels = {"namespace": "", "model": MODEL, "revision": "", "replica": "", "code": str(client_status)}
    assert r.count("tokenyard_router_requests_total", **labels) == 1
    assert r.count("tokenyard_router_errors_total", **labels) == 1


async def test_no_retry_is_counted_when_no_other_replica_is_left(lone_failing_replica, router):
    endpoint, _ = lone_failing_replica
    r = router([endpoint])
    with pytest.raises(RoutingError):
        async with r.forwarder.exchange(completion()):
            pass
    assert r.count("tokenyard_router_retries_total", model=MODEL, replica="e0") == 0


# --- the stream breaks, the client goes ----------------------------------------------------------------------


@pytest.mark.parametrize("caught", [True, False], ids=["caught-inside", "propagates"])
@pytest.mark.parametrize(
    ("breaks", "decode"),
    [(DIE, False), (b"data: {this is not json\n\n", True)],
    ids=["connection-dropped", "undecodable-event"],
)
async def test_a_stream_that_breaks_is_recorded_and_its_ledger_entry_released(
    engines, router, breaks, decode, caught
):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    engine.send(event("Once"))
    received: list[bytes] = []

    async def relay(exchange) -> None:
        async for chunk, _ in exchange.stream(decode=decode):
            received.append(chunk)
            engine.send(breaks)  # only once the first event was read: the two never arrive in one read

    exchange = r.forwarder.exchange(completion())
    if caught:  # as the HTTP front does: its status line is sent, its client sees the stream end early
        async with exchange:
            with pytest.raises(StreamBroken, match="replica e0"):
                await relay(exchange)
            assert r.state.ledger.load("e0").requests == 1  # released when the exchange is left
    else:
        with pytest.raises(StreamBroken, match="replica e0"):
            async with exchange:
                await relay(exchange)
    assert received == [event("Once")]
    assert exchange.ending is Ending.UPSTREAM_ERROR and exchange.code == 502
    r.assert_idle()
    assert r.ejected("e0") and r.count("tokenyard_router_ejections_total", replica="e0") == 1
    assert r.answered("e0", 502) == (1, 1)
    assert r.answered("e0", 200) == (0, 0)


@pytest.mark.parametrize("how", ["cancelled", "write-failed"])
async def test_a_client_that_goes_away_mid_stream_releases_the_ledger_and_aborts_the_engine(
    engines, router, how
):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    engine.send(event("Once"))
    relayed = asyncio.Event()
    exchanges = []

    async def client() -> None:
        async with r.forwarder.exchange(completion()) as exchange:
            exchanges.append(exchange)
            async for _chunk, _ in exchange.stream():
                relayed.set()
                if how == "write-failed":  # the front's write to a client that closed its connection
                    raise ConnectionResetError("client closed")

    task = asyncio.create_task(client())
    await asyncio.wait_for(relayed.wait(), 5)
    if how == "cancelled":  # the front's handler cancelled
        assert r.state.ledger.load("e0").requests == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        with pytest.raises(ConnectionResetError):
            await task
    (exchange,) = exchanges
    assert exchange.ending is Ending.CLIENT_GONE and exchange.code == 499
    r.assert_idle()
    await asyncio.wait_for(engine.aborted.wait(), 5)  # the upstream request was aborted, not left generating
    assert r.answered("e0", 499) == (1, 1)
    assert not r.ejected("e0") and r.total("tokenyard_router_ejections_total") == 0  # not the replica's fault


async def test_a_client_that_goes_away_before_the_answer_starts_releases_the_ledger(engines, router):
    (engine,) = await engines(FakeEngine())
    engine.hold = asyncio.Event()  # the engine keeps its response headers back
    r = router([Endpoint("e0", engine.url)])

    async def client() -> None:
        async with r.forwarder.exchange(completion()):
            pytest.fail("the engine never answered")

    task = asyncio.create_task(client())
    await asyncio.wait_for(engine.received.wait(), 5)
    assert r.state.ledger.load("e0").requests == 1 and r.forwarder.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r.assert_idle()
    await asyncio.wait_for(engine.aborted.wait(), 5)
    assert not r.ejected("e0")


# --- shadow copies -------------------------------------------------------------------------------------------


def shadowed_router(router, primary: FakeEngine, shadow: FakeEngine) -> Router:
    """Revision v1 (e0) serves the clients; every request is copied to revision v2 (e1)."""
    return router(
        [Endpoint("e0", primary.url, "v1"), Endpoint("e1", shadow.url, "v2")], shadow=Shadow("v2", 1.0)
    )


def shadow_counts(r: Router, name: str, key: str) -> dict[str, float]:
    """A shadow metric of revision v2 by its ``key`` label (outcome or match), zero values left out."""
    found: dict[str, float] = {}
    for family in r.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("revision") == "v2" and sample.value:
                found[sample.labels[key]] = sample.value
    return found


@pytest.mark.parametrize("shadow_ends", ["first", "last"])
@pytest.mark.parametrize(
    ("shadow_answer", "copy_outcome", "pair_outcome", "match"),
    [
        ([event("Once"), event(" upon"), END], "ok", "both_ok", "true"),
        ([event("Twice"), END], "ok", "both_ok", "false"),
        (503, "error", "shadow_only_error", None),
    ],
    ids=["same-output", "other-output", "shadow-fails"],
)
async def test_a_shadow_copy_runs_beside_the_primary_and_the_pair_is_counted_once_both_ended(
    engines, router, shadow_answer, copy_outcome, pair_outcome, match, shadow_ends
):
    primary, shadow = await engines(
        FakeEngine(), FakeEngine(status=shadow_answer if isinstance(shadow_answer, int) else 200)
    )
    if not isinstance(shadow_answer, int):
        shadow.send(*shadow_answer)
    shadow.hold = asyncio.Event()
    r = shadowed_router(router, primary, shadow)
    request = completion(temperature=0)  # greedy: the outputs are compared
    assert request.greedy

    async with r.forwarder.exchange(request) as exchange:
        assert exchange.route.endpoint.name == "e0" and exchange.pair is not None
        copies = set(r.forwarder._shadow_tasks)
        assert len(copies) == 1
        await asyncio.wait_for(shadow.received.wait(), 5)
        # the copy is the same request, on the shadow revision's ledger, and not a client request in flight
        assert shadow.bodies == [request.body]
        assert r.state.ledger.load("e1").requests == 1 and r.forwarder.in_flight == 1
        if shadow_ends == "first":
            shadow.hold.set()
            await asyncio.wait_for(asyncio.gather(*copies), 5)
            assert (
                shadow_counts(r, "tokenyard_router_shadow_pairs_total", "outcome") == {}
            )  # primary still on
        primary.send(event("Once"), event(" upon"), END)
        await exchange.discard_answer()
    assert exchange.ending is Ending.SUCCESS
    if shadow_ends == "last":
        assert shadow_counts(r, "tokenyard_router_shadow_pairs_total", "outcome") == {}  # copy still on
        shadow.hold.set()
        await asyncio.wait_for(asyncio.gather(*copies), 5)

    r.assert_idle()
    assert shadow_counts(r, "tokenyard_router_shadow_requests_total", "outcome") == {copy_outcome: 1}
    assert (
        r.count("tokenyard_router_shadow_duration_seconds_count", namespace="", model=MODEL, revision="v2")
        == 1
    )
    assert shadow_counts(r, "tokenyard_router_shadow_pairs_total", "outcome") == {pair_outcome: 1}
    assert shadow_counts(r, "tokenyard_router_shadow_output_match_total", "match") == (
        {match: 1} if match else {}
    )
    # only the primary is a client's answer
    assert r.answered("e0", 200, revision="v1") == (1, 0)
    assert r.total("tokenyard_router_requests_total") == 1 and r.total("tokenyard_router_errors_total") == 0
    assert r.ejected("e1") is (copy_outcome == "error")  # a failing copy is its replica's failure too


async def test_a_primary_whose_client_went_away_makes_no_pair(engines, router):
    primary, shadow = await engines(FakeEngine(), FakeEngine())
    shadow.send(event("Once"), END)
    shadow.hold = asyncio.Event()
    r = shadowed_router(router, primary, shadow)
    primary.send(event("Once"))
    relayed = asyncio.Event()

    async def client() -> None:
        async with r.forwarder.exchange(completion(temperature=0)) as exchange:
            async for _ in exchange.stream():
                relayed.set()

    task = asyncio.create_task(client())
    await asyncio.wait_for(relayed.wait(), 5)
    copies = set(r.forwarder._shadow_tasks)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    shadow.hold.set()
    await asyncio.wait_for(asyncio.gather(*copies), 5)
    r.assert_idle()
    assert shadow_counts(r, "tokenyard_router_shadow_requests_total", "outcome") == {"ok": 1}
    assert shadow_counts(r, "tokenyard_router_shadow_pairs_total", "outcome") == {}
    assert r.answered("e0", 499, revision="v1") == (1, 1)


async def test_a_shadow_copy_cancelled_at_shutdown_is_not_counted_as_the_revisions_error(
    engines, router, monkeypatch
):
    primary, shadow = await engines(FakeEngine(), FakeEngine())
    r = shadowed_router(router, primary, shadow)
    shadow.send(event("Once"))  # the copy streams, then the engine goes quiet
    shadow_streaming = asyncio.Event()
    first_token = r.state.ledger.first_token

    def spy(ticket, now=None) -> None:
        if ticket.replica == "e1":
            shadow_streaming.set()
        first_token(ticket, now)

    monkeypatch.setattr(r.state.ledger, "first_token", spy)
    primary.send(event("Once"), END)
    async with r.forwarder.exchange(completion()) as exchange:
        await exchange.discard_answer()
    await asyncio.wait_for(shadow_streaming.wait(), 5)
    await r.forwarder.close()  # shutdown cancels the copy mid-stream
    r.assert_idle()
    await asyncio.wait_for(shadow.aborted.wait(), 5)
    assert shadow_counts(r, "tokenyard_router_shadow_requests_total", "outcome").get("error", 0) == 0


async def test_no_copy_runs_while_every_shadow_slot_is_taken(engines, router, session):  # noqa: F811
    primary, shadow = await engines(FakeEngine(), FakeEngine())
    r = shadowed_router(router, primary, shadow)
    r.forwarder = Forwarder(r.state, r.metrics, session, clock=r.clock, shadow_concurrency=1)
    shadow.hold = asyncio.Event()
    primary.send(event("a"), END, event("b"), END)
    async with r.forwarder.exchange(completion()) as first:
        await first.discard_answer()
    await asyncio.wait_for(shadow.received.wait(), 5)  # the first copy holds the only slot
    async with r.forwarder.exchange(completion()) as second:
        assert second.pair is None
        await second.discard_answer()
    assert shadow_counts(r, "tokenyard_router_shadow_requests_total", "outcome") == {"dropped": 1}
    shadow.hold.set()
    shadow.send(END)
    await asyncio.wait_for(asyncio.gather(*r.forwarder._shadow_tasks), 5)
    assert shadow_counts(r, "tokenyard_router_shadow_requests_total", "outcome") == {"dropped": 1, "ok": 1}
    assert len(shadow.bodies) == 1
    await r.forwarder.close()
    r.assert_idle()


# --- what the engine's usage teaches -----------------------------------------------------------------------


async def test_the_prompt_tokens_an_engine_reports_teach_the_bytes_per_token_ratio(engines, router):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    usage = {"prompt_tokens": len(PROMPT) // 8, "completion_tokens": 1, "total_tokens": len(PROMPT) // 8 + 1}
    async with r.forwarder.exchange(completion(stream_options={"include_usage": True})) as exchange:
        engine.send(
            event("x"), b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n", END
        )
        async for _ in exchange.stream():
            pass
    learned = r.state.bytes_per_token[MODEL]
    assert learned.observations == 1
    assert (learned.observed_bytes, learned.observed_tokens) == (len(PROMPT), len(PROMPT) // 8)


async def test_a_stream_without_usage_teaches_nothing(engines, router):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    async with r.forwarder.exchange(completion()) as exchange:
        engine.send(event("x"), END)
        async for _ in exchange.stream():
            pass
    assert r.state.ratio_for(MODEL).observations == 0


async def test_a_finished_answer_teaches_its_output_length_a_broken_one_does_not(engines, router):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    async with r.forwarder.exchange(completion()) as exchange:
        engine.send(event("a"), event("b"), event("c"), END)
        async for _ in exchange.stream():
            pass
    assert r.state.output_length_for(MODEL).total_tokens == 3  # counted from the events: no usage here
    with pytest.raises(StreamBroken):
        async with r.forwarder.exchange(completion()) as exchange:
            engine.send(event("a"), DIE)
            async for _ in exchange.stream():
                pass
    assert r.state.output_length_for(MODEL).observations == 1


async def test_an_answer_that_reaches_its_clients_cap_is_learned_as_cut_short(engines, router):
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    uncapped = json.dumps({"model": MODEL, "prompt": PROMPT, "stream": True}).encode()
    requests = (
        completion(max_tokens=3),  # cut at its cap
        completion(max_tokens=8),  # ended by itself under it
        parse_request(
            COMPLETIONS_PATH, uncapped, default_max_tokens=3
        ),  # no cap named: the router's guess is none
    )
    for request in requests:
        async with r.forwarder.exchange(request) as exchange:
            engine.send(event("a"), event("b"), event("c"), END)
            async for _ in exchange.stream():
                pass
    lengths = r.state.output_length_for(MODEL)
    assert lengths.observations == 3
    assert lengths.capped_answers == pytest.approx(1.0, rel=0.01)  # the first only (decayed by two answers)


@pytest.mark.parametrize("usage", [None, {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26}])
async def test_a_whole_answer_teaches_its_length_only_through_its_usage(engines, router, usage):
    answer = {"choices": [{"index": 0, "text": "a whole answer", "finish_reason": "stop"}]}
    if usage:
        answer["usage"] = usage
    (engine,) = await engines(FakeEngine(json_body=answer))
    r = router([Endpoint("e0", engine.url)])
    async with r.forwarder.exchange(completion(stream=False)) as exchange:
        await exchange.read()
    lengths = r.state.output_length_for(MODEL)
    assert (lengths.observations, lengths.total_tokens) == ((1, 5) if usage else (0, 0))


async def test_n_answers_hold_n_places_on_the_ledger_and_teach_n_answers_of_their_mean_length(
    engines, router
):
    """``n``: the engines run n sequences for it and sum their tokens in its usage."""
    usage = {"prompt_tokens": 21, "completion_tokens": 30, "total_tokens": 51}
    answer = {
        "choices": [{"index": i, "text": "x", "finish_reason": "stop"} for i in range(3)],
        "usage": usage,
    }
    (engine,) = await engines(FakeEngine(json_body=answer))
    r = router([Endpoint("e0", engine.url)])
    async with r.forwarder.exchange(completion(stream=False, max_tokens=50, n=3)) as exchange:
        load = r.state.ledger.load("e0")
        assert load.requests == 3
        assert load.tokens >= 3 * 50  # each answer charged its cap: nothing learned yet
        await exchange.read()
    assert r.state.ledger.load("e0").requests == 0
    lengths = r.state.output_length_for(MODEL)
    assert lengths.observations == 3
    assert lengths.total_tokens / lengths.answers == pytest.approx(10)  # three answers of 10, not one of 30
    assert lengths.capped_answers == 0


async def test_the_cached_tokens_an_engine_reports_correct_the_prefix_index(engines, router):
    """vLLM's (and SGLang's) usage.prompt_tokens_details.cached_tokens: a replica that had none of a prefix
    the index believed it held has evicted it, and with it whatever the index last sent there before it."""
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    r.state.settings.prefix_feedback = True
    older, prompt = "an older prompt nobody asks again " * 8, PROMPT * 4  # 4 and 10 blocks of 64 characters
    for text in (older, prompt):
        r.state.ledger.close(r.state.route(MODEL, text, 8, now=r.clock()).ticket)
        r.clock.now += 1
    usage = {
        "prompt_tokens": 170,
        "completion_tokens": 1,
        "total_tokens": 171,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    request = completion(prompt=prompt, stream_options={"include_usage": True})
    async with r.forwarder.exchange(request) as exchange:
        assert exchange.route is not None and exchange.route.prefix_match_tokens >= 160  # predicted a hit
        engine.send(
            event("x"), b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n", END
        )
        async for _ in exchange.stream():
            pass
    assert r.state.prefix_corrections == 1
    # The older prompt went with the evicted prefix; the prompt just served is held again.
    assert r.state.route(MODEL, older, 8, now=r.clock()).prefix_match_tokens == 0
    assert r.state.route(MODEL, prompt, 8, now=r.clock()).prefix_match_tokens >= 160


async def test_a_batch_of_prompts_leaves_the_prefix_index_as_it_is_whatever_cached_count_comes_back(
    engines, router
):
    """The engines' cached tokens are the batch's first prompt's; the index holds the batch's joined text."""
    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    r.state.settings.prefix_feedback = True
    batch = [PROMPT * 4, "a second prompt of the batch " * 8]
    request = completion(prompt=batch, stream_options={"include_usage": True})
    usage = {"prompt_tokens": 200, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    for _ in range(2):  # the second time the index predicts a hit on the whole batch
        async with r.forwarder.exchange(request) as exchange:
            engine.send(
                event("x"), b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n", END
            )
            async for _ in exchange.stream():
                pass
    assert exchange.route.prefix_match_tokens > 0
    assert r.state.prefix_corrections == 0


# --- the HTTP front over an exchange ------------------------------------------------------------------------


async def test_a_client_that_hangs_up_mid_stream_on_the_http_front_is_recorded_quietly(
    engines, router, caplog
):
    """Through HttpFront: the router's write to the gone client fails; the exchange records it (499, ledger
    released) and the handler returns, so aiohttp logs no 'Error handling request' traceback per hang-up."""
    from tokenyard.router.http_front import HttpFront

    (engine,) = await engines(FakeEngine())
    r = router([Endpoint("e0", engine.url)])
    runner = web.AppRunner(HttpFront(r.state, r.forwarder).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "stream": True}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        engine.send(event("Once"))
        assert b"Once" in await asyncio.wait_for(reader.readuntil(b"Once"), 5)
        writer.close()
        await writer.wait_closed()

        async def stream_until_the_router_gives_up():  # the engine streams on until the router's write fails
            while r.state.ledger.open_tickets():
                engine.send(event(" more"))
                await asyncio.sleep(0.01)  # the engine's pace, not a wait for a condition

        await asyncio.wait_for(stream_until_the_router_gives_up(), 5)
        await asyncio.wait_for(engine.aborted.wait(), 5)
        assert r.answered("e0", 499) == (1, 1)
        r.assert_idle()
        assert not [
            rec for rec in caplog.records if rec.name == "aiohttp.server" and rec.levelname == "ERROR"
        ]
    finally:
        await runner.cleanup()
