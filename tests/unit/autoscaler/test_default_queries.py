"""The default PromQL per signal covers vLLM and SGLang targets: the query strings, and their values evaluated
by promtool's rule-test engine (Prometheus's own PromQL engine, no server) over synthetic series of vLLM pods,
SGLang pods (several ranks, priority breakdowns, data-parallel ranks), a target running both, and a target
with no series at all, which must stay "no data", never zero."""

import shutil
import subprocess

import pytest
import yaml
from tokenyard.autoscaler.policy import SignalKind
from tokenyard.autoscaler.prometheus import KVCacheSize, freshness_query, kv_cache_sizes_query, signal_query


def test_every_gauge_signal_reads_both_engines_before_aggregating():
    waiting = signal_query(SignalKind.WAITING_REQUESTS, "ns", "t")
    assert waiting == (
        'sum(max without (pid) (vllm:num_requests_waiting{namespace="ns",model_deployment="t"})'
        " or max without (tp_rank, pp_rank, moe_ep_rank, pid)"
        ' (sglang:num_queue_reqs{priority="",namespace="ns",model_deployment="t"}))'
    )
    kv = signal_query(SignalKind.KV_CACHE_USAGE, "ns", "t")
    assert (
        kv.startswith("avg(max without (pid) (vllm:kv_cache_usage_perc{")
        and 'sglang:token_usage{priority="",' in kv
    )
    load = signal_query(SignalKind.TOKEN_LOAD, "ns", "t")
    for name in (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
    ):
        assert name in load
    ttft = signal_query(SignalKind.TTFT_P95, "ns", "t")
    assert (
        "sglang:time_to_first_token_seconds_bucket" in ttft
        and "vllm:time_to_first_token_seconds_bucket" in ttft
    )
    for kind in SignalKind:
        if kind is not SignalKind.PROMQL:
            query = signal_query(kind, "ns", "t")
            assert "vector(0)" not in query, f"{kind.value}: an absent engine must not read as zero"
            assert "$" not in query


# Series, one sample every 15 s for 10 minutes (41 samples); counters grow by 10 requests a minute.
STEPS = "x40"


def gauge(value: float) -> str:
    return f"{value}+0{STEPS}"


def counter(per_minute: float) -> str:
    return f"0+{per_minute / 4}{STEPS}"


def series(name: str, target: str, pod: str, value: str, **labels: str) -> dict:
    all_labels = {"namespace": "ns", "model_deployment": target, "pod": pod, **labels}
    rendered = ",".join(f'{k}="{v}"' for k, v in all_labels.items())
    return {"series": f"{name}{{{rendered}}}", "values": value}


def sglang_scheduler(name: str, target: str, pod: str, total: float, ranks=(0, 1), **labels) -> list[dict]:
    """What SGLang with --enable-metrics-for-all-schedulers and priority scheduling exports: every TP rank (a
    process of its own, with its `pid`) the same total under priority="", and a breakdown per priority that
    must not be added to it."""
    out = []
    for rank in ranks:
        pid = str(1000 + 10 * int(labels.get("dp_rank", "0")) + rank)
        rank_labels = {"tp_rank": str(rank), "pp_rank": "0", "moe_ep_rank": str(rank), "pid": pid, **labels}
        out.append(series(name, target, pod, gauge(total), priority="", **rank_labels))
        out.append(series(name, target, pod, gauge(total * 0.75), priority="0", **rank_labels))
        out.append(series(name, target, pod, gauge(total * 0.25), priority="10", **rank_labels))
    return out


