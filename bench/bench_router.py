"""Router benchmark: tokenyard against round robin, least outstanding requests and sglang-router's cache_aware
policy, on the same simulated fleet and the same arrivals, in one run.

Fleet: ENGINES tokenyard.sim engines (Llama-3.1-8B on H100-SXM, time-scaled), all in one helper process (the sim
runs many engines on one event loop). Their KV cache is limited with --num-gpu-blocks-override so that one
engine holds only part of the tenants' system prompts while the fleet holds all of them: the regime where
where a request goes decides whether its prefix is cached (with the preset's full 28k blocks every engine would
hold every prompt of this small benchmark and locality would not matter).

Policies:
- tokenyard: `python -m tokenyard.router` (a separate process) with its default scorers;
- round_robin, least_outstanding: dispatched by the load generator itself straight to the engines (no proxy
  hop, exact in-flight counts): the ideal, zero-overhead form of those balancers;
- sglang_cache_aware: `python -m sglang_router.launch_router --policy cache_aware` (a separate process).

Workloads (Poisson arrivals, rates relative to a capacity measured at the start on one engine x ENGINES):
- shared_prefix_70 / _95: TENANTS tenants with Zipf popularity, each with a long system prompt, short unique
  suffixes; at 70% and 95% of capacity;
- no_sharing: unique prompts at 70%;
- multi_turn: chat conversations whose every turn extends the previous one (history + reply + new question).

Figures: client-side TTFT p50/p99, output tokens/s, prefix-cache hit rate from the engines' own counters
(vllm:prefix_cache_hits/queries), imbalance = max/mean of requests served per engine; then the router's
overhead (added latency p50/p99 against calling an engine directly, and the requests/s one router process
sustains with a closed loop of small requests). Prints a table and, last, one JSON line.

BENCH_QUICK=1: shorter runs (same comparison).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import aiohttp
from tokenyard.core.process import stop_process
from tokenyard.router.proxy import carries_token

QUICK = os.environ.get("BENCH_QUICK") == "1"
ENGINES = int(os.environ.get("BENCH_ENGINES", "8"))
TIME_SCALE = float(os.environ.get("BENCH_TIME_SCALE", "10.0"))  # served seconds per modelled second
KV_BLOCKS = int(os.environ.get("BENCH_KV_BLOCKS", "2048"))  # per engine (16 tokens each)
RUN_SECONDS = float(os.environ.get("BENCH_RUN_SECONDS", "15" if QUICK else "45"))
TENANTS = 48
SYSTEM_WORDS = 1500
SUFFIX_WORDS = 40
OUTPUT_TOKENS = 24
MODEL = "bench-model"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
# The sim's tokenizer is the "configured tokenizer" here (prompts are hashed by the engine's own tokens).
TOKENYARD_ARGS = os.environ.get("BENCH_TOKENYARD_ARGS", "--tokenizer sim").split()
# Subsets for quick experiments (the full comparison runs by default).
POLICIES = tuple(
    os.environ.get("BENCH_POLICIES", "tokenyard,round_robin,least_outstanding,sglang_cache_aware").split(",")
)
WORKLOADS = tuple(
    os.environ.get("BENCH_WORKLOADS", "shared_prefix_70,shared_prefix_95,no_sharing,multi_turn").split(",")
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the engine host (a child process) -------------------------------------------------------------------


async def host_engines(count: int, time_scale: float, blocks: int, port_file: str) -> None:
    from tokenyard.sim.server import EngineOptions, SimEngine

    engines = [
        SimEngine(
            EngineOptions(
                model="llama-3.1-8b",
                gpu="h100-sxm",
                port=0,
                time_scale=time_scale,
                served_model_name=MODEL,
                num_gpu_blocks_override=blocks,
            )
        )
        for _ in range(count)
    ]
    for engine in engines:
        await engine.start()
    with open(port_file + ".tmp", "w") as handle:
        json.dump([engine.url for engine in engines], handle)
    os.replace(port_file + ".tmp", port_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for engine in engines:
        await engine.stop(drain_timeout_s=0.5)


# --- workloads -----------------------------------------------------------------------------------------------

WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean desert "
    "city village market harbor bridge tower garden library museum station airport castle temple palace "
    "engine turbine circuit signal network server cluster router gateway buffer kernel thread process "
    "invoice ledger account balance payment refund policy contract clause tenant customer support ticket"
).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Request:
    path: str
    body: dict
    at: float  # seconds after the run's start


@dataclass
class Result:
    ttft: float | None
    latency: float
    output_tokens: int
    ok: bool
    text: str = ""


def zipf_weights(n: int, s: float = 0.8) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def poisson_times(rng: random.Random, rate: float, duration: float) -> list[float]:
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return times
        times.append(t)


def shared_prefix_requests(rate: float, duration: float, seed: int = 1) -> list[Request]:
    rng = random.Random(seed)
    prompts = [
        f"Tenant {i} instructions. " + words(random.Random(1000 + i), SYSTEM_WORDS) for i in range(TENANTS)
    ]
    weights = zipf_weights(TENANTS)
    return [
        Request(
            "/v1/completions",
            {
                "prompt": rng.choices(prompts, weights)[0] + "\nQuestion: " + words(rng, SUFFIX_WORDS),
                "max_tokens": OUTPUT_TOKENS,
            },
            t,
        )
        for t in poisson_times(rng, rate, duration)
    ]


def unique_requests(rate: float, duration: float, seed: int = 2) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(
            "/v1/completions",
            {"prompt": f"Request {k}. " + words(rng, SYSTEM_WORDS // 2), "max_tokens": OUTPUT_TOKENS},
            t,
        )
        for k, t in enumerate(poisson_times(rng, rate, duration))
    ]


# --- dispatch --------------------------------------------------------------------------------------------------


class Dispatcher:
    """Where the load generator sends a request: a router's URL, or an engine chosen client-side."""

    def __init__(self, policy: str, engines: list[str], router_url: str | None) -> None:
        self.policy = policy
        self.engines = engines
        self.router_url = router_url
        self._rr = itertools.cycle(range(len(engines)))
        self.in_flight = [0] * len(engines)
        self._rng = random.Random(5)

    def acquire(self) -> tuple[str, int | None]:
        if self.router_url:
            return self.router_url, None
        if self.policy == "round_robin":
            index = next(self._rr)
        else:
            least = min(self.in_flight)
            index = self._rng.choice([i for i, n in enumerate(self.in_flight) if n == least])
        self.in_flight[index] += 1
        return self.engines[index], index

    def release(self, index: int | None) -> None:
        if index is not None:
            self.in_flight[index] -= 1


