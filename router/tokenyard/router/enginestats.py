"""What a replica reports about itself on /metrics (vLLM's metric names), and when that report is stale."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    scraped_at: float
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0..1
    waiting: float | None = None  # vllm:num_requests_waiting
    running: float | None = None  # vllm:num_requests_running
    block_size: int | None = None  # vllm:cache_config_info{block_size}
    num_gpu_blocks: int | None = None  # vllm:cache_config_info{num_gpu_blocks}
    prefix_hits: float | None = None  # vllm:prefix_cache_hits_total (tokens)
    prefix_queries: float | None = None  # vllm:prefix_cache_queries_total (tokens)

    def fresh(self, now: float, max_age_s: float) -> bool:
        return now - self.scraped_at <= max_age_s


_SUMMED = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # the name before vLLM 0.10
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
)
_CACHE_INFO = "vllm:cache_config_info"
_WANTED = (*_SUMMED, _CACHE_INFO)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_vllm_metrics(text: str, scraped_at: float) -> EngineStats:
    """Parse a /metrics body; series of several model names or engines are summed (usage is averaged).

    A line scanner for the few series the router reads rather than a full exposition-format parser: an engine
    exports hundreds of histogram lines and the router scrapes every replica twice a second."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    block_size = num_blocks = None
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        brace = line.find("{")
        name_end = brace if brace >= 0 else line.find(" ")
        name = line[:name_end]
        try:
            value = float(line.rsplit(" ", 1)[1] if brace < 0 else line[line.rindex("}") + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        if name == _CACHE_INFO:
            labels = dict(_LABEL.findall(line[brace:])) if brace >= 0 else {}
            try:
                block_size = int(float(labels.get("block_size", "")))
                num_blocks = int(float(labels.get("num_gpu_blocks", "")))
            except ValueError:
                pass
        elif name in _SUMMED:
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    usage_name = (
        "vllm:kv_cache_usage_perc" if "vllm:kv_cache_usage_perc" in sums else "vllm:gpu_cache_usage_perc"
    )
    kv_usage = sums[usage_name] / counts[usage_name] if usage_name in sums else None
    return EngineStats(
        scraped_at=scraped_at,
        kv_usage=kv_usage,
        waiting=sums.get("vllm:num_requests_waiting"),
        running=sums.get("vllm:num_requests_running"),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        prefix_hits=sums.get("vllm:prefix_cache_hits_total"),
        prefix_queries=sums.get("vllm:prefix_cache_queries_total"),
    )