def vllm_pod(
    target: str,
    pod: str,
    waiting: float,
    running: float,
    kv: float,
    num_gpu_blocks: int = 1000,
    kv_cache_size_tokens: str | None = None,
    api_server_pids: tuple[str, ...] = (),
) -> list[dict]:
    labels = {"engine": "0", "model_name": "m", "instance": f"{pod}:8000"}
    # the info gauge: CacheConfig's fields as labels (block_size 16: num_gpu_blocks x 16 tokens), value 1;
    # releases since vllm-project/vllm#42206 add the capacity they computed, kv_cache_size_tokens
    cache_config = {
        "block_size": "16",
        "num_gpu_blocks": str(num_gpu_blocks),
        "gpu_memory_utilization": "0.9",
    }
    if kv_cache_size_tokens is not None:
        cache_config["kv_cache_size_tokens"] = kv_cache_size_tokens
    return [
        series("vllm:cache_config_info", target, pod, gauge(1), **labels, **cache_config),
        series("vllm:num_requests_waiting", target, pod, gauge(waiting), **labels),
        series("vllm:num_requests_running", target, pod, gauge(running), **labels),
        # with several API-server processes, vLLM before #28792 exported the usage once per process (`pid`):
        # the recording process's value, 0 from every other one
        *(
            [series("vllm:kv_cache_usage_perc", target, pod, gauge(kv), **labels)]
            if not api_server_pids
            else [
                series("vllm:kv_cache_usage_perc", target, pod, gauge(kv if i == 0 else 0), pid=pid, **labels)
                for i, pid in enumerate(api_server_pids)
            ]
        ),
        # 10 requests a minute of 800 prompt and 200 output tokens
        series("vllm:request_prompt_tokens_sum", target, pod, counter(8000), **labels),
        series("vllm:request_prompt_tokens_count", target, pod, counter(10), **labels),
        series("vllm:request_generation_tokens_sum", target, pod, counter(2000), **labels),
        series("vllm:request_generation_tokens_count", target, pod, counter(10), **labels),
    ]


def sglang_pod(
    target: str, pod: str, queue: float, running: float, usage: float, used_tokens: float = 0, **labels
) -> list[dict]:
    tokenizer = {"model_name": "m"}
    return [
        *sglang_scheduler("sglang:num_queue_reqs", target, pod, queue, **labels),
        *sglang_scheduler("sglang:num_used_tokens", target, pod, used_tokens, **labels),
        *sglang_scheduler("sglang:num_running_reqs", target, pod, running, **labels),
        *[
            s
            for s in sglang_scheduler("sglang:token_usage", target, pod, usage, **labels)
            if 'priority=""' in s["series"]
        ],
        # 10 finished requests a minute of 800 prompt and 200 output tokens
        series("sglang:prompt_tokens_total", target, pod, counter(8000), **tokenizer),
        series("sglang:generation_tokens_total", target, pod, counter(2000), **tokenizer),
        series("sglang:num_requests_total", target, pod, counter(10), **tokenizer),
    ]


def ttft_histogram(engine: str, target: str, pod: str, bounds: tuple[str, ...]) -> list[dict]:
    """Every request's first token under the second bound: the p95 interpolates inside that bucket."""
    name = f"{engine}:time_to_first_token_seconds"
    out = [
        series(f"{name}_bucket", target, pod, counter(0 if le == bounds[0] else 10), le=le) for le in bounds
    ]
    out.append(series(f"{name}_count", target, pod, counter(10)))
    return out


