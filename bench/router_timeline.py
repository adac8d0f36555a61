"""Where a router's slow first tokens come from, second by second: a diagnostic beside `bench/bench_router.py`.

Runs one workload's open loop once through a fresh tokenyard router, on bench-router's fleet (tokenyard.sim, or
llm-d-inference-sim with ``BENCH_ENGINE=llm-d``; the same environment variables), exactly as one slice of
bench-router starts: engines emptied, a new router, its warm-up. Once a second it samples the router's /metrics
(the concurrency cap it has learned per replica, ``tokenyard_router_replica_concurrency``, and its requests in
flight per replica) and every engine's running / waiting counts. It prints one line a second with those, the
requests sent in that second and the slowest first token among them, then the TTFT p90 / p99 of the whole
slice and how many of the requests above the p99 were sent in each second. So a reader can see whether a tail
is made while the router is still learning (the first seconds) or later.

Run: ``[BENCH_ENGINE=llm-d BENCH_LLMD_SIM=...] .venv/bin/python bench/router_timeline.py WORKLOAD [SECONDS]``;
router flags go in ``BENCH_TOKENYARD_ARGS`` as for bench-router. The rate is bench-router's for that workload
(its calibration times the workload's level), unless ``TIMELINE_RATE`` gives one in requests/s. Slice seed 0.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402
import bench_router as bench  # noqa: E402
from router_workloads import WORKLOADS, open_requests  # noqa: E402

SAMPLE_EVERY_S = 1.0


def gauge_by_replica(text: str, name: str) -> dict[str, float]:
    """``name{replica="e3"} 8.0`` lines of a Prometheus text page, by replica label."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and "replica" in sample.labels:
                values[sample.labels["replica"]] = sample.value
    return values


async def engine_queue(session: aiohttp.ClientSession, url: str) -> str:
    """``running/waiting`` as the engine's /metrics says now."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(url + "/metrics") as response:
        text = await response.text()
    counts = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in counts:
                counts[sample.name] += sample.value
    return f"{counts['vllm:num_requests_running']:.0f}/{counts['vllm:num_requests_waiting']:.0f}"


async def sample(session, router_metrics: str, engines: list[str], t0: float, lines: list[str], stop) -> None:
    names = [f"e{i}" for i in range(len(engines))]
    while not stop.is_set():
        async with session.get(router_metrics) as response:
            text = await response.text()
        caps = gauge_by_replica(text, "tokenyard_router_replica_concurrency")
        out = gauge_by_replica(text, "tokenyard_router_outstanding_requests")
        queues = await asyncio.gather(*(engine_queue(session, url) for url in engines))
        lines.append(
            f"t+{time.monotonic() - t0:4.1f} caps={[int(caps.get(n, 0)) for n in names]} "
            f"router_out={[int(out.get(n, 0)) for n in names]} engine run/wait={list(queues)}"
        )
        await asyncio.sleep(SAMPLE_EVERY_S)


async def main(workload_name: str, seconds: float) -> None:
    workload = WORKLOADS[workload_name]
    sent: list[tuple[float, bench.Result]] = []  # (seconds into the slice when sent, result)
    plain_send = bench.send
    t0 = 0.0

    async def recording_send(*args, **kwargs):
        at = time.monotonic() - t0
        result = await plain_send(*args, **kwargs)
        sent.append((at, result))
        return result

    engines = await bench.FLEET.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            rate_env = os.environ.get("TIMELINE_RATE")
            rate = (
                float(rate_env)
                if rate_env
                else await bench.calibrate(session, engines, workload) * workload.level
            )
            await bench.flush_caches(session, engines)
            router = bench.RouterProcess("tokenyard", engines)
            try:
                await router.ready(session)
                metrics_port = router.proc.args[router.proc.args.index("--metrics-port") + 1]
                dispatcher = bench.Dispatcher("tokenyard", engines, router.url)
                await bench.flush_caches(session, engines, router_attached=True)
                lines: list[str] = []
                stop = asyncio.Event()
                bench.send = recording_send
                t0 = time.monotonic()
                sampler = asyncio.create_task(
                    sample(session, f"http://127.0.0.1:{metrics_port}/metrics", engines, t0, lines, stop)
                )
                if workload.body is None:
                    await bench.run_multi_turn(session, dispatcher, rate, seconds, seed=3)
                else:
                    await bench.run_open_loop(session, dispatcher, open_requests(workload, rate, seconds, 1))
                stop.set()
                await sampler
            finally:
                bench.send = plain_send
                router.stop()
    finally:
        bench.FLEET.stop()

    ttfts = [r.ttft for _, r in sent if r.ok and r.ttft is not None]
    p90, p99 = bench.percentile(ttfts, 0.9), bench.percentile(ttfts, 0.99)
    by_second: dict[int, list[float]] = defaultdict(list)
    for at, result in sent:
        by_second[int(at)].append(result.ttft if result.ttft is not None else float("inf"))
    print(
        f"{workload_name}, {rate:.1f} req/s for {seconds:.0f} s, {len(sent)} requests; router flags: "
        f"{' '.join(bench.TOKENYARD_ARGS) or '(defaults)'}"
    )
    for line in lines:
        print(line)
    print("second: requests sent, slowest first token (s), requests above the slice's p99")
    for second in sorted(by_second):
        values = by_second[second]
        print(f"  {second:3d}: {len(values):4d} {max(values):7.3f} {sum(v > p99 for v in values):4d}")
    print(
        f"TTFT over the slice: p90 {p90:.3f} s, p99 {p99:.3f} s ({len(ttfts)} requests, "
        f"{len(sent) - len(ttfts)} failed)"
    )


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in WORKLOADS:
        sys.exit(f"usage: router_timeline.py WORKLOAD [SECONDS]; workloads: {', '.join(WORKLOADS)}")
    asyncio.run(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 15.0))
