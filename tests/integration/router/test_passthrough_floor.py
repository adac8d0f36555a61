"""bench/passthrough_proxy.py, the floor row of bench-router's overhead table: it must relay whole and streamed
answers unchanged and spread requests over its engines in turn, or its hop is not a floor of anything."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from .conftest import MODEL, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from passthrough_proxy import make_app  # noqa: E402

pytestmark = pytest.mark.integration


async def test_relays_whole_and_streamed_answers_in_turn(engines):
    fleet = await engines(2, time_scale=0.001)
    runner = web.AppRunner(make_app([engine.url for engine in fleet]))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            proxy = f"http://127.0.0.1:{port}/v1/completions"
            whole = {"model": MODEL, "prompt": "a whole answer", "max_tokens": 3}
            async with session.post(proxy, json=whole) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("application/json")
                answer = await response.json()
            assert answer["usage"]["completion_tokens"] == 3

            streamed = {"model": MODEL, "prompt": "a streamed answer", "max_tokens": 4, "stream": True}
            async with session.post(proxy, json=streamed) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                text = (await response.read()).decode()
            events = [line for line in text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert len(events) >= 5  # four tokens' events, then [DONE]

            async with session.post(proxy, json=whole) as response:  # the third: the first engine again
                assert response.status == 200
            unknown = {"model": "not-served-here", "prompt": "x", "max_tokens": 1}
            async with session.post(proxy, json=unknown) as response:
                assert response.status == 404  # the engine's own error, passed on
                assert "not-served-here" in (await response.json())["error"]["message"]
        # round robin: whole, streamed, whole admitted in turn (the refused fourth admits nothing)
        assert [engine._requests_seen for engine in fleet] == [2, 1]
    finally:
        await runner.cleanup()
