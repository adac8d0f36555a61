"""The rollout analysis' per-interval counts read from a real Prometheus.

An hour and a half of the router's counters, scraped every 15 s, is written into Prometheus's storage with
`promtool tsdb create-blocks-from openmetrics` (the documented backfill), then the operator's own range queries
(`canary.counter_selectors` on `Timeline.grid()`) are asked of a real Prometheus serving those blocks and split
by `canary.split_intervals`. Errors are independent (an A/A day): the counts per interval must add up to what
was counted and show no overdispersion. (Counting each interval with `increase(x[30s])` at a 15 s scrape out of
step with the points reads one 15 s increase per interval and extrapolates it to double: half of what was
counted is never seen, and the doubled counts read as a dispersion of about 2.)
"""

import asyncio
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from tokenyard.core.process import stop_process
from tokenyard.core.prometheus import PrometheusClient
from tokenyard.core.types import AnalysisMetricKind
from tokenyard.devcluster import prometheus
from tokenyard.operator.analysis import overdispersion, relative_volatility
from tokenyard.operator.canary import QueryScope, Timeline, counter_selectors, split_intervals

from tests.integration.autoscaler.test_prometheus_client import free_port

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SCRAPE_S = 15
ERROR_RATE = 0.02
SCOPE = QueryScope("llama", "team-a", "900s")


def counter_history(end: int, rng: random.Random):
    """{(metric, revision, router): [(time, value)]} every 15 s over the 90 min before `end`, and the true
    increments per series and sample time. Router b restarts about half an hour in, between two of the
    analysis' 30 s points (its counters start again at 0; what a series counted between the last point and a
    restart on top of it would be lost); the canary's series appear at 0 just before
    the analysis window (the last 15 min), as the router exports a revision's counters once it knows it."""
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    increments: dict[tuple[str, str, str], dict[int, float]] = {}
    # scrapes are never in step with the analysis' points: 7 s after each
    start, restart, canary_from = end - 5400 + 7, end - 3600 - 28 * SCRAPE_S + 7, end - 900 - 8
    for revision, router, per_scrape, first in (
        ("stable", "a", 120, start),
        ("stable", "b", 80, start),
        ("canary", "a", 20, canary_from),
    ):
        requests = errors = 0.0
        for at in range(first, end + 1, SCRAPE_S):
            if router == "b" and at == restart:
                requests = errors = 0.0
            new_errors = sum(1 for _ in range(per_scrape) if rng.random() < ERROR_RATE)
            if at > first:  # the first sample is where the series starts from
                requests, errors = requests + per_scrape, errors + new_errors
                increments.setdefault(("requests", revision, router), {})[at] = per_scrape
                increments.setdefault(("errors", revision, router), {})[at] = new_errors
            series.setdefault(("requests", revision, router), []).append((at, requests))
            series.setdefault(("errors", revision, router), []).append((at, errors))
    return series, increments


def openmetrics(series) -> str:
    lines = []
    for family in ("requests", "errors"):
        lines.append(f"# TYPE tokenyard_router_{family} counter")
        for (metric, revision, router), points in series.items():
            if metric != family:
                continue
            labels = f'model="llama",namespace="team-a",revision="{revision}",router="{router}"'
            lines += [f"tokenyard_router_{family}_total{{{labels}}} {value:g} {at}" for at, value in points]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture
def backfilled_prometheus(tmp_path: Path):
    if not (shutil.which(PROMETHEUS) and shutil.which(PROMTOOL)):
        pytest.skip("Debian's prometheus package (prometheus, promtool) is not installed")
    end = (int(time.time()) // 30) * 30 - 600
    series, increments = counter_history(end, random.Random(23))
    source = tmp_path / "counters.om"
    source.write_text(openmetrics(series))
    data = tmp_path / "prometheus-data"
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True
    )
    port = free_port()
    process = prometheus.prometheus_process(Path(PROMETHEUS), tmp_path, [], port).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not prometheus.ready(url):
        assert process.alive(), (tmp_path / "prometheus.log").read_text()
        assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
        time.sleep(0.2)
    yield url, end, increments
    stop_process(process.proc, timeout=10)


def true_total(increments, metric, revision, after, until):
    return sum(
        count
        for (m, r, _), by_time in increments.items()
        if (m, r) == (metric, revision)
        for at, count in by_time.items()
        if after < at <= until
    )


def test_interval_counts_from_the_operators_range_queries_tile_the_timeline(backfilled_prometheus):
    url, end, increments = backfilled_prometheus
    since = end - 900
    grid = Timeline(since=since, now=end, interval=30.0).grid()
    total, bad = counter_selectors(AnalysisMetricKind.ERROR_RATIO, None, SCOPE)

    async def read():
        client = PrometheusClient(url, timeout_s=10)
        try:
            readings = [
                await client.query_range(q.selector, grid.start, grid.end, grid.step) for q in (total, bad)
            ]
        finally:
            await client.close()
        for reading in readings:
            assert reading.ok, reading.problem
        return [reading.series for reading in readings]

    totals, bads = asyncio.run(read())
    history, stable_window = split_intervals(totals, bads, "stable", grid, others_count_good=False)
    canary_history, canary_window = split_intervals(totals, bads, "canary", grid, others_count_good=False)

    # every interval is whole and in its place: an hour of history, the window's 30 intervals
    assert len(history) == grid.last_before == 120 and len(stable_window) == len(canary_window) == 30
    assert canary_history == ()
    assert {n for n, _ in history + stable_window} == {400.0}  # (120 + 80 requests) x 2 scrapes
    # and they add up to what was counted, the router's restart included
    for revision, window in (("stable", stable_window), ("canary", canary_window)):
        assert sum(n for n, _ in window) == true_total(increments, "requests", revision, since, grid.end)
        assert sum(f for _, f in window) == true_total(increments, "errors", revision, since, grid.end)
    assert sum(f for _, f in history) == true_total(increments, "errors", "stable", grid.start, since)

    # independent errors: no clumping seen, so the test keeps the binomial variance
    assert overdispersion(history, lags=16) < 1.4
    assert relative_volatility(history) < 0.5 / (
        400 * ERROR_RATE
    )  # a factor under 1.5 at the stable's traffic
