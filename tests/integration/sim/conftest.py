"""Engines started inside the test's event loop, on 127.0.0.1 and a free port."""

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenyard.sim.server import EngineOptions, SimEngine


@pytest.fixture
async def start_engine():
    started: list[SimEngine] = []

    async def start(**options) -> SimEngine:
        options.setdefault("host", "127.0.0.1")
        options.setdefault("port", 0)
        engine = SimEngine(EngineOptions(**options))
        await engine.start()
        started.append(engine)
        return engine

    yield start
    await asyncio.gather(*(e.stop(drain_timeout_s=0.5) for e in started))


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample on /metrics by name (labels dropped; one engine has one series per name but for labels)."""
    async with session.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "finished_reason" in sample.labels:
                key += "{" + sample.labels["finished_reason"] + "}"
            if "le" not in sample.labels:
                samples[key] = sample.value
    return samples


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0, every_s: float = 0.01
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")
