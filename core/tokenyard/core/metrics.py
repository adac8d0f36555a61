"""Metric facts more than one component depends on."""

from __future__ import annotations

from collections.abc import Mapping

# Bucket bounds (seconds) of the router's latency histograms. The operator's rollout analysis reads the share
# of requests over a TTFT SLO from these buckets, so it must know which bounds exist.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def bucket_at_or_below(seconds: float) -> float:
    """The largest latency bucket bound not above `seconds` (the smallest bound when all are above): the
    share over that bound is what a histogram can say about an SLO of `seconds`."""
    below = [b for b in LATENCY_BUCKETS_S if b <= seconds]
    return float(below[-1] if below else LATENCY_BUCKETS_S[0])


# --- an engine's open requests ------------------------------------------------------------------------------
# The gauges of requests waiting for and in an engine's batch, as (vLLM's name, SGLang's name): the router's
# load signals, the autoscaler's default queries and the operator's drain hook read the same ones.
REQUESTS_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
REQUESTS_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")


# --- vLLM's KV cache size -----------------------------------------------------------------------------------
# vLLM states its KV cache's size only as label strings of the info gauge `vllm:cache_config_info` (value 1; the
# labels are CacheConfig's fields plus `engine`). Two shapes are in the field:
# - since vllm-project/vllm#42206 ("[Metrics] Add group-aware KV cache capacity to vllm:cache_config_info",
#   merged May 2026) the gauge carries `kv_cache_size_tokens`, the engine's own capacity in tokens, counted
#   over its KV cache groups; "None" for a model with no KV cache (encoder-only, attention-free);
# - before it (v0.13.0, the version `sim/` follows), only `num_gpu_blocks` and `block_size`, whose product is
#   the capacity of a model with one kind of attention.
# For hybrid models (sliding-window beside full attention, attention beside Mamba layers) the product is wrong:
# the pool is shared by several KV cache groups and, after initialisation, `block_size` is the smallest
# group's block (vllm-project/vllm#51163: a DeepSeek-V4 run with --block-size 256 reports block_size="4", and
# num_gpu_blocks x block_size differs from kv_cache_size_tokens). So the stated size wins wherever it is given,
# and the product is used only where the label is absent.
VLLM_KV_SIZE_LABEL = "kv_cache_size_tokens"


def whole_number(text: str | None) -> int | None:
    """A label value that is a positive whole number ("2048", "2048.0"), else None ("None", "", "0", "x")."""
    try:
        value = float(text) if text else 0.0
    except ValueError:
        return None
    return int(value) if value > 0 and value.is_integer() else None


def vllm_kv_capacity_tokens(labels: Mapping[str, str]) -> int | None:
    """One vLLM engine's KV cache capacity in tokens from its `vllm:cache_config_info` labels, or None when
    they do not say (not yet profiled, no KV cache, a malformed value). A `kv_cache_size_tokens` label that is
    present but not a number ("None") gives None: the product of blocks and block size would be wrong there."""
    stated = labels.get(VLLM_KV_SIZE_LABEL, "")
    if stated != "":
        return whole_number(stated)
    blocks, block_size = whole_number(labels.get("num_gpu_blocks")), whole_number(labels.get("block_size"))
    return blocks * block_size if blocks and block_size else None