async def send(
    session: aiohttp.ClientSession, dispatcher: Dispatcher, path: str, body: dict, keep_text: bool = False
) -> Result:
    base, index = dispatcher.acquire()
    payload = {
        "model": MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **body,
    }
    started = time.monotonic()
    ttft = None
    tokens = 0
    text_parts: list[str] = []
    try:
        async with session.post(base + path, json=payload) as response:
            if response.status != 200:
                await response.read()
                return Result(None, time.monotonic() - started, 0, False)
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                if ttft is None and carries_token(line):  # not the empty role-only delta of a chat stream
                    ttft = time.monotonic() - started
                if keep_text or b'"usage":{' in line:
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = event["usage"].get("completion_tokens", tokens)
                    if keep_text:
                        for choice in event.get("choices") or ():
                            text_parts.append(
                                (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                            )
        return Result(ttft, time.monotonic() - started, tokens, ttft is not None, "".join(text_parts))
    except (TimeoutError, aiohttp.ClientError):
        return Result(ttft, time.monotonic() - started, tokens, False)
    finally:
        dispatcher.release(index)


async def run_open_loop(session, dispatcher, requests: list[Request]) -> tuple[list[Result], float]:
    started = time.monotonic()

    async def one(request: Request) -> Result:
        delay = started + request.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return await send(session, dispatcher, request.path, request.body)

    results = await asyncio.gather(*(one(r) for r in requests))
    return list(results), time.monotonic() - started


async def run_multi_turn(
    session, dispatcher, rate: float, duration: float, seed: int = 3
) -> tuple[list[Result], float]:
    """Conversations start as a Poisson process; each runs TURNS turns, each turn sent after the previous
    reply plus a short think time, its messages the whole history so far."""
    rng = random.Random(seed)
    turns = 5
    system = "You are the support assistant of a large bank. " + words(random.Random(77), 300)
    starts = poisson_times(rng, rate / turns, duration)
    results: list[Result] = []
    t0 = time.monotonic()

    async def conversation(k: int, at: float) -> None:
        crng = random.Random(seed * 1000 + k)
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        messages = [{"role": "system", "content": system}]
        for _turn in range(turns):
            messages.append({"role": "user", "content": words(crng, 150)})
            result = await send(
                session,
                dispatcher,
                "/v1/chat/completions",
                {"messages": list(messages), "max_tokens": OUTPUT_TOKENS},
                keep_text=True,
            )
            results.append(result)
            if not result.ok:
                return
            messages.append({"role": "assistant", "content": result.text})
            await asyncio.sleep(crng.expovariate(1 / 0.3))

    await asyncio.gather(*(conversation(k, at) for k, at in enumerate(starts)))
    return results, time.monotonic() - t0


# --- engine counters -----------------------------------------------------------------------------------------


async def engine_counters(session, engines: list[str]) -> list[dict[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total"}

    async def one(url: str) -> dict[str, float]:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
        return values

    return list(await asyncio.gather(*(one(u) for u in engines)))


async def flush_caches(session, engines: list[str]) -> None:
    for url in engines:
        async with session.post(url + "/flush_cache") as response:
            await response.read()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[k]


def summarise(results: list[Result], elapsed: float, before, after) -> dict[str, float]:
    ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
    hits = sum(
        a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        for a, b in zip(after, before, strict=True)
    )
    queries = sum(
        a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        for a, b in zip(after, before, strict=True)
    )
    served = [
        a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0)
        for a, b in zip(after, before, strict=True)
    ]
    mean = sum(served) / len(served) if served else 0
    return {
        "ttft_p50_s": round(percentile(ttfts, 0.5), 4),
        "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
        "output_tok_s": round(sum(r.output_tokens for r in results if r.ok) / elapsed, 1),
        "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "imbalance": round(max(served) / mean, 3) if mean else 0.0,
        "requests": len(results),
        "errors": sum(not r.ok for r in results),
    }


# --- routers as processes --------------------------------------------------------------------------------------


class RouterProcess:
    def __init__(self, policy: str, engines: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if policy == "tokenyard":
            args = [
                PY,
                "-m",
                "tokenyard.router",
                "--port",
                str(self.port),
                "--grpc-port",
                "-1",
                "--metrics-port",
                str(free_port()),
                "--served-model",
                MODEL,
                "--log-level",
                "WARNING",
                "--default-max-tokens",
                str(OUTPUT_TOKENS),
                *TOKENYARD_ARGS,
            ]
            for i, url in enumerate(engines):
                args += ["--backend", f"e{i}={url}"]
        else:
            args = [
                PY,
                "-m",
                "sglang_router.launch_router",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--policy",
                "cache_aware",
                "--worker-urls",
                *engines,
                "--log-level",
                "warn",
                "--prometheus-port",
                str(free_port()),
                "--prometheus-host",
                "127.0.0.1",
            ]
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def ready(self, session: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"router exited {self.proc.returncode}: {self.proc.stderr.read().decode()[-2000:]}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                payload = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
                async with session.post(self.url + "/v1/completions", json=payload) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"router on {self.url} not ready after {timeout}s")

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)


# --- the benchmark -------------------------------------------------------------------------------------------


async def calibrate(session, engines: list[str]) -> float:
    """Requests/s one engine sustains on the shared-prefix workload (closed loop), times the fleet size."""
    dispatcher = Dispatcher("direct", engines[:1], None)
    requests = shared_prefix_requests(100, 20, seed=99)  # ~2000 prompts, reused in a cycle
    concurrency, stop_at, done = 24, time.monotonic() + (6 if QUICK else 10), 0
    feed = itertools.cycle(requests)
    await flush_caches(session, engines[:1])

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            request = next(feed)
            result = await send(session, dispatcher, request.path, request.body)
            done += result.ok

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.monotonic() - started) * len(engines)


async def run_policy(session, engines, policy: str, workload: str, rate: float) -> dict[str, float]:
    await flush_caches(session, engines)
    router = RouterProcess(policy, engines) if policy in ("tokenyard", "sglang_cache_aware") else None
    try:
        if router:
            await router.ready(session)
        dispatcher = Dispatcher(policy, engines, router.url if router else None)
        await flush_caches(session, engines)  # the warm-up request must not leave a cached prefix
        before = await engine_counters(session, engines)
        if workload == "multi_turn":
            results, elapsed = await run_multi_turn(session, dispatcher, rate, RUN_SECONDS)
        elif workload == "no_sharing":
            results, elapsed = await run_open_loop(session, dispatcher, unique_requests(rate, RUN_SECONDS))
        else:
            results, elapsed = await run_open_loop(
                session, dispatcher, shared_prefix_requests(rate, RUN_SECONDS)
            )
        after = await engine_counters(session, engines)
        return summarise(results, elapsed, before, after)
    finally:
        if router:
            router.stop()


async def overhead(session, engines) -> dict[str, float]:
    """Added latency of one router hop (sequential small requests, direct vs through the router) and the
    requests/s one router process sustains (closed loop, 64 clients, tiny requests)."""
    router = RouterProcess("tokenyard", engines)
    try:
        await router.ready(session)
        body = {"model": MODEL, "prompt": "ping", "max_tokens": 1}

        async def timed(url: str) -> float:
            started = time.monotonic()
            async with session.post(url + "/v1/completions", json=body) as response:
                await response.read()
                assert response.status == 200, response.status
            return time.monotonic() - started

        samples = 100 if QUICK else 300
        direct, routed = [], []
        for i in range(samples):  # interleaved so both see the same machine load
            direct.append(await timed(engines[i % len(engines)]))
            routed.append(await timed(router.url))
        stop_at = time.monotonic() + (4 if QUICK else 8)
        done = 0

        async def client() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                await timed(router.url)
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(64)))
        max_rps = done / (time.monotonic() - started)
        return {
            "added_p50_ms": round((percentile(routed, 0.5) - percentile(direct, 0.5)) * 1000, 3),
            "added_p99_ms": round((percentile(routed, 0.99) - percentile(direct, 0.99)) * 1000, 3),
            "max_rps": round(max_rps, 1),
        }
    finally:
        router.stop()


