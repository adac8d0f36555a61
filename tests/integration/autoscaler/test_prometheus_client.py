"""The Prometheus client over real sockets: a fake Prometheus API for failure modes, and Debian's real
Prometheus scraping a small exporter of vLLM-named metrics, stopped mid-test."""

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from tokenyard.autoscaler.policy import SignalKind
from tokenyard.autoscaler.prometheus import signal_query
from tokenyard.core.process import stop_process
from tokenyard.core.prometheus import PrometheusClient
from tokenyard.devcluster import prometheus

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a fake of the API, for the failure modes a real Prometheus rarely shows on demand -------------------
@pytest.fixture
async def fake_prometheus():
    behaviour = {"mode": "ok"}

    async def query(request: web.Request) -> web.Response:
        mode = behaviour["mode"]
        if mode == "slow":
            await asyncio.sleep(2)
        if mode == "500":
            return web.Response(status=500, text="internal error")
        if mode == "error":
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400
            )
        if mode == "empty":
            return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})
        value = {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [time.time(), "42"]}]},
        }
        return web.json_response(value)

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", behaviour
    await runner.cleanup()


async def test_every_failure_is_no_data_with_its_reason(fake_prometheus):
    url, behaviour = fake_prometheus
    prom = PrometheusClient(url, timeout_s=0.5)
    try:
        assert (await prom.query("up")).value == 42.0
        expectations = {"slow": "timed out", "500": "not JSON", "error": "bad_data", "empty": "empty result"}
        for mode, reason in expectations.items():
            behaviour["mode"] = mode
            reading = await prom.query("up")
            assert reading.value is None and reason in reading.problem, (mode, reading)
    finally:
        await prom.close()
    closed = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    try:
        reading = await closed.query("up")
        assert reading.value is None and "unreachable" in reading.problem
    finally:
        await closed.close()


# ---- the real Prometheus ---------------------------------------------------------------------------------------
async def serve_registry(registry: CollectorRegistry) -> tuple[web.AppRunner, int]:
    """An exporter of `registry` in the classic text format whatever the Accept header: Prometheus 2.42 asks for
    OpenMetrics first, and prometheus_client 0.26's OpenMetrics output rewrites the colons of vLLM's and SGLang's
    names to underscores."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


@pytest.fixture
async def vllm_exporter():
    """A tiny exporter with vLLM's metric names (see serve_registry for the format)."""
    registry = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", ["model_name"], registry=registry)
    prompt = Histogram(
        "vllm:request_prompt_tokens", "prompt", ["model_name"], registry=registry, buckets=(100, 1000, 10000)
    )
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "ttft",
        ["model_name"],
        registry=registry,
        buckets=(0.1, 0.5, 1.0, 2.5),
    )

    runner, port = await serve_registry(registry)
    yield port, waiting.labels("llama"), kv.labels("llama"), prompt.labels("llama"), ttft.labels("llama")
    await runner.cleanup()


def start_prometheus(tmp_path, targets: list[tuple[list[int], str]]) -> tuple[subprocess.Popen, int]:
    """A real Prometheus scraping each group of loopback ports every second, labelled as the engine pods of
    the ModelDeployment named beside them (namespace team-a)."""
    port = free_port()
    job = {
        "job_name": "engines",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{p}" for p in ports],
                "labels": {"namespace": "team-a", "model_deployment": deployment},
            }
            for ports, deployment in targets
        ],
    }
    process = prometheus.prometheus_process(Path(PROMETHEUS), tmp_path, [job], port).start()
    return process.proc, port


@pytest.fixture
def real_prometheus(tmp_path, vllm_exporter):
    if not shutil.which(PROMETHEUS):
        pytest.skip("Debian's prometheus package is not installed")
    process, port = start_prometheus(tmp_path, [([vllm_exporter[0]], "llama")])
    yield f"http://127.0.0.1:{port}", process, vllm_exporter
    stop_process(process, timeout=10)


async def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


async def test_default_queries_against_a_real_prometheus_then_it_stops(real_prometheus):
    url, process, (_, waiting, kv, prompt, ttft) = real_prometheus
    waiting.set(3)
    kv.set(0.5)
    for _ in range(10):
        prompt.observe(800)
        ttft.observe(0.3)
    prom = PrometheusClient(url, timeout_s=2)
    try:
        waiting_q = signal_query(SignalKind.WAITING_REQUESTS, "team-a", "llama")
        kv_q = signal_query(SignalKind.KV_CACHE_USAGE, "team-a", "llama")

        async def scraped():
            r = await prom.query(waiting_q)
            return r if r.ok else None

        reading = await wait_for(scraped, 30, "Prometheus to scrape the exporter")
        assert reading.value == 3.0
        assert (await prom.query(kv_q)).value == 0.5
        # Another target's series do not exist: no data, not zero.
        other = await prom.query(signal_query(SignalKind.WAITING_REQUESTS, "team-a", "other"))
        assert other.value is None and "empty result" in other.problem
        # The TTFT and queued-token defaults are valid PromQL and give numbers once rates exist.
        for _ in range(10):
            prompt.observe(800)
            ttft.observe(0.3)

        async def rated():
            t = await prom.query(signal_query(SignalKind.TTFT_P95, "team-a", "llama"))
            q = await prom.query(signal_query(SignalKind.QUEUED_TOKENS, "team-a", "llama"))
            assert "bad_data" not in t.problem + q.problem, (t, q)
            return (t, q) if t.ok and q.ok else None

        t, q = await wait_for(rated, 30, "rates over the scraped histograms")
        assert 0 <= t.value <= 2.5 and q.value >= 0
        # A range query (the rollout analysis' counts per interval): points step apart, oldest first.
        now = time.time()
        ranged = await prom.query_range(waiting_q, now - 4, now, 1)
        assert ranged.ok, ranged.problem
        (series,) = ranged.series
        times = [at for at, _ in series.points]
        assert times == sorted(times) and all(b - a == 1 for a, b in zip(times, times[1:], strict=False))
        assert {value for _, value in series.points} == {3.0}

        process.terminate()  # Prometheus stops mid-test: unreachable is no data, never zero
        process.wait(timeout=10)
        gone = await prom.query(waiting_q)
        assert gone.value is None and "unreachable" in gone.problem
        gone_range = await prom.query_range(waiting_q, now - 4, now, 1)
        assert not gone_range.ok and "unreachable" in gone_range.problem
    finally:
        await prom.close()


