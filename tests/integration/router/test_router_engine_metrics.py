"""Liveness is not metrics (issue 13), over real sockets: the router in front of simulated engines of both
personalities that gzip their /metrics, and one engine whose /metrics turns to garbage while it serves
normally. Every client request must succeed, the broken engine must keep its share, only its failure counter
may move, and the router must say so once. A dead engine is still avoided."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import pytest
from tokenyard.router.discovery import Endpoint
from tokenyard.sim.server import EngineOptions, SimEngine

from .conftest import MODEL, parse_metric, wait_for

pytestmark = pytest.mark.integration

REQUESTS = 48  # 12 waves of 4 concurrent requests over 4 replicas


@pytest.fixture
async def fleet():
    """e0, e1: vLLM personality; e2: SGLang personality; e3: vLLM whose /metrics is made garbage."""
    started: list[SimEngine] = []
    for personality in ("vllm", "vllm", "sglang", "vllm"):
        engine = SimEngine(
            EngineOptions(port=0, time_scale=0.05, served_model_name=MODEL, personality=personality)
        )
        await engine.start()
        started.append(engine)
    yield started
    for engine in started:
        with contextlib.suppress(Exception):
            await engine.stop(drain_timeout_s=0.5)


def url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.ports['http']}{path}"


async def metrics_text(http, server) -> str:
    async with http.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as response:
        return await response.text()


async def complete(http, server, prompt: str) -> tuple[int, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    async with http.post(url(server, "/v1/completions"), json=body) as response:
        await response.read()
        return response.status, response.headers.get("x-tokenyard-replica", "")


async def set_metrics_fault(http, engine: SimEngine, fault: str) -> None:
    async with http.post(engine.url + "/sim/config", json={"metrics_fault": fault}) as response:
        assert response.status == 200, await response.text()


async def test_garbage_metrics_on_one_engine_cost_no_request_and_no_traffic(fleet, router, http, caplog):
    caplog.set_level(logging.INFO, logger="tokenyard.router")
    broken = fleet[3]
    await set_metrics_fault(http, broken, "garbage")  # it still serves generation normally
    async with http.get(broken.url + "/health") as response:
        assert response.status == 200
    server = await router([Endpoint(f"e{i}", engine.url) for i, engine in enumerate(fleet)])
    state = server.state

    async def failures(replica: str) -> float:
        text = await metrics_text(http, server)
        return parse_metric(text, "tokenyard_router_metrics_scrape_failures_total", replica=replica) or 0.0

    async def broken_failed_thrice() -> bool:
        return await failures("e3") >= 3

    await wait_for(broken_failed_thrice, 20, "three failed scrapes of e3")
    # the healthy engines' gzip-compressed /metrics were read, in both engines' names
    await wait_for(lambda: all(f"e{i}" in state.stats for i in range(3)), 10, "stats of e0..e2")
    assert [state.stats[f"e{i}"].engine for i in range(3)] == ["vllm", "vllm", "sglang"]
    assert state.stats["e2"].kv_capacity_tokens and state.stats["e0"].block_size == 16
    assert "e3" not in state.stats  # never readable: its signals are unknown, not zero
    assert "e3" not in state.unreachable

    statuses: list[int] = []
    served: Counter[str] = Counter()
    for wave in range(REQUESTS // 4):
        answers = await asyncio.gather(
            *(complete(http, server, f"wave {wave} request {i}") for i in range(4))
        )
        for status, replica in answers:
            statuses.append(status)
            served[replica] += 1
    assert statuses == [200] * REQUESTS, Counter(statuses)
    even_share = REQUESTS / len(fleet)
    assert served["e3"] >= even_share / 2, served

    text = await metrics_text(http, server)
    counted = {
        replica: parse_metric(text, "tokenyard_router_metrics_scrape_failures_total", replica=replica)
        for replica in ("e0", "e1", "e2", "e3")
    }
    assert counted["e3"] >= 3 and all(counted[r] is None for r in ("e0", "e1", "e2")), counted
    # the router asks for gzip; the sim's garbage is then a corrupt gzip stream
    assert parse_metric(text, "tokenyard_router_metrics_scrape_failures_total", replica="e3", reason="decode")
    assert parse_metric(text, "tokenyard_router_replica_healthy", replica="e3") == 1
    assert parse_metric(text, "tokenyard_router_replica_metrics_stale", replica="e3") == 1
    warned = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "e3" in r.getMessage() and "/metrics" in r.getMessage()
    ]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "decode" in warned[0].getMessage()

    # the fault goes away: the next scrape reads it again and the router says so
    await set_metrics_fault(http, broken, "none")
    await wait_for(lambda: "e3" in state.stats, 10, "e3's stats after the fault cleared")
    assert state.stats["e3"].engine == "vllm"
    assert any("e3" in r.getMessage() and "readable again" in r.getMessage() for r in caplog.records)


async def test_a_dead_engine_is_still_avoided(fleet, router, http):
    server = await router([Endpoint(f"e{i}", engine.url) for i, engine in enumerate(fleet)])
    await fleet[1].stop(drain_timeout_s=0)  # connections to e1 are refused from now on
    await wait_for(lambda: "e1" in server.state.unreachable, 10, "the health probe to mark e1 unreachable")
    answers = await asyncio.gather(*(complete(http, server, f"after e1 died {i}") for i in range(12)))
    assert all(status == 200 for status, _ in answers), answers
    assert "e1" not in {replica for _, replica in answers}

    async def exported_unhealthy() -> bool:  # the gauges are exported once per probe round
        text = await metrics_text(http, server)
        return parse_metric(text, "tokenyard_router_replica_healthy", replica="e1") == 0

    await wait_for(exported_unhealthy, 10, "replica_healthy{replica=e1} to read 0")
    text = await metrics_text(http, server)
    assert parse_metric(
        text, "tokenyard_router_health_check_failures_total", replica="e1", reason="connection"
    )
