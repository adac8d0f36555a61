"""Parsing engines' /metrics as real servers send them: vLLM and SGLang names, the text format and OpenMetrics,
gzip and deflate bodies, and what makes a body unreadable (never a reason to stop routing: see test_scrape)."""

import gzip
import math
import time
import zlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from tokenyard.router import enginestats
from tokenyard.router.enginestats import (
    EngineStats,
    MetricsDecodeError,
    MetricsParseError,
    decode_metrics_body,
    parse_engine_metrics,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


VLLM = EngineStats(
    scraped_at=1.0,
    kv_usage=pytest.approx(0.30),  # (0.42 + 0.18) / 2 engines
    waiting=4.0,  # 3 + 1
    running=12.0,  # 7 + 5
    block_size=16,
    num_gpu_blocks=58254,  # 29127 per engine, two engines
    prefix_hits=20480.0,  # 16384 + 4096, the _created samples (1.77e9) never added
    prefix_queries=51200.0,  # 40960 + 10240
    prefix_hit_rate=None,  # vLLM exports counters only
    kv_capacity_tokens=58254 * 16,
    engine="vllm",
)
SGLANG = EngineStats(
    scraped_at=1.0,
    kv_usage=pytest.approx(0.37),  # sglang:token_usage, the same on both TP ranks
    waiting=5.0,  # the priority="" total; the breakdown (3 + 2) and the second rank not added
    running=12.0,
    block_size=1,  # sglang:page_size
    num_gpu_blocks=227604,  # sglang:num_pages
    prefix_hits=2438670.0,  # sglang:cached_tokens_total
    prefix_queries=8128902.0,  # sglang:prompt_tokens_total
    prefix_hit_rate=pytest.approx(0.61),  # sglang:cache_hit_rate
    kv_capacity_tokens=227604,  # sglang:max_total_num_tokens
    engine="sglang",
)
OPENMETRICS = EngineStats(
    scraped_at=1.0,
    kv_usage=pytest.approx(0.375),  # (0.5 + 0.25) / 2, the NaN series ignored
    waiting=3.0,  # 2 + 1 (two models)
    running=9.0,  # 6 + 3
    block_size=32,
    num_gpu_blocks=1000,
    prefix_hits=150.0,  # 100 + 50; exemplar and _created ignored
    prefix_queries=600.0,  # 400 + 200; escaped label values with } , " inside
    kv_capacity_tokens=32000,
    engine="vllm",
)
CASES = [("vllm_v0.13.0.prom", VLLM), ("sglang.prom", SGLANG), ("openmetrics_go_vllm_names.om", OPENMETRICS)]


def encodings(text: str) -> dict[str, tuple[bytes, str | None]]:
    raw = text.encode()
    deflater = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return {
        "identity": (raw, None),
        "gzip": (gzip.compress(raw), "gzip"),
        "x-gzip": (gzip.compress(raw), "x-gzip"),
        "gzip undeclared": (gzip.compress(raw), None),  # a server that forgets the header
        "deflate (zlib)": (zlib.compress(raw), "deflate"),
        "deflate (raw)": (deflater.compress(raw) + deflater.flush(), "deflate"),
        "declared gzip, already inflated": (raw, "gzip"),  # a proxy that decompressed but kept the header
        "gzip, identity": (gzip.compress(raw), "gzip, identity"),
    }


@pytest.mark.parametrize("name, expected", CASES, ids=[c[0] for c in CASES])
def test_fixtures_parse_plain_and_compressed_into_the_same_signals(name, expected):
    text = fixture(name)
    for how, (body, header) in encodings(text).items():
        stats = parse_engine_metrics(decode_metrics_body(body, header), scraped_at=1.0)
        assert stats == expected, how


def test_fixtures_are_valid_for_the_reference_parsers():
    """The fixtures are what a real exposition looks like: prometheus_client's own parsers read them."""
    for name in ("vllm_v0.13.0.prom", "sglang.prom"):
        assert sum(len(f.samples) for f in parse_text(fixture(name))) > 50
    families = {f.name: f for f in parse_openmetrics(fixture("openmetrics_go_vllm_names.om"))}
    queries = families["vllm:prefix_cache_queries"].samples
    assert queries[0].labels["adapter"] == 'base}, lora="none"' and queries[0].value == 400


def test_only_the_served_models_series_are_read_when_they_are_labelled():
    text = fixture("openmetrics_go_vllm_names.om")
    one = parse_engine_metrics(text, 1.0, models={"llama-8b"})
    assert (one.waiting, one.running, one.kv_usage) == (2.0, 6.0, 0.5)
    assert (one.prefix_hits, one.prefix_queries) == (100.0, 400.0)
    assert one.kv_capacity_tokens == 32000  # the info gauge has no model_name: it applies to the engine
    # no series of the router's model name (the engine calls it something else): read them all
    other = parse_engine_metrics(text, 1.0, models={"what-the-router-calls-it"})
    assert (other.waiting, other.running) == (3.0, 9.0)


def test_prometheus_client_openmetrics_names_with_underscores_are_read():
    """prometheus_client 0.26 writes vLLM's colons as underscores in OpenMetrics sample names."""
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "w", ["model_name"], registry=registry).labels("m").set(6)
    Counter("vllm:prefix_cache_hits", "h", ["model_name"], registry=registry).labels("m").inc(9)
    body = openmetrics_latest(registry).decode()
    assert "vllm_num_requests_waiting" in body and "vllm_prefix_cache_hits_created" in body
    stats = parse_engine_metrics(body, 1.0)
    assert (stats.waiting, stats.prefix_hits, stats.engine) == (6.0, 9.0, "vllm")