# ---- SGLang-named series, and a target running both engines, through the real Prometheus ---------------------
@pytest.fixture
async def sglang_exporter():
    """SGLang's scheduler and tokenizer metrics as SGLang names and labels them (python/sglang/srt/metrics/
    collector.py): two TP ranks reporting the same scheduler state (--enable-metrics-for-all-schedulers) and,
    with priority scheduling, a priority="" total beside per-priority breakdowns."""
    registry = CollectorRegistry()
    scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "priority"]
    queue = Gauge(
        "sglang:num_queue_reqs", "The number of requests in the waiting queue.", scheduler, registry=registry
    )
    usage = Gauge("sglang:token_usage", "The token usage.", scheduler, registry=registry)
    for rank in ("0", "1"):
        queue.labels("m", "unified", rank, "0", rank, "").set(5)
        queue.labels("m", "unified", rank, "0", rank, "0").set(3)
        queue.labels("m", "unified", rank, "0", rank, "10").set(2)
        usage.labels("m", "unified", rank, "0", rank, "").set(0.25)
    prompt = Counter(
        "sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name"], registry=registry
    )
    requests = Counter(
        "sglang:num_requests", "Number of requests processed.", ["model_name"], registry=registry
    )
    ttft = Histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        ["model_name"],
        registry=registry,
        buckets=(0.1, 0.2, 0.4, 0.6, 0.8, 1.0),
    )
    # SGLang creates these series at the first finished request
    prompt.labels("m").inc(0)
    requests.labels("m").inc(0)
    runner, port = await serve_registry(registry)
    yield port, prompt.labels("m"), requests.labels("m"), ttft.labels("m")
    await runner.cleanup()


async def test_default_queries_read_sglang_and_mixed_targets_from_a_real_prometheus(
    tmp_path, vllm_exporter, sglang_exporter
):
    if not shutil.which(PROMETHEUS):
        pytest.skip("Debian's prometheus package is not installed")
    vllm_port, waiting, kv, _, _ = vllm_exporter
    sglang_port, prompt, requests, ttft = sglang_exporter
    waiting.set(3)
    kv.set(0.75)
    # "mix" is an engine-changing rollout: a vLLM pod and an SGLang pod behind one target.
    process, port = start_prometheus(tmp_path, [([sglang_port], "sg"), ([vllm_port, sglang_port], "mix")])
    prom = PrometheusClient(f"http://127.0.0.1:{port}", timeout_s=2)
    try:

        def reading(kind: SignalKind, target: str):
            async def read():
                r = await prom.query(signal_query(kind, "team-a", target))
                assert "bad_data" not in r.problem, r
                return r if r.ok else None

            return read

        # the priority="" total once: not per TP rank (x2), not plus its breakdown (3 + 2)
        sg_waiting = await wait_for(
            reading(SignalKind.WAITING_REQUESTS, "sg"), 30, "Prometheus to scrape SGLang"
        )
        assert sg_waiting.value == 5.0
        assert (await prom.query(signal_query(SignalKind.KV_CACHE_USAGE, "team-a", "sg"))).value == 0.25

        async def both_scraped():
            r = await prom.query(signal_query(SignalKind.WAITING_REQUESTS, "team-a", "mix"))
            return r if r.ok and r.value == 8.0 else None

        await wait_for(both_scraped, 30, "both engines of the mixed target")  # 3 (vLLM) + 5 (SGLang)
        mix_kv = await prom.query(signal_query(SignalKind.KV_CACHE_USAGE, "team-a", "mix"))
        assert mix_kv.value == pytest.approx(0.5)  # (0.75 + 0.25) / 2 pods
        none = await prom.query(signal_query(SignalKind.WAITING_REQUESTS, "team-a", "nobody"))
        assert none.value is None and "empty result" in none.problem

        # ten requests of 800 prompt tokens finish: queued tokens = 5 waiting x 800; TTFT from SGLang's buckets
        prompt.inc(8000)
        requests.inc(10)
        for _ in range(10):
            ttft.observe(0.3)

        async def rated():
            q = await prom.query(signal_query(SignalKind.QUEUED_TOKENS, "team-a", "sg"))
            t = await prom.query(signal_query(SignalKind.TTFT_P95, "team-a", "sg"))
            assert "bad_data" not in q.problem + t.problem, (q, t)
            return (q, t) if q.ok and t.ok and q.value > 0 and t.value > 0 else None

        queued, p95 = await wait_for(rated, 30, "rates over SGLang's counters and histogram")
        assert queued.value == pytest.approx(5 * 800)
        assert 0.2 < p95.value <= 0.4
    finally:
        await prom.close()
        stop_process(process, timeout=10)