INPUT = [
    # a rollout to a model with a smaller cache: 16,000 and 8,000 tokens
    *vllm_pod("v", "v-0", waiting=3, running=6, kv=0.75),
    *vllm_pod("v", "v-1", waiting=1, running=2, kv=0.25, num_gpu_blocks=500),
    *sglang_pod("s", "s-0", queue=5, running=12, usage=0.375, used_tokens=6000),
    # SGLang with data-parallel attention: each dp rank its own queue, summed
    *sglang_pod("dp", "dp-0", queue=3, running=1, usage=0.25, used_tokens=1000, dp_rank="0"),
    *[
        s
        for s in sglang_pod("dp", "dp-0", queue=4, running=1, usage=0.75, used_tokens=3000, dp_rank="1")
        if "tokens_total" not in s["series"] and "requests_total" not in s["series"]
    ],
    # an engine-changing rollout: one vLLM pod and one SGLang pod behind the same target
    *vllm_pod("mix", "mix-0", waiting=2, running=4, kv=0.5),
    *sglang_pod("mix", "mix-1", queue=3, running=4, usage=0.25, used_tokens=2000),
    # an upgrade to a vLLM release that states kv_cache_size_tokens, serving a hybrid model whose 1,000 blocks of
    # 16 hold 50,000 tokens, beside a pod of the old release with the same blocks; and an attention-free model
    # ("None": no KV cache to size)
    *vllm_pod("hy", "hy-0", waiting=1, running=4, kv=0.5),
    *vllm_pod("hy", "hy-1", waiting=1, running=4, kv=0.2, kv_cache_size_tokens="50000"),
    *vllm_pod("hy", "hy-2", waiting=0, running=0, kv=0.0, num_gpu_blocks=0, kv_cache_size_tokens="None"),
    # vLLM with --api-server-count 3, before vllm-project/vllm#28792
    *vllm_pod("mp", "mp-0", waiting=2, running=4, kv=0.6, api_server_pids=("11", "12", "13")),
    # TTFT: vLLM (0.001, 0.1, 0.5, ...) and SGLang (0.1, 0.2, 0.4, ...) bucket bounds differ
    *ttft_histogram("vllm", "v", "v-0", ("0.1", "0.5", "+Inf")),
    *ttft_histogram("sglang", "s", "s-0", ("0.2", "0.4", "+Inf")),
    *[
        series(f"sglang:time_to_first_token_seconds{suffix}", "idle", "i-0", gauge(50), **extra)
        for suffix, extra in (("_bucket", {"le": "+Inf"}), ("_count", {}))
    ],
]


def expect(kind: SignalKind, target: str, value: float | None, kv_sizes=()) -> dict:
    samples = [] if value is None else [{"labels": "{}", "value": value}]
    query = signal_query(kind, "ns", target, kv_sizes=kv_sizes)
    return {"expr": query, "eval_time": "10m", "exp_samples": samples}


def expect_sizes(target: str, sizes: list[tuple[str, ...]]) -> dict:
    """`sizes`: (num_gpu_blocks, block_size) or (num_gpu_blocks, block_size, kv_cache_size_tokens)."""
    samples = []
    for n, b, *stated in sizes:
        labels = f'block_size="{b}",num_gpu_blocks="{n}"' + "".join(
            f',kv_cache_size_tokens="{t}"' for t in stated
        )
        samples.append({"labels": "{" + labels + "}", "value": 1})
    return {"expr": kv_cache_sizes_query("ns", target), "eval_time": "10m", "exp_samples": samples}


SIZES = (KVCacheSize.of_blocks(500, 16), KVCacheSize.of_blocks(1000, 16))
# a hybrid model on a release that states its capacity: 50,000 tokens, not its 1,000 blocks x 16
STATED = KVCacheSize.from_labels(
    {"kv_cache_size_tokens": "50000", "num_gpu_blocks": "1000", "block_size": "16"}
)
HYBRID_ROLLOUT_SIZES = (KVCacheSize.of_blocks(1000, 16), STATED)


def expect_age(target: str, eval_time: str, age_s: float | None) -> dict:
    samples = [] if age_s is None else [{"labels": "{}", "value": age_s}]
    return {"expr": freshness_query("ns", target), "eval_time": eval_time, "exp_samples": samples}


