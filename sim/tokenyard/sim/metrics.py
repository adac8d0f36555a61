"""The Prometheus metrics of one simulated engine, in a registry of its own, named as the engine it imitates.

vLLM (`EngineMetrics`, the default personality): names, types, label names and histogram buckets follow
vLLM's V1 Prometheus logger (vllm/v1/metrics/loggers.py, `PrometheusStatLogger`): every series carries
`model_name` (the served model name) and `engine` (the engine index, "0" here); `vllm:request_success` adds
`finished_reason`; the info gauge `vllm:cache_config_info` carries the cache configuration (CacheConfig's fields:
block_size, num_gpu_blocks, gpu_memory_utilization, enable_prefix_caching, cache_dtype) as labels.

SGLang (`SGLangMetrics`): the names on SGLang's "Production Metrics" page (sgl-project/sglang,
docs/references/production_metrics.md, as of v0.5.x): `sglang:prompt_tokens_total`,
`sglang:generation_tokens_total`, `sglang:token_usage`, `sglang:cache_hit_rate`,
`sglang:time_to_first_token_seconds`, `sglang:e2e_request_latency_seconds`,
`sglang:time_per_output_token_seconds`, `sglang:num_running_reqs`, `sglang:num_used_tokens`,
`sglang:gen_throughput`, `sglang:num_queue_reqs`, each labelled `model_name`. Plus names the page does not list
but SGLang's code exports (python/sglang/srt/metrics/collector.py; observability/metrics_collector.py in later
releases): `sglang:inter_token_latency_seconds`, `sglang:cached_tokens_total`, `sglang:num_requests_total`, and
the scheduler's constants `sglang:max_total_num_tokens`, `sglang:page_size`, `sglang:num_pages`,
`sglang:context_len`. The scheduler's gauges carry `model_name`, `engine_type` ("unified"), `tp_rank` and
`pp_rank` ("0"), the labels the scheduler's `init_metrics` gives its SchedulerMetricsCollector; the tokenizer's
counters and histograms carry `model_name` only. Buckets are those of the page's example output (the
inter-token histogram reuses the time-per-output-token buckets).

`exposition()` renders a registry as prometheus_client's own HTTP handler does: the text format, or OpenMetrics
when the Accept header asks for it (`choose_encoder`), gzip-compressed when Accept-Encoding includes gzip.

Times are what a client observes on the wire: the engine runs at `--time-scale S`, so a step the model prices at
t seconds is served in S x t seconds, and that is the figure exported (Prometheus, the router and the autoscaler
all see served seconds, consistently with each other and with client-side measurements).

Gauges and counters read the engine's state at scrape time (a custom collector); histograms are observed by the
server as requests progress.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from tokenyard.sim.engine import Engine, FinishReason

LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"

# vllm/v1/metrics/loggers.py bucket lists
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip


def buckets_1_2_5(maximum: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `maximum` (vLLM's `build_1_2_5_buckets`)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > maximum:
                return out
            out.append(value)
        exponent += 1


class _EngineStateCollector(Collector):
    def __init__(self, engine: Engine, labels: tuple[str, str], cache_info: dict[str, str]) -> None:
        self._engine = engine
        self._labels = list(labels)
        self._cache_info = cache_info

    def collect(self) -> Iterable[Metric]:
        e, labels = self._engine, self._labels

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(labels, value)
            return c

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running
        )
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting)
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_cache_usage
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            e.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            e.prefix_cache_hits,
        )
        yield counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", e.num_preemptions
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", e.generation_tokens)
        info_names = sorted(self._cache_info)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*info_names, "engine"],
        )
        info.add_metric([self._cache_info[k] for k in info_names] + [ENGINE_INDEX], 1.0)
        yield info


class EngineMetrics:
    """The registry of one engine and the histograms and counters the server observes."""

    def __init__(
        self, engine: Engine, model_name: str, max_model_len: int, cache_info: dict[str, str]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = (model_name, ENGINE_INDEX)
        self.registry.register(_EngineStateCollector(engine, labels, cache_info))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            h = Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets)
            return h.labels(*labels)

        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS_S
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS_S
        )
        self.e2e_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        )
        token_buckets = buckets_1_2_5(max_model_len)
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=self.registry,
        )
        self.request_success = {r: success.labels(*labels, r.value) for r in FinishReason}

    # --- what the server reports, in served seconds ---------------------------------------------------------
    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time.observe(seconds)

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self.inter_token_latency.observe(seconds)

    def observe_prefill_batch(self, hit_tokens: int, input_tokens: int) -> None:
        pass  # vLLM exports the prefix cache as counters, read from the engine at scrape time

    def observe_finished(
        self, reason: FinishReason, e2e_s: float, ttft_s: float | None, prompt_tokens: int, output_tokens: int
    ) -> None:
        self.request_success[reason].inc()
        self.e2e_latency.observe(e2e_s)
        self.prompt_tokens.observe(prompt_tokens)
        self.generation_tokens.observe(output_tokens)


# --- SGLang ----------------------------------------------------------------------------------------------------
SGLANG_SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")
SGLANG_TOKENIZER_LABELS = ("model_name",)
# Buckets of the example output on SGLang's Production Metrics page.
SGLANG_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0,
)  # fmt: skip
SGLANG_E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
)  # fmt: skip
SGLANG_TPOT_BUCKETS_S = (
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip


class _SGLangSchedulerCollector(Collector):
    """The scheduler's gauges, read from the engine at scrape time."""

    def __init__(
        self,
        engine: Engine,
        labels: tuple[str, ...],
        gen_throughput: Callable[[], float],
        cache_hit_rate: Callable[[], float],
    ) -> None:
        self._engine = engine
        self._labels = list(labels)
        self._gen_throughput = gen_throughput
        self._cache_hit_rate = cache_hit_rate

    def collect(self) -> Iterable[Metric]:
        e = self._engine
        block_size = e.config.block_size
        capacity = e.config.num_gpu_blocks * block_size
        used = (e.pool.num_blocks - e.pool.num_free) * block_size

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=SGLANG_SCHEDULER_LABELS)
            g.add_metric(self._labels, value)
            return g

        yield gauge("sglang:num_running_reqs", "The number of running requests.", e.num_running)
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield gauge("sglang:token_usage", "The token usage.", used / capacity if capacity else 0.0)
        yield gauge("sglang:gen_throughput", "The generation throughput (token/s).", self._gen_throughput())
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", e.num_waiting)
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", self._cache_hit_rate())
        yield gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", capacity
        )
        yield gauge("sglang:page_size", "KV cache page size in tokens.", block_size)
        yield gauge("sglang:num_pages", "Number of KV cache pages.", e.config.num_gpu_blocks)
        yield gauge("sglang:context_len", "Maximum context length.", e.config.max_model_len)