def test_created_is_never_the_value_and_a_bare_counter_name_is():
    created_only = "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_created 1765075000.0\n"
    assert parse_engine_metrics(created_only, 1.0).prefix_hits is None
    # a Go client's classic text format may expose a counter without the _total suffix
    bare = "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits 7\n"
    assert parse_engine_metrics(bare, 1.0).prefix_hits == 7.0


def test_timestamps_after_the_value_and_labels_without_any():
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting 3 1765075300000\n"  # no labels, a millisecond timestamp
        "vllm:num_requests_running\t4\n"
        '{"vllm:kv_cache_usage_perc",engine="0"} 0.25\n'  # the quoted-name form of UTF-8 names
    )
    stats = parse_engine_metrics(text, 1.0)
    assert (stats.waiting, stats.running, stats.kv_usage) == (3.0, 4.0, 0.25)


def test_nan_and_infinite_samples_are_unknown_not_numbers():
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="0"} +Inf\n'
        'vllm:num_requests_waiting{engine="1"} 2\n'
        'vllm:num_requests_running{engine="0"} -Inf\n'
    )
    stats = parse_engine_metrics(text, 1.0)
    assert stats.kv_usage is None and stats.running is None
    assert stats.waiting == 2.0


def test_names_that_merely_start_like_a_wanted_one_are_not_read():
    text = (
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 40\n'
        "vllm:num_requests_waiting 1\n"
    )
    assert parse_engine_metrics(text, 1.0).waiting == 1.0


def test_the_old_vllm_usage_name_is_a_fallback_only():
    old = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.7\n"
    assert parse_engine_metrics(old, 1.0).kv_usage == 0.7
    both = old + "vllm:kv_cache_usage_perc 0.2\n"  # vLLM 0.9-0.11 export both; the new name wins
    assert parse_engine_metrics(both, 1.0).kv_usage == 0.2


def test_an_older_sglang_without_page_size_still_gives_its_capacity_in_tokens():
    text = (
        "# TYPE sglang:max_total_num_tokens gauge\n"
        'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 90000.0\n'
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
    )
    stats = parse_engine_metrics(text, 1.0)
    assert (stats.kv_capacity_tokens, stats.block_size, stats.num_gpu_blocks) == (90000, None, None)
    assert (stats.waiting, stats.engine) == (2.0, "sglang")


def test_sglang_data_parallel_ranks_are_summed_and_usage_averaged():
    lines = []
    for dp, (queue, usage, tokens) in enumerate([(3, 0.2, 1000), (4, 0.6, 1000)]):
        labels = f'model_name="m",tp_rank="{dp}",dp_rank="{dp}"'
        lines += [
            f"sglang:num_queue_reqs{{{labels}}} {queue}",
            f"sglang:token_usage{{{labels}}} {usage}",
            f"sglang:max_total_num_tokens{{{labels}}} {tokens}",
        ]
    stats = parse_engine_metrics("# TYPE sglang:num_queue_reqs gauge\n" + "\n".join(lines), 1.0)
    assert stats.waiting == 7.0 and stats.kv_usage == pytest.approx(0.4) and stats.kv_capacity_tokens == 2000


def test_vllm_cache_info_before_profiling_says_none():
    text = '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    stats = parse_engine_metrics(text, 1.0)
    assert (stats.block_size, stats.num_gpu_blocks, stats.kv_capacity_tokens) == (16, None, None)