CASES = [
    # the newest engine sample's age: 0 while scraped; 2 minutes after the last scrape (Prometheus back from an
    # outage still answers the signal queries from the lookback window), 120 s, whichever engine
    expect_age("v", "10m", 0),
    expect_age("s", "10m", 0),
    expect_age("mix", "12m", 120),
    expect_age("s", "12m", 120),
    expect_age("nobody", "10m", None),
    # waiting requests: vLLM pods summed; SGLang's priority="" total once, not per rank or per priority
    expect(SignalKind.WAITING_REQUESTS, "v", 4),
    expect(SignalKind.WAITING_REQUESTS, "s", 5),
    expect(SignalKind.WAITING_REQUESTS, "dp", 7),
    expect(SignalKind.WAITING_REQUESTS, "mix", 5),
    expect(SignalKind.WAITING_REQUESTS, "nobody", None),  # no series: no data, never zero
    # KV occupancy: averaged over pods (and data-parallel ranks), whatever the engine
    expect(SignalKind.KV_CACHE_USAGE, "v", 0.5),
    expect(SignalKind.KV_CACHE_USAGE, "s", 0.375),
    expect(SignalKind.KV_CACHE_USAGE, "dp", 0.5),
    expect(SignalKind.KV_CACHE_USAGE, "mix", 0.375),
    expect(SignalKind.KV_CACHE_USAGE, "nobody", None),
    expect(
        SignalKind.KV_CACHE_USAGE, "mp", 0.6
    ),  # the recording process's value, not the mean with the zeros
    # queued tokens: waiting x mean prompt (800 tokens) of either engine's finished requests
    expect(SignalKind.QUEUED_TOKENS, "v", 4 * 800),
    expect(SignalKind.QUEUED_TOKENS, "s", 5 * 800),
    expect(SignalKind.QUEUED_TOKENS, "mix", 5 * 800),
    expect(SignalKind.QUEUED_TOKENS, "nobody", None),
    # the vLLM cache sizes the controller asks for first, one series per distinct size
    expect_sizes("v", [("1000", "16"), ("500", "16")]),
    expect_sizes("mix", [("1000", "16")]),
    expect_sizes("s", []),
    expect_sizes("hy", [("1000", "16"), ("1000", "16", "50000"), ("0", "16", "None")]),
    # token load: queued tokens + the tokens held. vLLM's occupancy times each engine's own cache size
    # (0.75 x 16,000 + 0.25 x 8,000), SGLang's used tokens (per dp rank, summed), both in a mixed target
    expect(SignalKind.TOKEN_LOAD, "v", 4 * 800 + 12000 + 2000, SIZES),
    expect(SignalKind.TOKEN_LOAD, "s", 5 * 800 + 6000, SIZES),
    expect(SignalKind.TOKEN_LOAD, "s", 5 * 800 + 6000),
    expect(SignalKind.TOKEN_LOAD, "dp", 7 * 800 + 4000),
    expect(SignalKind.TOKEN_LOAD, "mix", 5 * 800 + 0.5 * 16000 + 2000, SIZES),
    # each engine by its own size, the stated one where stated, none counted twice: 0.5 x 16,000 + 0.2 x 50,000
    expect(SignalKind.TOKEN_LOAD, "hy", 2 * 800 + 0.5 * 16000 + 0.2 * 50000, HYBRID_ROLLOUT_SIZES),
    # one term per process would be a many-to-one join, which PromQL refuses: the process copies are reduced first
    expect(SignalKind.TOKEN_LOAD, "mp", 2 * 800 + 0.6 * 16000, SIZES),
    # with no size known, a target with a vLLM engine estimates what every running sequence holds:
    # running x (prompt + output / 2) = running x 900
    expect(SignalKind.TOKEN_LOAD, "v", 4 * 800 + 8 * 900),
    expect(SignalKind.TOKEN_LOAD, "mix", 5 * 800 + 8 * 900),
    expect(SignalKind.TOKEN_LOAD, "nobody", None),
    expect(SignalKind.TOKEN_LOAD, "nobody", None, SIZES),
    # TTFT p95 interpolated in each engine's own second bucket; an idle SGLang target reads 0
    expect(SignalKind.TTFT_P95, "v", 0.1 + 0.4 * 0.95),
    expect(SignalKind.TTFT_P95, "s", 0.2 + 0.2 * 0.95),
    expect(SignalKind.TTFT_P95, "idle", 0),
    expect(SignalKind.TTFT_P95, "nobody", None),
]


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="no promtool on PATH (Debian package prometheus)"
)
def test_default_queries_evaluate_to_the_right_numbers_for_both_engines(tmp_path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": INPUT, "promql_expr_test": CASES}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
