"""bench/bench_autoscaler.py: tokenyard fed as the controller is, through the shipped PromQL on scraped series.

The fleet's vLLM series are scraped into ``bench/promql_eval.py``'s store (every 15 s per group) and the
autoscaler's default queries (``tokenyard.autoscaler.prometheus.signal_query``) are evaluated on them. These
tests pin what those estimates read against the simulation's exact values.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "bench_autoscaler.py"
_spec = importlib.util.spec_from_file_location("bench_autoscaler", _PATH)
ba = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ba
_spec.loader.exec_module(ba)

from tokenyard.autoscaler.policy import SignalKind  # noqa: E402
from tokenyard.autoscaler.prometheus import (  # noqa: E402
    kv_cache_sizes,
    kv_cache_sizes_query,
    parse_query_response,
    signal_query,
)
from tokenyard.core.prometheus import parse_vector_response  # noqa: E402


def _read(kind: SignalKind, scraped, t: float, read_sizes: bool = True):
    """A signal as the controller reads it: the engines' KV cache sizes first (unless told not to, as when
    that query fails), then the signal's default query."""
    sizes = ()
    if read_sizes:
        sizes_query = ba.Query(kv_cache_sizes_query(ba.NAMESPACE, ba.TARGET))
        answer = sizes_query.api_body(scraped.store, t)
        sizes = kv_cache_sizes(parse_vector_response(200, answer, sizes_query.text))
    query = ba.Query(signal_query(kind, ba.NAMESPACE, ba.TARGET, kv_sizes=sizes))
    return parse_query_response(200, query.api_body(scraped.store, t), query.text).value


def _steady_fleet(seconds: int, ttft_s: float = 0.5):
    """Two serving groups, each running 10 chat requests and finishing one a second (each first token after
    ``ttft_s``), 4 chat requests waiting; scraped every tick as Prometheus would."""
    fleet, scraped = ba.Fleet(initial_groups=2), ba.ScrapedFleet()
    fleet.queue.append(ba.Queued(0.0, ba.CHAT, 4.0))
    for g in fleet.groups:
        g.running[ba.CHAT] = 10.0
    for t in range(seconds):
        for g in fleet.groups:
            g.finished += 1
            g.prompt_tokens_finished += ba.CHAT.prompt_tokens
            g.generation_tokens_finished += ba.CHAT.output_tokens
            g.observe_ttft(ttft_s, 1.0)
        scraped.scrape(fleet, float(t))
    return fleet, scraped


def test_the_shipped_token_load_matches_the_fleet_when_the_mix_is_steady():
    fleet, scraped = _steady_fleet(400)
    exact = fleet.metrics(399.0)["tokens_in_system"]
    # 4 waiting x 1000 prompt tokens + 20 running x (1000 + 600 / 2)
    assert exact == pytest.approx(4 * 1000 + 20 * 1300)
    assert _read(SignalKind.TOKEN_LOAD, scraped, 399.0) == pytest.approx(exact)
    assert _read(SignalKind.TOKEN_LOAD, scraped, 399.0, read_sizes=False) == pytest.approx(exact)
    assert _read(SignalKind.KV_CACHE_USAGE, scraped, 399.0) == pytest.approx(fleet.metrics(399.0)["kv"])


def test_the_token_load_reads_what_the_caches_hold_when_running_and_finished_requests_differ():
    # The finished requests are chat (1000 prompt tokens), but RAG requests (6000) are what is running: the
    # estimate from finished requests reads the running ones as chat, the engines' occupancy does not.
    fleet, scraped = _steady_fleet(400)
    for g in fleet.groups:
        g.running[ba.CHAT], g.running[ba.RAG] = 0.0, 10.0
    for t in range(400, 430):
        scraped.scrape(fleet, float(t))
    exact = fleet.metrics(429.0)["tokens_in_system"]
    assert exact == pytest.approx(4 * 1000 + 20 * (6000 + 400 / 2))
    assert _read(SignalKind.TOKEN_LOAD, scraped, 429.0) == pytest.approx(exact)
    assert _read(SignalKind.TOKEN_LOAD, scraped, 429.0, read_sizes=False) == pytest.approx(
        4 * 1000 + 20 * 1300
    )


def test_tokenyard_reads_the_cache_sizes_before_the_token_load():
    fleet, scraped = _steady_fleet(400)
    for g in fleet.groups:
        g.running[ba.CHAT], g.running[ba.RAG] = 0.0, 10.0
    for t in range(400, 430):  # every group scraped since the change
        scraped.scrape(fleet, float(t))
    policy = ba.TokenyardPolicy(ba.tokenyard_spec(1.0), "test")
    policy.observe(429.0, fleet.metrics(429.0), scraped.store)
    [token_load] = [name for name, kind, _ in policy.signals if kind is SignalKind.TOKEN_LOAD]
    (sample,) = policy.window.snapshot()[token_load]
    assert sample.value == pytest.approx(fleet.metrics(429.0)["tokens_in_system"])


def test_a_group_is_read_only_while_it_serves_and_leaves_the_query_when_deleted():
    fleet, scraped = _steady_fleet(100)
    loading = ba.Group(ready_at=1e9, ident=7)
    loading.running[ba.CHAT] = 50.0
    fleet.groups.append(loading)
    scraped.scrape(fleet, 100.0)
    running = 'sum(vllm:num_requests_running{namespace="bench"})'
    assert ba.Query(running).evaluate(scraped.store, 100.0)[0].value == pytest.approx(20.0)  # not scraped yet
    fleet.groups = [g for g in fleet.groups if g.ident != 0]
    scraped.scrape(fleet, 101.0)  # the deleted group's series get a staleness marker at once
    assert ba.Query(running).evaluate(scraped.store, 101.0)[0].value == pytest.approx(10.0)


def test_the_shipped_ttft_p95_reads_a_bucket_interpolation_not_the_exact_value():
    # Every first token at 1.2 s (under the 1.5 s SLO): vLLM's buckets around it are 1.0 and 2.5 s, so
    # histogram_quantile interpolates 95% of the way through that bucket: 1.0 + 1.5 x 0.95 = 2.425 s.
    _, scraped = _steady_fleet(200, ttft_s=1.2)
    assert _read(SignalKind.TTFT_P95, scraped, 199.0) == pytest.approx(2.425)


def test_tokenyard_reads_no_data_before_any_group_serves():
    policy = ba.TokenyardPolicy(ba.tokenyard_spec(0.1), "test")
    fleet, scraped = ba.Fleet(initial_groups=0), ba.ScrapedFleet()
    scraped.scrape(fleet, 0.0)
    policy.observe(0.0, fleet.metrics(0.0), scraped.store)
    assert policy.window.snapshot() == {name: () for name, _, _ in policy.signals}