def test_an_exposition_without_known_names_is_valid_but_says_nothing():
    text = "# HELP my_queue Requests queued.\n# TYPE my_queue gauge\nmy_queue 12\n"
    stats = parse_engine_metrics(text, 1.0)
    assert stats == EngineStats(scraped_at=1.0)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "it is empty"),
        ("<html><body>502 Bad Gateway</body></html>", "not a Prometheus exposition"),
        ("hello world\nthis is not metrics\n", "not a Prometheus exposition"),
        ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{a="1" 3\n', "line 2"),
        ('vllm:num_requests_waiting{a="unterminated} 3\n', "unterminated"),
        ("vllm:num_requests_waiting three\n", "'three' is not a number"),
        ("vllm:num_requests_waiting\n", "without a value"),
    ],
)
def test_unparseable_bodies_raise_a_parse_error_that_says_why(text, message):
    with pytest.raises(MetricsParseError, match=message) as raised:
        parse_engine_metrics(text, 1.0)
    assert raised.value.reason == "parse"


def test_undecodable_bodies_raise_a_decode_error_that_says_why(monkeypatch):
    cases = {
        "binary": (bytes(range(128, 256)) * 4, None, "neither UTF-8 text nor gzip"),
        "truncated gzip": (
            gzip.compress(b"vllm:num_requests_waiting 1\n" * 100)[:40],
            "gzip",
            "not valid gzip",
        ),
        "undeclared broken gzip": (b"\x1f\x8b\x08\x00garbage", None, "not valid gzip"),
        "brotli": (b"\x0b\x02\x80hello", "br", "unsupported Content-Encoding 'br'"),
    }
    for what, (body, header, message) in cases.items():
        with pytest.raises(MetricsDecodeError, match=message) as raised:
            decode_metrics_body(body, header)
        assert raised.value.reason == "decode", what
    monkeypatch.setattr(enginestats, "MAX_METRICS_BYTES", 1000)
    with pytest.raises(MetricsDecodeError, match="inflates beyond 1000 bytes"):
        decode_metrics_body(gzip.compress(b"#" * 5000), "gzip")


def test_the_vllm_fixture_parses_without_a_model_filter():
    assert parse_engine_metrics(fixture("vllm_v0.13.0.prom"), 1.0) == VLLM


def test_a_large_payload_parses_in_milliseconds():
    """The router scrapes every replica every 2 s: a 10,000-line body (30+ histograms of 100 buckets, twice
    vLLM's real size) must cost a few milliseconds, not tens."""
    lines = [fixture("vllm_v0.13.0.prom")]
    for h in range(32):
        for engine in range(2):
            for le in range(150):
                lines.append(
                    f'vllm:request_h{h}_seconds_bucket{{engine="{engine}",le="{le}.0",model_name="m"}} {le}.0'
                )
    text = "\n".join(lines)
    assert text.count("\n") > 9000
    best = math.inf
    for _ in range(3):
        began = time.perf_counter()
        stats = parse_engine_metrics(text, 1.0)
        best = min(best, time.perf_counter() - began)
    assert stats.waiting == 4.0
    assert best < 0.05, f"parsing took {best * 1000:.1f} ms"


def test_lines_end_at_newlines_only():
    text = (
        "# TYPE vllm:num_requests_waiting gauge\r\n"
        'vllm:num_requests_waiting{model_name="a\x0cb"} 2\r\n'  # a form feed inside a label value
        'vllm:num_requests_running{model_name="a\x0cb"} 1\r\n'
    )
    stats = parse_engine_metrics(text, 1.0, models={"a\x0cb"})
    assert (stats.waiting, stats.running) == (2.0, 1.0)


def test_vllm_capacity_is_the_stated_one_where_vllm_states_it():
    # a hybrid model on a release with vllm-project/vllm#42206, two data-parallel engines: block_size is the
    # smallest KV group's block, so blocks x block_size (2 x 320 x 8) would say 5,120 tokens where they hold
    # 2 x 463,459
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="8",engine="0",kv_cache_size_tokens="463459",num_gpu_blocks="320"} 1\n'
        'vllm:cache_config_info{block_size="8",engine="1",kv_cache_size_tokens="463459",num_gpu_blocks="320"} 1\n'
    )
    stats = parse_engine_metrics(text, 1.0)
    assert (stats.block_size, stats.num_gpu_blocks, stats.kv_capacity_tokens) == (8, 640, 2 * 463459)
    # a model with no KV cache states "None": no capacity, not the product
    text = 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="None",num_gpu_blocks="100"} 1\n'
    assert parse_engine_metrics(text, 1.0).kv_capacity_tokens is None


def test_vllm_usage_exported_once_per_api_server_process_is_the_recording_process_value():
    # vLLM with --api-server-count 3 before vllm-project/vllm#28792: one series per process (`pid`), the
    # recording one with the value and 0 from the others; their mean would read a third of the real usage
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="271"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="273"} 0.65\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m",pid="275"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    )
    stats = parse_engine_metrics(text, 1.0)
    assert stats.kv_usage == pytest.approx(0.65) and stats.waiting == 3.0
