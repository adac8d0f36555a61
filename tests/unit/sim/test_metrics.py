"""Metric names per personality, what the flags change in them, and the /metrics encodings and faults."""

import gzip
import random
import zlib

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from tokenyard.core import labels as L
from tokenyard.sim.engine import FinishReason, SamplingParams
from tokenyard.sim.metrics import exposition, garbage_exposition
from tokenyard.sim.options import EngineOptions, FaultKnobs, knobs_from_env
from tokenyard.sim.server import SimEngine

SGLANG_SCHEDULER_GAUGES = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:gen_throughput",
    "sglang:max_total_num_tokens",
    "sglang:page_size",
    "sglang:num_pages",
    "sglang:context_len",
}
SGLANG_TOKENIZER_METRICS = {
    "sglang:prompt_tokens",
    "sglang:generation_tokens",
    "sglang:cached_tokens",
    "sglang:num_requests",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
    "sglang:e2e_request_latency_seconds",
}


def families(engine: SimEngine) -> dict:
    text = generate_latest(engine.metrics.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sglang_engine(**options) -> SimEngine:
    return SimEngine(EngineOptions(personality="sglang", served_model_name="team/qwen", **options))


def test_sglang_metric_names_and_labels():
    fams = families(sglang_engine())
    assert SGLANG_SCHEDULER_GAUGES | SGLANG_TOKENIZER_METRICS <= set(fams)
    assert not [name for name in fams if name.startswith("vllm:")]
    for name in SGLANG_SCHEDULER_GAUGES:
        (sample,) = fams[name].samples
        assert sample.labels == {
            "model_name": "team/qwen",
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
    assert [s.name for s in fams["sglang:prompt_tokens"].samples] == ["sglang:prompt_tokens_total"]
    for name in SGLANG_TOKENIZER_METRICS:
        assert all(set(s.labels) - {"le"} == {"model_name"} for s in fams[name].samples), name


def test_sglang_gauges_read_the_engine():
    engine = sglang_engine(num_gpu_blocks_override=1000)  # 1000 one-token pages
    core = engine.core
    core.add_request("a", list(range(1, 101)), SamplingParams(max_tokens=5), 0.0)
    core.add_request("b", list(range(1, 101)), SamplingParams(max_tokens=5), 0.0)
    core.step(0.0)
    engine.metrics.observe_prefill_batch(hit_tokens=50, input_tokens=200)
    values = {s.name: s.value for f in families(engine).values() for s in f.samples if "le" not in s.labels}
    assert values["sglang:num_running_reqs"] == 2 and values["sglang:num_queue_reqs"] == 0
    assert values["sglang:max_total_num_tokens"] == values["sglang:num_pages"] == 1000
    assert values["sglang:page_size"] == 1 and values["sglang:context_len"] == 1000
    # both prompts prefilled in the same step (so nothing shared yet): 2 x 100 one-token pages in use
    assert values["sglang:num_used_tokens"] == 200
    assert values["sglang:token_usage"] == pytest.approx(0.2)
    assert values["sglang:cache_hit_rate"] == 0.25
    assert values["sglang:prompt_tokens_total"] == 200 and values["sglang:generation_tokens_total"] == 2


def test_sglang_time_per_output_token_is_per_request():
    engine = sglang_engine()
    engine.metrics.observe_finished(
        FinishReason.LENGTH, e2e_s=2.0, ttft_s=1.0, prompt_tokens=9, output_tokens=11
    )
    engine.metrics.observe_finished(
        FinishReason.ABORT, e2e_s=9.0, ttft_s=1.0, prompt_tokens=9, output_tokens=3
    )
    values = {s.name: s.value for f in families(engine).values() for s in f.samples if "le" not in s.labels}
    assert values["sglang:time_per_output_token_seconds_sum"] == pytest.approx(0.1)
    assert values["sglang:e2e_request_latency_seconds_count"] == 1  # aborted requests are not timed
    assert values["sglang:num_requests_total"] == 2


def test_vllm_cache_config_info_reports_the_flags():
    engine = SimEngine(EngineOptions(block_size=32, enable_prefix_caching=False, kv_cache_dtype="fp8"))
    (info,) = families(engine)["vllm:cache_config_info"].samples
    assert (info.labels["block_size"], info.labels["enable_prefix_caching"], info.labels["cache_dtype"]) == (
        "32",
        "False",
        "fp8",
    )
    assert engine.core.config.block_size == 32 and not engine.core.pool.enable_caching
    assert int(info.labels["num_gpu_blocks"]) == engine.core.config.num_gpu_blocks


def test_prefix_caching_off_means_no_hits():
    for enabled, expected in ((True, 96), (False, 0)):
        engine = SimEngine(EngineOptions(enable_prefix_caching=enabled, num_gpu_blocks_override=100))
        core, prompt = engine.core, list(range(1, 101))
        for rid in ("a", "b"):
            core.add_request(rid, prompt, SamplingParams(max_tokens=1), 0.0)
            while core.has_work():
                core.step(0.0)
        assert core.prefix_cache_hits == expected


def test_the_sglang_personality_uses_one_token_pages_and_the_radix_cache_flag():
    assert sglang_engine().core.config.block_size == 1
    assert not sglang_engine(enable_prefix_caching=False).core.pool.enable_caching


@pytest.fixture
def registry():
    return SimEngine(EngineOptions(served_model_name="m")).metrics.registry


def test_exposition_is_plain_text_unless_gzip_is_accepted(registry):
    body, headers = exposition(registry, None, None)
    assert "Content-Encoding" not in headers and headers["Content-Type"].startswith("text/plain")
    assert "vllm:num_requests_running" in {f.name for f in text_string_to_metric_families(body.decode())}
    for accept_encoding in ("gzip", "deflate, gzip;q=0.8", "br, GZIP"):
        zipped, headers = exposition(registry, None, accept_encoding)
        assert headers["Content-Encoding"] == "gzip"
        names = {f.name for f in text_string_to_metric_families(gzip.decompress(zipped).decode())}
        assert "vllm:kv_cache_usage_perc" in names
    assert "Content-Encoding" not in exposition(registry, None, "identity, br")[1]


def test_exposition_speaks_openmetrics_when_asked(registry):
    body, headers = exposition(
        registry, "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8", None
    )
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert "vllm:num_requests_waiting" in {f.name for f in parse_openmetrics(body.decode())}


def test_garbage_is_no_exposition_format():
    rng = random.Random(0)
    body, headers = garbage_exposition("gzip", rng)
    assert headers["Content-Encoding"] == "gzip" and body[:2] == b"\x1f\x8b"
    with pytest.raises(zlib.error, match="invalid block type"):
        gzip.decompress(body)
    body, headers = garbage_exposition(None, rng)
    assert "Content-Encoding" not in headers and headers["Content-Type"].startswith("text/plain")
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(body.decode()))


def test_metrics_fault_knob_values():
    assert FaultKnobs(metrics_fault="garbage").validated().metrics_fault == "garbage"
    with pytest.raises(ValueError, match="metrics_fault must be one of none, garbage, error"):
        FaultKnobs(metrics_fault="sometimes").validated()
    assert knobs_from_env({L.ENV_SIM_METRICS_FAULT: "Error"}).metrics_fault == "error"
    assert knobs_from_env({}).metrics_fault == "none"
    with pytest.raises(ValueError, match="metrics_fault"):
        knobs_from_env({L.ENV_SIM_METRICS_FAULT: "later"})
