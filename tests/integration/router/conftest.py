"""Fixtures for the router's integration tests: simulated engines in the test's event loop, routers in
process or as subprocesses, and a real redis-server on a free port. Everything binds to 127.0.0.1 and is
stopped by the test that started it (subprocesses by pid)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from tokenyard.router.discovery import Endpoint, StaticConfig
from tokenyard.router.server import RouterServer, ServerOptions
from tokenyard.router.state import RouterSettings
from tokenyard.sim.server import EngineOptions, FaultKnobs, SimEngine

MODEL = "test-model"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_for(
    condition: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.02)


async def start_engine(time_scale: float = 0.05, port: int = 0, **knobs) -> SimEngine:
    engine = SimEngine(
        EngineOptions(
            port=port,
            time_scale=time_scale,
            served_model_name=MODEL,
            knobs=FaultKnobs(**knobs),
            report_cached_tokens=True,  # as vLLM with --enable-prompt-tokens-details (the router passes it on)
        )
    )
    await engine.start()
    return engine


@pytest.fixture
async def engines():
    started: list[SimEngine] = []

    async def make(count: int = 2, **kwargs) -> list[SimEngine]:
        new = [await start_engine(**kwargs) for _ in range(count)]
        started.extend(new)
        return new

    yield make
    for engine in started:
        with contextlib.suppress(Exception):
            await engine.stop(drain_timeout_s=0.5)


@pytest.fixture
async def router():
    started: list[RouterServer] = []

    async def make(backends: list[Endpoint], **options) -> RouterServer:
        settings = options.pop("settings", RouterSettings())
        probe_interval_s = options.pop("probe_interval_s", 0.1)
        static = StaticConfig(
            backends=backends,
            traffic=options.pop("traffic", ()),
            shadow=options.pop("shadow", None),
            weights=options.pop("weights", None),
        )
        server = RouterServer(
            ServerOptions(
                port=0,
                grpc_port=0,
                metrics_port=0,
                static=static,
                settings=settings,
                probe_interval_s=probe_interval_s,
                **options,
            )
        )
        await server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


def backends_of(engines: list[SimEngine], revisions: list[str] | None = None) -> list[Endpoint]:
    revisions = revisions or [""] * len(engines)
    return [
        Endpoint(f"e{i}", engine.url, rev)
        for i, (engine, rev) in enumerate(zip(engines, revisions, strict=True))
    ]


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


class RedisProcess:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "/usr/bin/redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on 127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None


@pytest.fixture
def redis_server():
    if not os.path.exists("/usr/bin/redis-server"):
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisProcess(free_port())
    server.start()
    yield server
    server.stop()


class RouterProcess:
    """``python -m tokenyard.router`` as a subprocess (stopped by pid)."""

    def __init__(self, args: list[str]) -> None:
        self.port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, session: aiohttp.ClientSession) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-m",
            "tokenyard.router",
            "--port",
            str(self.port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            "--log-level",
            "WARNING",
            *self.args,
            cwd=REPO,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )

        async def healthy() -> bool:
            if self.proc.returncode is not None:
                err = await self.proc.stderr.read()
                raise AssertionError(f"router exited with {self.proc.returncode}: {err.decode()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(self.url + "/health") as response:
                    return response.status == 200
            return False

        await wait_for(healthy, 30, "router subprocess to answer /health")

    async def metric(self, session: aiohttp.ClientSession, name: str, **labels: str) -> float | None:
        async with session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as response:
            text = await response.text()
        return parse_metric(text, name, **labels)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def parse_metric(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    total = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + sample.value
    return total


@pytest.fixture
async def router_processes():
    started: list[RouterProcess] = []

    async def make(args: list[str], session: aiohttp.ClientSession) -> RouterProcess:
        process = RouterProcess(args)
        started.append(process)
        await process.start(session)
        return process

    yield make
    for process in started:
        await process.stop()


# What vLLM before v0.5.0 answered a request with a member it did not know (pydantic, extra="forbid"), as reported
# in modelscope/ms-agent#489 against stream_options.
OLD_VLLM_REFUSAL = {
    "object": "error",
    "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not "
    "permitted', 'input': {'include_usage': True}}]",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


@pytest.fixture
async def old_engine():
    """An engine older than stream_options (no such engine runs here): it refuses the member with vLLM v0.4's
    error, and otherwise streams two tokens. Counts the requests it got, by whether they had the member."""
    got = {"invalid": 0, "with": 0, "without": 0}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("max_tokens", 16) < 1:
            got["invalid"] += 1
            error = {"object": "error", "message": "max_tokens must be at least 1, got -1.", "code": 400}
            return web.json_response(error, status=400)
        if "stream_options" in body:
            got["with"] += 1
            return web.json_response(OLD_VLLM_REFUSAL, status=400)
        got["without"] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for text in ("Hello", " there"):
            chunk = {
                "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": None}],
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def empty(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", empty)
    app.router.add_get("/metrics", empty)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", got
    await runner.cleanup()
