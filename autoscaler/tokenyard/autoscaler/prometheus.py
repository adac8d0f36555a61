"""The autoscaler's signals in Prometheus: the default PromQL per signal and its placeholders.

The client (`PrometheusClient`, `Reading`, `parse_query_response`) is `tokenyard.core.prometheus`, shared with
the operator's rollout analysis, and re-exported here. Every failure comes back as a reading with no value and
the reason, never as zero: zero waiting requests means "scale down", and a dead Prometheus must not say that.
"""

from __future__ import annotations

from string import Template

from tokenyard.autoscaler.policy import SignalKind
from tokenyard.core.prometheus import PrometheusClient, Reading, parse_query_response

__all__ = [
    "DEFAULT_SELECTOR",
    "PrometheusClient",
    "QueryTemplateError",
    "Reading",
    "parse_query_response",
    "freshness_query",
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
# are summed.
SGLANG_RANK_LABELS = "tp_rank, pp_rank, moe_ep_rank"


def _sglang(name: str) -> str:
    return f'max without ({SGLANG_RANK_LABELS}) ({name}{{priority="",$selector}})'


def _both(vllm: str, sglang: str) -> str:
    """One instant vector of both engines' series of a gauge, SGLang's ranks reduced."""
    return f"{vllm}{{$selector}} or {_sglang(sglang)}"


def _rates(vllm: str, sglang: str, window: str = "5m") -> str:
    """One instant vector of both engines' per-second increases of a counter."""
    return f"rate({vllm}{{$selector}}[{window}]) or rate({sglang}{{$selector}}[{window}])"


_WAITING = f"sum({_both('vllm:num_requests_waiting', 'sglang:num_queue_reqs')})"
_RUNNING = f"sum({_both('vllm:num_requests_running', 'sglang:num_running_reqs')})"
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
_QUERIES: dict[SignalKind, str] = {
    SignalKind.QUEUED_TOKENS: _QUEUED_TOKENS,
    # Queued prompt tokens plus the tokens running sequences hold in the KV cache: a running sequence holds
    # its prompt and, on average, half its output. (vLLM exports the cache's size only as label strings of
    # vllm:cache_config_info, which PromQL cannot multiply, so the KV share is estimated the same way for both.)
    SignalKind.TOKEN_LOAD: f"{_QUEUED_TOKENS} + {_RUNNING} * ({_MEAN_PROMPT} + {_MEAN_OUTPUT} / 2)",
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
) -> str:
    """The PromQL for one signal of one target: the user's query if given, else the default.

    ``$namespace``, ``$target`` and ``$selector`` are substituted in either.
    """
    template = override or _QUERIES.get(kind)
    if template is None:
        raise QueryTemplateError(f"signal kind {kind.value} has no default query; set spec.signals[].query")
    return _substitute(template, namespace, target, selector)


def freshness_query(namespace: str, target: str, selector: str = DEFAULT_SELECTOR) -> str:
    """The PromQL for the age in seconds of the target's newest engine sample."""
    return _substitute(_FRESHNESS, namespace, target, selector)


def _substitute(template: str, namespace: str, target: str, selector: str) -> str:
    values = {"namespace": namespace, "target": target}
    values["selector"] = Template(selector).substitute(values)
    try:
        return Template(template).substitute(values)
    except (KeyError, ValueError) as exc:
        raise QueryTemplateError(
            f"query {template!r}: unknown or malformed placeholder {exc}; use $namespace, $target or $selector"
        ) from None