class _SGLangTokenCounters(Collector):
    def __init__(self, engine: Engine, labels: tuple[str, ...]) -> None:
        self._engine = engine
        self._labels = list(labels)

    def collect(self) -> Iterable[Metric]:
        e = self._engine
        for name, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", e.generation_tokens),
            ("sglang:cached_tokens", "Number of cached prompt tokens.", e.prefix_cache_hits),
        ):
            c = CounterMetricFamily(name, doc, labels=SGLANG_TOKENIZER_LABELS)
            c.add_metric(self._labels, value)
            yield c


class SGLangMetrics:
    """SGLang's metric names for one engine (served only with --enable-metrics, as SGLang does)."""

    def __init__(
        self,
        engine: Engine,
        model_name: str,
        gen_throughput: Callable[[], float],
        tp_rank: int = 0,
        pp_rank: int = 0,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._hit_rate = 0.0
        scheduler_labels = (model_name, "unified", str(tp_rank), str(pp_rank))
        self.registry.register(
            _SGLangSchedulerCollector(engine, scheduler_labels, gen_throughput, lambda: self._hit_rate)
        )
        self.registry.register(_SGLangTokenCounters(engine, (model_name,)))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            h = Histogram(name, doc, SGLANG_TOKENIZER_LABELS, registry=self.registry, buckets=buckets)
            return h.labels(model_name)

        self.time_to_first_token = histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            SGLANG_TTFT_BUCKETS_S,
        )
        self.inter_token_latency = histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            SGLANG_TPOT_BUCKETS_S,
        )
        self.e2e_latency = histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            SGLANG_E2E_BUCKETS_S,
        )
        self.num_requests = Counter(
            "sglang:num_requests",
            "Number of requests processed.",
            SGLANG_TOKENIZER_LABELS,
            registry=self.registry,
        ).labels(model_name)
        self.time_per_output_token = histogram(
            "sglang:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            SGLANG_TPOT_BUCKETS_S,
        )

    def observe_queue_time(self, seconds: float) -> None:
        pass

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self.inter_token_latency.observe(seconds)

    def observe_prefill_batch(self, hit_tokens: int, input_tokens: int) -> None:
        # SGLang's cache_hit_rate is that of the last prefill batch it logged (hit tokens over input tokens).
        if input_tokens > 0:
            self._hit_rate = hit_tokens / input_tokens

    def observe_finished(
        self, reason: FinishReason, e2e_s: float, ttft_s: float | None, prompt_tokens: int, output_tokens: int
    ) -> None:
        self.num_requests.inc()
        if reason is FinishReason.ABORT:
            return
        self.e2e_latency.observe(e2e_s)
        if ttft_s is not None and output_tokens > 1:
            self.time_per_output_token.observe((e2e_s - ttft_s) / (output_tokens - 1))


# --- exposition ------------------------------------------------------------------------------------------------
def exposition(
    registry: CollectorRegistry, accept: str | None, accept_encoding: str | None
) -> tuple[bytes, dict]:
    """The body and headers of a /metrics answer, as prometheus_client's handlers build them."""
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(registry)
    headers = {"Content-Type": content_type}
    if gzip_accepted(accept_encoding or ""):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


GARBAGE_HTML = (
    b"<html><head><title>502 Bad Gateway</title></head>\n"
    b"<body><h1>502 Bad Gateway</h1><p>metrics_fault=garbage</p></body></html>\n"
)


def garbage_exposition(accept_encoding: str | None, rng: random.Random) -> tuple[bytes, dict]:
    """A 200 answer that is no exposition format: a corrupt gzip stream when the client accepts gzip, else an
    HTML page (a proxy's error page); either way labelled as the text format."""
    headers = {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}
    if gzip_accepted(accept_encoding or ""):
        headers["Content-Encoding"] = "gzip"
        # gzip magic, deflate, no flags, 6 random header bytes, then a deflate block of the reserved type 3
        # (0x07: final block, BTYPE=11), which every inflater refuses, and random bytes.
        return b"\x1f\x8b\x08\x00" + rng.randbytes(6) + b"\x07" + rng.randbytes(53), headers
    return GARBAGE_HTML, headers
