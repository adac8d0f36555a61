"""The autoscaler's signals in Prometheus: the default PromQL per signal and its placeholders.

The client (`PrometheusClient`, `Reading`, `parse_query_response`) is `tokenyard.core.prometheus`, shared with
the operator's rollout analysis, and re-exported here. Every failure comes back as a reading with no value and
the reason, never as zero: zero waiting requests means "scale down", and a dead Prometheus must not say that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import Template

from tokenyard.autoscaler.policy import SignalKind
from tokenyard.core.metrics import (
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    VLLM_KV_SIZE_LABEL,
    vllm_kv_capacity_tokens,
)
from tokenyard.core.prometheus import PrometheusClient, Reading, VectorReading, parse_query_response

__all__ = [
    "DEFAULT_SELECTOR",
    "KVCacheSize",
    "PrometheusClient",
    "QueryTemplateError",
    "Reading",
    "parse_query_response",
    "freshness_query",
    "kv_cache_sizes",
    "kv_cache_sizes_query",
    "signal_query",
]

# How the engine pods' Prometheus labels name the target. The scrape configuration (Kubernetes service
# discovery) maps the pod's namespace to `namespace` and its `tokenyard.dev/model-deployment` label to
# `model_deployment`; other targets (a plain Deployment, a LeaderWorkerSet) override the selector.
DEFAULT_SELECTOR = 'namespace="$namespace",model_deployment="$target"'

# The engines' metric names: vLLM v0.13.0 (vllm/v1/metrics/loggers.py, PrometheusStatLogger; `sim/` exports the
# same) and SGLang (python/sglang/srt/metrics/collector.py, now srt/observability/metrics_collector.py;
# docs/references/production_metrics.md). A target's pods run one engine or the other, or both for a while (a
# rollout that changes the engine kind keeps the old revision's pods beside the new one's), so each default
# query takes the union of both engines' series *before* aggregating: `sum(vllm_series or sglang_series)`.
# PromQL's `or` matches on labels without the metric name, and two pods' series always differ in their
# target labels, so every pod is counted once, whatever its engine. A pod of one engine never reads as zero
# for the other (there is no `or vector(0)` anywhere), and a target with neither engine's series still gives
# an empty result: "no data", never zero.
#
# SGLang specifics. With priority scheduling each scheduler gauge has a total (`priority=""`) beside one
# breakdown series per priority; `priority=""` also matches series without the label, so it selects the
# totals in both cases. Ranks of one scheduler (tp/pp/moe_ep; all of them report with
# --enable-metrics-for-all-schedulers, and every pipeline stage does by default) carry the same state, so they
# are reduced with `max without (...)` before summing; data-parallel ranks (`dp_rank`) are separate queues and
# are summed. Each scheduler is a process of its own and SGLang's multiprocess Prometheus client labels its
# gauges with the process's `pid` too (a public exposition of DeepSeek-R1 with data-parallel attention,
# vllm-project/aibrix#1614, shows `dp_rank`, `tp_rank` and `pid` on every scheduler gauge), so copies of one
# scheduler's state differ by `pid` as well as by rank: it is reduced with the ranks, and `dp_rank` still tells
# the data-parallel queues apart.
SGLANG_RANK_LABELS = "tp_rank, pp_rank, moe_ep_rank, pid"


def _sglang(name: str) -> str:
    return f'max without ({SGLANG_RANK_LABELS}) ({name}{{priority="",$selector}})'


# vLLM run with several API-server processes (--api-server-count > 1) uses prometheus_client's multiprocess mode,
# where a gauge left at the default mode ("all") is exported once per process with a `pid` label: the process
# that records it has the value, every other one 0. vllm:kv_cache_usage_perc was such a gauge until
# vllm-project/vllm#28792 (merged 2025-11-16); the scheduler gauges were "mostrecent" (one series) before that.
# So every vLLM gauge read here is reduced with `max without (pid)`, which changes nothing where there is no pid.
def _vllm(name: str) -> str:
    return f"max without (pid) ({name}{{$selector}})"


def _both(vllm: str, sglang: str) -> str:
    """One instant vector of both engines' series of a gauge, vLLM's process copies and SGLang's ranks
    reduced."""
    return f"{_vllm(vllm)} or {_sglang(sglang)}"


def _rates(vllm: str, sglang: str, window: str = "5m") -> str:
    """One instant vector of both engines' per-second increases of a counter."""
    return f"rate({vllm}{{$selector}}[{window}]) or rate({sglang}{{$selector}}[{window}])"


