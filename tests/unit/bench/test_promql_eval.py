"""bench/promql_eval.py: the bench's PromQL engine against the Prometheus docs and against Prometheus itself.

Worked examples come from the Prometheus documentation (https://prometheus.io/docs/prometheus/latest/querying/):
"functions.md" -- rate(): "breaks in monotonicity (such as counter resets due to target restarts) are
automatically adjusted for", extrapolation to the ends of the range; histogram_quantile(): linear interpolation
inside a bucket, "the lower limit of the lowest bucket is assumed to be 0 if the upper bound of that bucket is
greater than 0", a quantile in the highest bucket gives "the upper bound of the second highest bucket", NaN for
no observations; label_replace(); "basics.md" -- staleness and the 5-minute lookback; "operators.md" -- vector
matching, `on()`, `or`/`and`, precedence.

The cross-check runs the real PromQL engine through ``promtool test rules`` (Prometheus' rule unit tests, which
evaluate instant queries on series given sample by sample) on the autoscaler's shipped default queries, and
compares every value with this engine's.
"""

import importlib.util
import math
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("promql_eval", ROOT / "bench" / "promql_eval.py")
pe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = pe
_spec.loader.exec_module(pe)

from tokenyard.autoscaler.policy import SignalKind  # noqa: E402
from tokenyard.autoscaler.prometheus import (  # noqa: E402
    KVCacheSize,
    kv_cache_sizes_query,
    parse_query_response,
    signal_query,
)

STEP_S = 15.0


def _store(series: dict[str, list[float | None | str]]) -> pe.SeriesStore:
    """Series in promtool's notation: one value per 15 s step; None is no sample, "stale" a staleness marker."""
    store = pe.SeriesStore()
    for text, values in series.items():
        labels = _parse_labels(text)
        for i, value in enumerate(values):
            if value == "stale":
                store.mark_stale(labels, i * STEP_S)
            elif value is not None:
                store.add(labels, i * STEP_S, value)
    return store


def _parse_labels(text: str) -> pe.Labels:
    name, _, rest = text.partition("{")
    pairs = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
    if name:
        pairs["__name__"] = name
    return pe.labels_of(pairs)


def _value(query: str, store, t: float):
    result = pe.Query(query).evaluate(store, t)
    return (
        result.value
        if isinstance(result, pe.Scalar)
        else {dict(e.labels).get("pod", ""): e.value for e in result}
    )


# ---------------------------------------------------------------------------------------------- the docs
def test_rate_of_a_steady_counter_is_its_slope():
    # 10 per 15 s scrape, samples covering the whole minute: 10/15 per second.
    store = _store({'c_total{pod="a"}': [10.0 * i for i in range(21)]})
    assert _value("rate(c_total[1m])", store, 120.0) == {"a": pytest.approx(10 / 15)}


def test_rate_adjusts_for_a_counter_reset():
    # functions.md: a reset (the target restarted) is read as the counter starting again from 0.
    store = _store({'c_total{pod="a"}': [100, 110, 120, 5, 15]})
    # Samples 0..60 s in [0, 60]: increase 20 + 5 + 10 = 35 over exactly the range.
    assert _value("rate(c_total[1m])", store, 60.0) == {"a": pytest.approx(35 / 60)}


def test_rate_extrapolates_by_half_an_interval_where_the_series_starts_inside_the_range():
    # Series starts at 60 s (two samples: 60 s, 75 s) and the range is [15 s, 75 s]: the start is 45 s away,
    # more than 1.1 x the 15 s interval, so it extrapolates by 7.5 s there. (The counter's zero point, value 60
    # at a slope of 2/s, is 30 s back: further, so it does not clamp.)
    store = _store({'c_total{pod="a"}': [None, None, None, None, 60, 90]})
    assert _value("rate(c_total[1m])", store, 75.0) == {"a": pytest.approx(30 * (15 + 7.5) / 15 / 60)}


def test_rate_never_extrapolates_below_zero():
    # First sample 5 after a rise of 30 over 15 s: the zero point is 2.5 s before it, closer than the range's
    # start (15 s away, within the threshold), so the extrapolation stops there.
    store = _store({'c_total{pod="a"}': [None, 5, 35]})
    assert _value("rate(c_total[30s])", store, 30.0) == {"a": pytest.approx(30 * (15 + 2.5) / 15 / 30)}


