"""vLLM's Prometheus metrics for one simulated engine, in a registry of its own.

Names, types, label names and histogram buckets follow vLLM's V1 Prometheus logger
(vllm/v1/metrics/loggers.py, `PrometheusStatLogger`): every series carries `model_name` (the served model name)
and `engine` (the engine index, "0" here); `vllm:request_success` adds `finished_reason`; the info gauge
`vllm:cache_config_info` carries the cache configuration as labels.

Times are what a client observes on the wire: the engine runs at `--time-scale S`, so a step the model prices at
t seconds is served in S x t seconds, and that is the figure exported (Prometheus, the router and the autoscaler
all see served seconds, consistently with each other and with client-side measurements).

Gauges and counters read the engine's state at scrape time (a custom collector); histograms are observed by the
server as requests progress.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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