_WAITING = f"sum({_both(*REQUESTS_WAITING)})"
_RUNNING = f"sum({_both(*REQUESTS_RUNNING)})"
# Neither engine has a gauge of queued prompt tokens, so the default estimates it as the waiting requests times
# the mean prompt length of the requests that finished over the last 5 minutes: vLLM's request histograms,
# SGLang's per-finished-request counters (prompt/generation tokens and requests, all incremented together when a
# request finishes). With no recent requests the mean is taken as 0 (the request rate is clamped to a floor far
# below any real rate: 0 tokens / floor = 0), so an idle vLLM target reads 0, while a target with no series at
# all reads "no data" (as does an SGLang target before its first request finished: SGLang creates those
# counters' series at the first observation). The floor used to be 1 request/s, which turned the mean into
# tokens per second whenever fewer than one request a second finished (a target at 10 requests a minute read
# a mean prompt 6x too small).
_RATE_FLOOR = "1e-09"
_MEAN_PROMPT = (
    f"(sum({_rates('vllm:request_prompt_tokens_sum', 'sglang:prompt_tokens_total')})"
    f" / clamp_min(sum({_rates('vllm:request_prompt_tokens_count', 'sglang:num_requests_total')}), {_RATE_FLOOR}))"
)
_MEAN_OUTPUT = (
    f"(sum({_rates('vllm:request_generation_tokens_sum', 'sglang:generation_tokens_total')})"
    f" / clamp_min(sum({_rates('vllm:request_generation_tokens_count', 'sglang:num_requests_total')}), {_RATE_FLOOR}))"
)
_QUEUED_TOKENS = f"{_WAITING} * {_MEAN_PROMPT}"
# TTFT: each engine's p95 from its own buckets (their bucket bounds differ; summing buckets of both by `le`
# would mix bounds), the worse of the two when a target runs both.
_TTFT_COUNT = f"sum({_rates('vllm:time_to_first_token_seconds_count', 'sglang:time_to_first_token_seconds_count', '1m')})"


def _p95(name: str, engine: str) -> str:
    return (
        f"label_replace(histogram_quantile(0.95, sum by (le) (rate({name}_bucket{{$selector}}[1m]))), "
        f'"engine_kind", "{engine}", "", "")'
    )


_TTFT_P95 = (
    f"max({_p95('vllm:time_to_first_token_seconds', 'vllm')}"
    f" or {_p95('sglang:time_to_first_token_seconds', 'sglang')})"
)