def test_rate_needs_two_samples():
    store = _store({'c_total{pod="a"}': [None, None, None, 7]})
    assert _value("rate(c_total[1m])", store, 45.0) == {}


def test_histogram_quantile_interpolates_inside_the_bucket():
    buckets = [(0.1, 50), (0.5, 90), (1.0, 100), (math.inf, 100)]
    assert pe.bucket_quantile(0.95, buckets) == pytest.approx(0.5 + 0.5 * 5 / 10)
    # The lowest bucket starts at 0 when its upper bound is above 0.
    assert pe.bucket_quantile(0.3, buckets) == pytest.approx(0.1 * 30 / 50)


def test_histogram_quantile_in_the_highest_bucket_gives_the_second_highest_bound():
    assert pe.bucket_quantile(0.95, [(0.5, 50), (1.0, 90), (math.inf, 100)]) == 1.0


def test_histogram_quantile_without_observations_or_without_inf_bucket_is_nan():
    assert math.isnan(pe.bucket_quantile(0.95, [(1.0, 0), (math.inf, 0)]))
    assert math.isnan(pe.bucket_quantile(0.95, [(1.0, 3), (2.0, 4)]))


def test_a_stale_series_disappears_and_an_old_one_leaves_the_lookback():
    store = _store({'g{pod="a"}': [1, 2, "stale"], 'g{pod="b"}': [3]})
    assert _value("g", store, 20.0) == {"a": 2.0, "b": 3.0}
    assert _value("g", store, 31.0) == {"b": 3.0}  # a's staleness marker at 30 s hides it
    assert _value("g", store, 300.0) == {"b": 3.0}  # b's sample at 0 s is exactly 5 minutes old: still seen
    assert _value("g", store, 300.5) == {}


def test_or_keeps_the_left_series_and_adds_unmatched_right_ones():
    store = _store({'a{pod="x"}': [1], 'b{pod="x"}': [2], 'b{pod="y"}': [3]})
    assert _value("a or b", store, 0.0) == {"x": 1.0, "y": 3.0}
    assert _value("sum(a or b)", store, 0.0) == {"": 4.0}


def test_label_replace_adds_a_label_from_an_empty_source():
    store = _store({'a{pod="x"}': [1]})
    (element,) = pe.Query('label_replace(a, "engine_kind", "vllm", "", "")').evaluate(store, 0.0)
    assert dict(element.labels)["engine_kind"] == "vllm"


def test_precedence_multiplication_before_addition_and_or_last():
    store = _store({'a{pod="x"}': [2]})
    assert _value("1 + 2 * 3", store, 0.0) == 7.0
    assert _value("sum(a) + sum(a) * 3 or sum(a)", store, 0.0) == {"": 8.0}


def test_unsupported_constructs_are_refused_by_name():
    with pytest.raises(pe.PromQLError, match="increase"):
        pe.Query("increase(a[1m])")
    with pytest.raises(pe.PromQLError, match="group_left"):
        pe.Query("a * on(pod) group_left b")


def test_a_nan_quantile_reads_as_no_value_through_the_shipped_parser():
    store = _store({'h_bucket{le="1"}': [0, 0, 0], 'h_bucket{le="+Inf"}': [0, 0, 0]})
    query = pe.Query("histogram_quantile(0.95, sum by (le) (rate(h_bucket[1m])))")
    reading = parse_query_response(200, query.api_body(store, 30.0), query.text)
    assert reading.value is None and "nan" in reading.problem


# ---------------------------------------------------------------------------------------------- Prometheus
TTFT_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, "+Inf")


