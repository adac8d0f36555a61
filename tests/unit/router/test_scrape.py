from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.scrape import EngineProber
from tokenyard.router.state import RouterState, RoutingError
from tokenyard.router.telemetry import RouterMetrics


async def run_until(prober: EngineProber, done: asyncio.Event) -> None:
    """Run the prober's loop until `done` is set (at most 5 s), then stop it."""
    task = asyncio.create_task(prober.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_probes_are_spread_over_the_interval_and_skip_replicas_that_left():
    state = RouterState()
    endpoints = tuple(Endpoint(name, f"http://{name}") for name in "abcd")
    state.set_models({"m": ModelView("m", endpoints)})
    interval = 0.2
    prober = EngineProber(state, RouterMetrics(), session=None, interval_s=interval)
    loop = asyncio.get_running_loop()
    probed: list[tuple[str, float]] = []
    round_done = asyncio.Event()

    async def fake_probe(endpoint: Endpoint) -> None:
        probed.append((endpoint.name, loop.time()))
        if endpoint.name == "a":  # "c" leaves discovery while the round is under way
            state.set_models({"m": ModelView("m", tuple(e for e in endpoints if e.name != "c"))})
        if endpoint.name == "d":
            round_done.set()

    prober.probe = fake_probe
    await run_until(prober, round_done)
    assert [name for name, _ in probed] == ["a", "b", "d"]
    times = [at for _, at in probed]
    # one probe per interval / 4, never a burst (asyncio sleeps never end early; c's slot was left empty)
    assert times[1] - times[0] >= 0.9 * interval / 4
    assert times[2] - times[1] >= 0.9 * 2 * interval / 4


async def test_a_replica_that_hangs_does_not_hold_back_the_others_probes():
    state = RouterState()
    endpoints = tuple(Endpoint(name, f"http://{name}") for name in "abc")
    state.set_models({"m": ModelView("m", endpoints)})
    prober = EngineProber(state, RouterMetrics(), session=None, interval_s=0.15)
    probed: list[str] = []
    hang = asyncio.Event()  # never set: "a" answers nothing until the test ends
    two_rounds = asyncio.Event()

    async def fake_probe(endpoint: Endpoint) -> None:
        probed.append(endpoint.name)
        if endpoint.name == "a":
            await hang.wait()
        if probed.count("c") == 2:
            two_rounds.set()

    prober.probe = fake_probe
    await run_until(prober, two_rounds)
    # b and c were probed every round while a's first probe still hung; a was not probed twice at once.
    assert probed.count("b") == 2 and probed.count("c") == 2
    assert probed.count("a") == 1


# --- liveness and metrics over loopback sockets, against a tiny fake engine ---------------------------------

VLLM_BODY = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 3.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    'vllm:cache_config_info{block_size="32",num_gpu_blocks="100"} 1.0\n'
)


class FakeEngine:
    """/health and /metrics with switchable behaviour; /metrics gzips when the request accepts gzip."""

    def __init__(self) -> None:
        self.health_status = 200
        self.health_delay_s = 0.0
        self.metrics_mode = "ok"  # ok, garbage, binary, error, slow
        self.accept_encodings: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.release = asyncio.Event()  # set at stop: slow handlers end instead of holding the teardown

    async def stall(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), seconds)

    async def health(self, request: web.Request) -> web.Response:
        if self.health_delay_s:
            await self.stall(self.health_delay_s)
        return web.Response(status=self.health_status, text="")

    async def metrics(self, request: web.Request) -> web.Response:
        self.accept_encodings.append(request.headers.get("Accept-Encoding", ""))
        if self.metrics_mode == "error":
            return web.Response(status=500, text="internal error")
        if self.metrics_mode == "slow":
            await self.stall(1)
        if self.metrics_mode == "garbage":
            return web.Response(text="<html>this is not metrics</html>")
        if self.metrics_mode == "binary":
            return web.Response(body=bytes(range(128, 256)))
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=gzip.compress(VLLM_BODY.encode()), headers={"Content-Encoding": "gzip"})
        return web.Response(text=VLLM_BODY)

    async def start(self) -> FakeEngine:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        self.release.set()
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def engine():
    fake = await FakeEngine().start()
    yield fake
    await fake.stop()


@pytest.fixture
async def session():
    # like the router's own session: no automatic decompression (it relays engine bodies as they are)
    async with aiohttp.ClientSession(auto_decompress=False) as client:
        yield client


def prober_for(url: str, session, **options) -> tuple[EngineProber, RouterState, RouterMetrics, Endpoint]:
    state = RouterState()
    endpoint = Endpoint("e0", url)
    state.set_models({"m": ModelView("m", (endpoint,))})
    metrics = RouterMetrics()
    return EngineProber(state, metrics, session, timeout_s=0.5, **options), state, metrics, endpoint