# TokenLoad: queued prompt tokens plus the tokens the running sequences hold in the KV cache, read from the
# engines' own occupancy where they say enough to turn it into tokens.
#
# - SGLang exports the tokens in use as a number, `sglang:num_used_tokens`.
# - vLLM exports the occupied fraction (`vllm:kv_cache_usage_perc`) and the cache's size only as label strings
#   of the info gauge `vllm:cache_config_info` (value 1): `kv_cache_size_tokens` in releases since
#   vllm-project/vllm#42206, `num_gpu_blocks` x `block_size` before (`tokenyard.core.metrics` says which holds
#   when). PromQL cannot turn a label into a number, so the controller first asks which sizes the target's
#   engines have (`kv_cache_sizes_query`: one series per distinct label set), then writes one term per size:
#   the occupancy of the engines of that size (matched to their info series on the scrape target and engine
#   index) times its tokens. A rollout to another model, GPU or vLLM release gives two sizes, each engine
#   counted with its own; an engine that states `kv_cache_size_tokens` is never also counted by its blocks.
# - With no size known (no vLLM engine, or no info series: a failed read, a vLLM that does not export it),
#   SGLang-only targets still read their own count, and a target with any vLLM engine falls back to the
#   estimate from request counts for all its engines: each running sequence holds the mean prompt and half
#   the mean output of the requests that finished over 5 minutes. That estimate reads 1.25-1.36x the tokens really held in the
#   autoscaler bench (running requests are not a random draw of finished ones: the short, long-prompt requests
#   finish fastest and are over-weighed among the finished), which cost about 4 GPU-hours of 86 at a 99% SLO.
_KV_CACHE_SIZES = (
    f"count by ({VLLM_KV_SIZE_LABEL}, num_gpu_blocks, block_size) (vllm:cache_config_info{{$selector}})"
)
_VLLM_ENGINE_LABELS = "instance, engine"  # one engine's series: its scrape target and vLLM's engine index
_SGLANG_USED_TOKENS = _sglang("sglang:num_used_tokens")
_ESTIMATED_KV_TOKENS = f"{_RUNNING} * ({_MEAN_PROMPT} + {_MEAN_OUTPUT} / 2)"


@dataclass(frozen=True, order=True)
class KVCacheSize:
    """The KV cache of some vLLM engines: its tokens, and the `vllm:cache_config_info` label values that pick
    exactly those engines' info series."""

    tokens: int
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> KVCacheSize | None:
        """The size one info series states (`tokenyard.core.metrics.vllm_kv_capacity_tokens`), or None."""
        tokens = vllm_kv_capacity_tokens(labels)
        if tokens is None:
            return None
        stated = labels.get(VLLM_KV_SIZE_LABEL, "")
        if stated:
            return cls(tokens, ((VLLM_KV_SIZE_LABEL, stated),))
        # An engine without the label is picked by its blocks and by the label's absence, so that an engine of
        # a later release with the same blocks is not counted twice.
        picked = (("num_gpu_blocks", labels["num_gpu_blocks"]), ("block_size", labels["block_size"]))
        return cls(tokens, (*picked, (VLLM_KV_SIZE_LABEL, "")))

    @classmethod
    def of_blocks(cls, num_gpu_blocks: int, block_size: int) -> KVCacheSize:
        """The size of an engine that states only its blocks (vLLM before #42206)."""
        size = cls.from_labels({"num_gpu_blocks": str(num_gpu_blocks), "block_size": str(block_size)})
        if size is None:
            raise ValueError(f"not a KV cache size: {num_gpu_blocks} blocks of {block_size} tokens")
        return size

    def matchers(self) -> str:
        return ",".join(f'{name}="{value}"' for name, value in self.labels)


def kv_cache_sizes(reading: VectorReading) -> tuple[KVCacheSize, ...]:
    """The distinct KV cache sizes in an answer to `kv_cache_sizes_query` (pure), smallest first. A failed
    query, or a series whose labels give no size, gives none: the token load then falls back to its estimate
    rather than multiplying by a wrong size."""
    sizes = {KVCacheSize.from_labels(sample.labels) for sample in reading.samples or ()}
    return tuple(sorted(size for size in sizes if size is not None))


def _token_load(sizes: Sequence[KVCacheSize]) -> str:
    if not sizes:
        # SGLang's own count when no vLLM engine is there; the estimate for every engine when one is.
        vllm_running = "vllm:num_requests_running{$selector}"
        held = f"((sum({_SGLANG_USED_TOKENS}) unless on() count({vllm_running})) or {_ESTIMATED_KV_TOKENS})"
    else:
        per_size = [
            f"{_vllm('vllm:kv_cache_usage_perc')} * on({_VLLM_ENGINE_LABELS}) "
            f"vllm:cache_config_info{{{s.matchers()},$selector}}"
            f" * {s.tokens}"
            for s in sizes
        ]
        held = f"sum({' or '.join([*per_size, _SGLANG_USED_TOKENS])})"
    return f"{_QUEUED_TOKENS} + {held}"


