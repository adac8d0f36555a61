"""The engine leader's preStop hook as the pod runs it (the source the operator embeds, in its own python
process) against an engine on a socket, with a stream in flight: SIGTERM is let through when the stream ends,
not after the whole drain. Its decisions on a fake clock: tests/unit/operator/test_drain_wait.py."""

import asyncio
import sys
import time
from urllib.parse import urlsplit

import pytest
from tokenyard.core.engines import EngineKind
from tokenyard.operator import drain_wait
from tokenyard.operator.manifests import pre_stop

from .conftest import eventually, scrape

pytestmark = pytest.mark.integration

DRAIN_S = 60


@pytest.mark.parametrize(
    ("personality", "kind", "running"),
    [
        ("vllm", EngineKind.VLLM, "vllm:num_requests_running"),
        ("sglang", EngineKind.SGLANG, "sglang:num_running_reqs"),
    ],
)
async def test_the_hook_returns_when_the_last_stream_ends(start_engine, http, personality, kind, running):
    engine = await start_engine(time_scale=1.0, personality=personality)
    body = {"prompt": "a long answer", "max_tokens": 1200, "ignore_eos": True, "stream": True}
    # 1200 tokens take about 8 s on the simulated engine: longer than the hook's settle, far shorter than the drain.

    async def stream() -> float:
        async with http.post(engine.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            async for _ in response.content:
                pass
        return time.monotonic()

    streaming = asyncio.create_task(stream())
    await eventually(lambda: _running(http, engine.url, running))
    command = pre_stop(kind, urlsplit(engine.url).port, DRAIN_S, leader=True)["exec"]["command"]
    started = time.monotonic()
    hook = await asyncio.create_subprocess_exec(sys.executable, *command[1:], stderr=asyncio.subprocess.PIPE)
    _, said = await asyncio.wait_for(hook.communicate(), timeout=DRAIN_S)
    returned = time.monotonic()
    stream_ended = await streaming
    assert hook.returncode == 0 and said.decode().strip() == "drain_wait: idle"
    assert stream_ended - started > drain_wait.SETTLE_S  # the hook had a stream to wait on after its settle
    # It let SIGTERM through only after the stream ended, and within two polls and a fetch of that.
    assert stream_ended <= returned < stream_ended + 2 * drain_wait.POLL_S + drain_wait.FETCH_TIMEOUT_S


async def _running(http, url: str, name: str) -> bool:
    return (await scrape(http, url)).get(name, 0.0) >= 1.0