def _shipped_series(rng: random.Random, steps: int) -> dict[str, list]:
    """vLLM pods of target m (one joins late, one is deleted), an SGLang pod with two TP ranks, and a pod of
    another target that must not count: the shipped queries' every branch."""
    sel = 'namespace="ns",model_deployment="m"'
    series: dict[str, list] = {}

    def counter(start: int, stop: int | None, step_mean: float) -> list:
        values, total = [], 0.0
        for i in range(steps):
            if i < start:
                values.append(None)
            elif stop is not None and i >= stop:
                values.append("stale" if i == stop else None)
            else:
                total += round(rng.uniform(0, 2 * step_mean), 1)
                values.append(total)
        return values

    def gauge(start: int, stop: int | None, top: float) -> list:
        return [
            None
            if i < start or (stop is not None and i > stop)
            else ("stale" if i == stop else round(rng.uniform(0, top), 2))
            for i in range(steps)
        ]

    pods = {"a": (0, None), "b": (9, None), "c": (0, 22)}
    for pod, (start, stop) in pods.items():
        labels = f'{sel},pod="{pod}",instance="{pod}:8000",engine="0"'
        blocks = 500 if pod == "c" else 1000  # a rollout to a model with a smaller cache
        series[f'vllm:cache_config_info{{{labels},block_size="16",num_gpu_blocks="{blocks}"}}'] = [
            None if i < start or (stop is not None and i > stop) else ("stale" if i == stop else 1.0)
            for i in range(steps)
        ]
        series[f"vllm:num_requests_waiting{{{labels}}}"] = gauge(start, stop, 12)
        series[f"vllm:num_requests_running{{{labels}}}"] = gauge(start, stop, 40)
        series[f"vllm:kv_cache_usage_perc{{{labels}}}"] = gauge(start, stop, 1)
        count = counter(start, stop, 3)
        series[f"vllm:request_prompt_tokens_count{{{labels}}}"] = count
        series[f"vllm:request_prompt_tokens_sum{{{labels}}}"] = [
            v * 900 if isinstance(v, float) else v for v in count
        ]
        series[f"vllm:request_generation_tokens_count{{{labels}}}"] = count
        series[f"vllm:request_generation_tokens_sum{{{labels}}}"] = counter(start, stop, 1500)
        cumulative = [0.0] * len(TTFT_BUCKETS)
        bucket_rows = [[] for _ in TTFT_BUCKETS]
        for i in range(steps):
            if i < start or (stop is not None and i > stop):
                for row in bucket_rows:
                    row.append(None)
                continue
            if stop is not None and i == stop:
                for row in bucket_rows:
                    row.append("stale")
                continue
            for _ in range(rng.randrange(0, 6)):
                ttft = rng.expovariate(1.2)
                for b, bound in enumerate(TTFT_BUCKETS):
                    if bound == "+Inf" or ttft <= bound:
                        cumulative[b] += 1
            for b, row in enumerate(bucket_rows):
                row.append(cumulative[b])
        for bound, row in zip(TTFT_BUCKETS, bucket_rows, strict=True):
            series[f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{bound}"}}'] = row
        series[f"vllm:time_to_first_token_seconds_count{{{labels}}}"] = bucket_rows[-1]
    for rank in ("0", "1"):  # two TP ranks of one SGLang scheduler report the same state
        labels = f'{sel},pod="d",tp_rank="{rank}",priority=""'
        rng_state = rng.getstate()
        series[f"sglang:num_queue_reqs{{{labels}}}"] = gauge(4, None, 8)
        series[f"sglang:num_running_reqs{{{labels}}}"] = gauge(4, None, 30)
        series[f"sglang:token_usage{{{labels}}}"] = gauge(4, None, 1)
        series[f"sglang:num_used_tokens{{{labels}}}"] = gauge(4, None, 50000)
        if rank == "0":
            rng.setstate(rng_state)
    d = f'{sel},pod="d"'
    requests = counter(4, None, 2)
    series[f"sglang:num_requests_total{{{d}}}"] = requests
    series[f"sglang:prompt_tokens_total{{{d}}}"] = [v * 2000 if isinstance(v, float) else v for v in requests]
    series[f"sglang:generation_tokens_total{{{d}}}"] = counter(4, None, 800)
    other = 'namespace="ns",model_deployment="other",pod="z"'
    series[f"vllm:num_requests_waiting{{{other}}}"] = gauge(0, None, 100)
    series[f"vllm:num_requests_running{{{other}}}"] = gauge(0, None, 100)
    return series


def _promtool_values(series: dict[str, list], cases: list[tuple[str, float]], tmp_path: Path) -> list[dict]:
    """What Prometheus' engine gives for each (query, time): promtool is asked for an impossible value and
    prints what it got."""

    def notation(values):
        return " ".join("_" if v is None else ("stale" if v == "stale" else repr(float(v))) for v in values)

    lines = ["evaluation_interval: 1m", "tests:", "  - interval: 15s", "    input_series:"]
    for name, values in series.items():
        lines += [f"      - series: '{name}'", f"        values: '{notation(values)}'"]
    lines.append("    promql_expr_test:")
    for query, t in cases:
        lines += [
            f"      - expr: '{query.replace(chr(39), chr(39) * 2)}'",
            f"        eval_time: {round(t * 1000)}ms",
            "        exp_samples:",
            "          - labels: '{impossible=\"1\"}'",
            "            value: -123456789",
        ]
    path = tmp_path / "cases.yml"
    path.write_text("\n".join(lines) + "\n")
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    got = re.findall(r"^\s+got: (.*)$", run.stdout + run.stderr, re.MULTILINE)
    assert len(got) == len(cases), run.stdout + run.stderr
    results = []
    for line in got:
        samples = {} if line.strip() == "nil" else dict(re.findall(r"(\{[^}]*\}) (\S+?)(?:,|$)", line))
        results.append({labels: float(value) for labels, value in samples.items()})
    return results


def _ours(query: str, store, t: float) -> dict:
    result = pe.Query(query).evaluate(store, t)
    if isinstance(result, pe.Scalar):
        return {"{}": result.value}
    return {"{" + ", ".join(f'{k}="{v}"' for k, v in e.labels) + "}": e.value for e in result}


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not on PATH"
)
def test_the_shipped_queries_give_what_prometheus_gives(tmp_path):
    rng = random.Random(15)
    steps = 40
    series = _shipped_series(rng, steps)
    # A counter whose zero point lies inside the extrapolation threshold (Prometheus 2.x clamps to it before
    # comparing with the threshold; 3.x compares first).
    series['young_total{pod="q"}'] = [None] * 4 + [30, 60] + [None] * (steps - 6)
    store = _store(series)
    queries = [signal_query(kind, "ns", "m") for kind in SignalKind if kind is not SignalKind.PROMQL]
    # The token load as the controller writes it once it has read the engines' cache sizes.
    sizes = (KVCacheSize.of_blocks(500, 16), KVCacheSize.of_blocks(1000, 16))
    queries += [
        kv_cache_sizes_query("ns", "m"),
        signal_query(SignalKind.TOKEN_LOAD, "ns", "m", kv_sizes=sizes),
    ]
    # The pieces too, so that a disagreement points at its function.
    queries += [
        'rate(vllm:request_prompt_tokens_sum{namespace="ns",model_deployment="m"}[5m])',
        'histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{namespace="ns"}[1m])))',
        'max without (tp_rank) (sglang:num_queue_reqs{priority="",namespace="ns"})',
    ]
    # Times on and between scrapes, before and after pod b joins and pod c goes, past the end of the series.
    times = [37.0, 60.0, 95.0, 150.0, 247.5, 330.0, 340.0, 412.0, 585.0, 600.0, 700.0]
    cases = [(q, t) for q in queries for t in times] + [("rate(young_total[1m])", 75.0)]
    expected = _promtool_values(series, cases, tmp_path)
    checked = 0
    for (query, t), prometheus in zip(cases, expected, strict=True):
        ours = _ours(query, store, t)
        assert set(ours) == set(prometheus), f"{query} at {t}s: series {sorted(ours)} vs {sorted(prometheus)}"
        for labels, value in prometheus.items():
            if math.isnan(value):
                assert math.isnan(ours[labels]), f"{query} at {t}s"
            else:
                assert ours[labels] == pytest.approx(value, rel=1e-9, abs=1e-9), f"{query} at {t}s {labels}"
            checked += 1
    assert checked > len(cases)  # most cases have a value to compare (not all empty)