def count(metrics: RouterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_gzip_metrics_are_read_and_the_engine_was_asked_for_gzip(engine, session):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    await prober.probe(endpoint)
    assert "gzip" in engine.accept_encodings[-1]
    stats = state.stats["e0"]
    assert (stats.waiting, stats.kv_usage, stats.block_size, stats.kv_capacity_tokens) == (3.0, 0.5, 32, 3200)
    assert state.kv_capacity_tokens["e0"] == 3200


async def test_unreadable_metrics_never_stop_traffic_and_warn_once_per_streak(engine, session, caplog):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    await prober.probe(endpoint)  # a good scrape first: geometry known
    caplog.set_level(logging.DEBUG, logger="tokenyard.router")
    for mode, reason in (("garbage", "parse"), ("binary", "decode"), ("error", "http_status")):
        engine.metrics_mode = mode
        caplog.clear()
        for _ in range(3):
            await prober.probe(endpoint)
        assert (
            count(metrics, "tokenyard_router_metrics_scrape_failures_total", replica="e0", reason=reason) == 3
        )
        assert "e0" not in state.unreachable  # /health answers: it stays routable
        assert state.route("m", "hello", 8, now=time.monotonic()).endpoint.name == "e0"
        snap = state.snapshot(endpoint, now=time.monotonic())
        assert snap.kv_usage is None and snap.queue_waiting is None and snap.block_size == 32
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        if mode == "garbage":  # the streak began here: one warning naming the reason
            assert len(warnings) == 1 and "parse" in warnings[0].getMessage()
        else:  # same streak, other reasons: counted, not warned again
            assert warnings == []
    caplog.clear()
    engine.metrics_mode = "ok"
    await prober.probe(endpoint)
    assert state.snapshot(endpoint, now=time.monotonic()).kv_usage == 0.5
    recovered = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("readable again after 9 failed" in m for m in recovered)
    engine.metrics_mode = "garbage"  # a new streak warns again
    caplog.clear()
    await prober.probe(endpoint)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_a_metrics_timeout_is_counted_as_such(engine, session):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    prober.timeout = aiohttp.ClientTimeout(total=0.1)
    engine.metrics_mode = "slow"
    await prober.probe(endpoint)
    assert (
        count(metrics, "tokenyard_router_metrics_scrape_failures_total", replica="e0", reason="timeout") == 1
    )
    assert "e0" not in state.unreachable


async def test_a_non_200_health_answer_makes_the_replica_unreachable_at_once(engine, session, caplog):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    engine.health_status = 503  # e.g. still loading weights, or its engine core died
    await prober.probe(endpoint)
    assert "e0" in state.unreachable
    assert (
        count(metrics, "tokenyard_router_health_check_failures_total", replica="e0", reason="http_status")
        == 1
    )
    with pytest.raises(RoutingError) as refused:
        state.route("m", "hello", 8, now=time.monotonic())
    assert refused.value.status == 503
    caplog.set_level(logging.INFO, logger="tokenyard.router")
    engine.health_status = 200
    await prober.probe(endpoint)
    assert "e0" not in state.unreachable
    assert any("live again" in r.getMessage() for r in caplog.records)


async def test_a_dead_engine_is_unreachable_at_the_first_probe(session):
    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    prober, state, metrics, endpoint = prober_for(f"http://127.0.0.1:{port}", session)
    await prober.probe_all()
    assert "e0" in state.unreachable
    assert (
        count(metrics, "tokenyard_router_health_check_failures_total", replica="e0", reason="connection") == 1
    )
    assert (
        count(metrics, "tokenyard_router_metrics_scrape_failures_total", replica="e0", reason="connection")
        == 1
    )
    assert (
        metrics.registry.get_sample_value(
            "tokenyard_router_replica_healthy", {"replica": "e0", "revision": ""}
        )
        == 0
    )


async def test_health_timeouts_need_two_in_a_row(engine, session):
    prober, state, metrics, endpoint = prober_for(engine.url, session, health_timeout_s=0.05)
    engine.health_delay_s = 0.5
    await prober.probe_health(endpoint)
    assert "e0" not in state.unreachable  # one late answer: a busy engine, not a dead one
    engine.health_delay_s = 0.0
    await prober.probe_health(endpoint)  # the streak is broken
    engine.health_delay_s = 0.5
    await prober.probe_health(endpoint)
    assert "e0" not in state.unreachable
    await prober.probe_health(endpoint)
    assert "e0" in state.unreachable
    assert count(metrics, "tokenyard_router_health_check_failures_total", replica="e0", reason="timeout") == 3


@pytest.mark.parametrize("status", [404, 401])
async def test_an_engine_without_a_usable_health_endpoint_is_live(engine, session, caplog, status):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    engine.health_status = status  # no /health at all, or one behind credentials the probe does not carry
    caplog.set_level(logging.WARNING, logger="tokenyard.router")
    for _ in range(2):
        await prober.probe(endpoint)
    assert "e0" not in state.unreachable
    assert len([r for r in caplog.records if "no health verdict" in r.getMessage()]) == 1
    engine.health_status = 500  # an answer that is a verdict: unhealthy
    await prober.probe(endpoint)
    assert "e0" in state.unreachable


async def test_only_the_served_models_series_are_read(engine, session):
    prober, state, metrics, endpoint = prober_for(engine.url, session)
    assert prober.served_models(endpoint) == {"m"}
    state.set_models({"m": ModelView("served-name", (endpoint,)), "other": ModelView("other", ())})
    assert prober.served_models(endpoint) == {"served-name"}