_QUERIES: dict[SignalKind, str] = {
    SignalKind.QUEUED_TOKENS: _QUEUED_TOKENS,
    SignalKind.TOKEN_LOAD: _token_load(()),  # signal_query writes it with the engines' KV cache sizes
    SignalKind.WAITING_REQUESTS: _WAITING,
    # vllm:kv_cache_usage_perc and sglang:token_usage are both the fraction of the KV pool held by running
    # requests (cached blocks free to evict count as free in both), 0..1.
    SignalKind.KV_CACHE_USAGE: f"avg({_both('vllm:kv_cache_usage_perc', 'sglang:token_usage')})",
    # histogram_quantile gives NaN when no request finished its first token in the window; that is an
    # idle engine, not missing data, so it reads 0 then (the `or` branch: the request rate times 0).
    # A target with no series at all still gives an empty result.
    SignalKind.TTFT_P95: (f"({_TTFT_P95} and on() ({_TTFT_COUNT} > 0)) or on() ({_TTFT_COUNT} * 0)"),
}


# How old the newest engine sample is, in seconds: every engine exports its running-requests gauge at every scrape
# (0 when idle). Prometheus answers instant queries with the last sample of the lookback window (5 minutes), so
# when it has just restarted, or stopped scraping the engines, the signal queries still return values from
# before: this tells them apart from a live reading. Empty when the target has no engine series at all.
# `timestamp()` gives a sample's own time only when applied to a selector itself (of any other expression it
# gives the evaluation time), hence one per engine.
_FRESHNESS = (
    "time() - max(timestamp(vllm:num_requests_running{$selector})"
    ' or timestamp(sglang:num_running_reqs{priority="",$selector}))'
)


class QueryTemplateError(ValueError):
    """A signal without a query, or a query that names an unknown $placeholder."""


def signal_query(
    kind: SignalKind,
    namespace: str,
    target: str,
    override: str | None = None,
    selector: str = DEFAULT_SELECTOR,
    kv_sizes: Sequence[KVCacheSize] = (),
) -> str:
    """The PromQL for one signal of one target: the user's query if given, else the default.

    ``$namespace``, ``$target`` and ``$selector`` are substituted in either. ``kv_sizes`` are the target's vLLM
    KV cache sizes (`kv_cache_sizes` of `kv_cache_sizes_query`'s answer), which the default TokenLoad needs to
    read vLLM's occupancy in tokens.
    """
    template = override or (_token_load(kv_sizes) if kind is SignalKind.TOKEN_LOAD else _QUERIES.get(kind))
    if template is None:
        raise QueryTemplateError(f"signal kind {kind.value} has no default query; set spec.signals[].query")
    return _substitute(template, namespace, target, selector)


def freshness_query(namespace: str, target: str, selector: str = DEFAULT_SELECTOR) -> str:
    """The PromQL for the age in seconds of the target's newest engine sample."""
    return _substitute(_FRESHNESS, namespace, target, selector)


def kv_cache_sizes_query(namespace: str, target: str, selector: str = DEFAULT_SELECTOR) -> str:
    """The PromQL for the distinct KV cache sizes of the target's vLLM engines (see `kv_cache_sizes`)."""
    return _substitute(_KV_CACHE_SIZES, namespace, target, selector)


def _substitute(template: str, namespace: str, target: str, selector: str) -> str:
    values = {"namespace": namespace, "target": target}
    values["selector"] = Template(selector).substitute(values)
    try:
        return Template(template).substitute(values)
    except (KeyError, ValueError) as exc:
        raise QueryTemplateError(
            f"query {template!r}: unknown or malformed placeholder {exc}; use $namespace, $target or $selector"
        ) from None