async def main() -> None:
    port_file = os.path.join(tempfile.mkdtemp(prefix="bench-router-"), "engines.json")
    host = subprocess.Popen(
        [
            PY,
            os.path.abspath(__file__),
            "--engine-host",
            "--count",
            str(ENGINES),
            "--time-scale",
            str(TIME_SCALE),
            "--blocks",
            str(KV_BLOCKS),
            "--port-file",
            port_file,
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if host.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the engine host did not start")
            await asyncio.sleep(0.1)
        with open(port_file) as handle:
            engines = json.load(handle)
        timeout = aiohttp.ClientTimeout(total=300)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            capacity = await calibrate(session, engines)
            print(
                f"fleet: {ENGINES} x llama-3.1-8b on h100-sxm, time scale {TIME_SCALE}, {KV_BLOCKS} KV blocks "
                f"each; shared-prefix capacity ~{capacity:.1f} req/s; {RUN_SECONDS:.0f}s per run",
                flush=True,
            )
            workloads = {
                "shared_prefix_70": 0.70 * capacity,
                "shared_prefix_95": 0.95 * capacity,
                "no_sharing": 0.70 * capacity,
                "multi_turn": 0.70 * capacity,
            }
            results: dict[str, dict[str, dict[str, float]]] = {}
            header = (
                f"{'workload':<18}{'policy':<20}{'rate/s':>7}{'ttft p50 s':>11}{'ttft p99 s':>11}"
                f"{'out tok/s':>10}{'hit rate':>9}{'imbal':>7}{'errors':>7}"
            )
            print(header, flush=True)
            for workload, rate in workloads.items():
                if workload not in WORKLOADS:
                    continue
                results[workload] = {}
                for policy in POLICIES:
                    figures = await run_policy(session, engines, policy, workload, rate)
                    results[workload][policy] = figures
                    print(
                        f"{workload:<18}{policy:<20}{rate:>7.1f}{figures['ttft_p50_s']:>11.3f}"
                        f"{figures['ttft_p99_s']:>11.3f}{figures['output_tok_s']:>10.0f}"
                        f"{figures['prefix_hit_rate']:>9.3f}{figures['imbalance']:>7.2f}{figures['errors']:>7}",
                        flush=True,
                    )
            results["overhead"] = await overhead(session, engines)
            o = results["overhead"]
            print(
                f"router overhead: +{o['added_p50_ms']} ms p50, +{o['added_p99_ms']} ms p99 per request; "
                f"one router process sustains {o['max_rps']} req/s (load generator on the same 2 cores)"
            )
    finally:
        stop_process(host, timeout=15)
    print(json.dumps({"bench": "router", "results": results}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-host", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=ENGINES)
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    parser.add_argument("--blocks", type=int, default=KV_BLOCKS)
    parser.add_argument("--port-file")
    args = parser.parse_args()
    if args.engine_host:
        asyncio.run(host_engines(args.count, args.time_scale, args.blocks, args.port_file))
    else:
        asyncio.run(main())
