"""The canary adapter's pure parts: the PromQL it sends, and how it turns the answers into the analysis' inputs."""

import asyncio
import random

import pytest
from tokenyard.core.prometheus import (
    MatrixReading,
    Series,
    VectorReading,
    parse_matrix_response,
    parse_vector_response,
)
from tokenyard.core.types import AnalysisMetric, AnalysisMetricKind, ModelDeploymentSpec
from tokenyard.operator.analysis import AnalysisDecision, AnalysisResult, PairedCounts
from tokenyard.operator.canary import (
    HISTORY_SECONDS,
    PrometheusAnalysis,
    QueryScope,
    RangeGrid,
    Timeline,
    inter_token_latency_queries,
    interval_increases,
    mean_sample,
    metrics_for_step,
    paired_counts,
    proportion_queries,
    query_problems,
    shadow_pair_queries,
    shadow_request_queries,
    split_intervals,
    substitute,
)
from tokenyard.operator.rollout import AnalysisStep, Observations, RolloutState, Strategy, start_rollout
from tokenyard.operator.rollout import step as rollout_step

SCOPE = QueryScope("llama", "team-a", "300s")
SELECTOR = 'model="llama",namespace=~"team-a|"'


# --- queries ---------------------------------------------------------------------------------------------


def test_queries_filter_by_namespace_and_still_match_a_router_without_the_label():
    total, bad = proportion_queries(AnalysisMetricKind.ERROR_RATIO, None, SCOPE)
    assert total == f"sum by (revision) (increase(tokenyard_router_requests_total{{{SELECTOR}}}[300s]))"
    assert bad == f"sum by (revision) (increase(tokenyard_router_errors_total{{{SELECTOR}}}[300s]))"
    for query in (*shadow_request_queries(SCOPE), *inter_token_latency_queries(SCOPE)):
        assert SELECTOR in query and "[300s]" in query


def test_ttft_share_over_the_slo_uses_the_bucket_at_or_below_it():
    total, bad = proportion_queries(AnalysisMetricKind.TTFT_OVER_SLO, 0.3, SCOPE)
    assert "tokenyard_router_time_to_first_token_seconds_count" in total
    fast = f'tokenyard_router_time_to_first_token_seconds_bucket{{{SELECTOR},le="0.25"}}'
    assert bad == f"({total}) - (sum by (revision) (increase({fast}[300s])))"


def test_label_values_are_escaped():
    scope = QueryScope('we"ird\\model', "ns", "60s")
    assert 'model="we\\"ird\\\\model"' in scope.selector


def test_inter_token_latency_queries_read_the_histogram_per_revision():
    count, total, buckets = inter_token_latency_queries(SCOPE)
    assert count.startswith("sum by (revision) (increase(tokenyard_router_inter_token_latency_seconds_count{")
    assert "tokenyard_router_inter_token_latency_seconds_sum{" in total
    assert buckets.startswith(
        "sum by (revision, le) (increase(tokenyard_router_inter_token_latency_seconds_bucket{"
    )


def test_shadow_pair_queries_select_the_shadow_revision():
    outcomes, matches = shadow_pair_queries(SCOPE, "rev-b")
    assert outcomes == (
        f'sum by (outcome) (increase(tokenyard_router_shadow_pairs_total{{{SELECTOR},revision="rev-b"}}[300s]))'
    )
    assert matches == (
        "sum by (match) (increase("
        f'tokenyard_router_shadow_output_match_total{{{SELECTOR},revision="rev-b"}}[300s]))'
    )


def test_promql_metrics_substitute_their_names_and_reject_unknown_ones():
    values = {"revision": "rev-b", "window": "300s", "model": "m", "namespace": "ns"}
    query = 'sum(increase(my_bad{rev="$revision",ns="$namespace"}[$window]))'
    assert substitute(query, values) == 'sum(increase(my_bad{rev="rev-b",ns="ns"}[300s]))'
    with pytest.raises(ValueError, match=r"unknown \$revsion"):
        substitute('x{r="$revsion"}', values)


# --- answers into inputs ---------------------------------------------------------------------------------


def test_pair_outcomes_map_onto_the_paired_counts():
    outcomes = {"both_ok": 950.0, "shadow_only_error": 30.0, "primary_only_error": 5.0, "both_error": 15.0}
    counts = paired_counts(outcomes, {"true": 700.0, "false": 40.0})
    assert counts == PairedCounts(
        pairs=1000.0,
        canary_only_failures=30.0,
        stable_only_failures=5.0,
        both_succeeded=740.0,
        outputs_differ=40.0,
    )
    # no greedy pairs compared (sampled traffic): no output agreement to test; a missing outcome is zero
    assert paired_counts({"both_ok": 10.0}, {}) == PairedCounts(10.0, 0.0, 0.0, None, None)


BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def histogram(values):
    return {b: float(sum(v <= b for v in values)) for b in BOUNDS}


@pytest.mark.parametrize("sigma", [0.3, 0.5, 0.8])
def test_histogram_variance_errs_on_the_large_side_within_the_bucket_resolution(sigma):
    # inter-token latencies around 30 ms, over the coarse buckets 25/50/100 ms: a variance from buckets
    # cannot be exact; too small would roll back by chance, too large only slows detection
    rng = random.Random(7)
    values = [rng.lognormvariate(-3.5, sigma) for _ in range(5_000)]
    sample = mean_sample(len(values), sum(values), histogram(values))
    mean = sum(values) / len(values)
    true_variance = sum((v - mean) ** 2 for v in values) / len(values)
    assert sample.mean == pytest.approx(mean)
    assert true_variance <= sample.variance <= 2.5 * true_variance


def test_histogram_variance_counts_the_observations_above_the_last_bound():
    values = [0.02] * 90 + [3.0] * 10  # a tenth of the tokens stalled for 3 s, beyond the last bucket
    sample = mean_sample(100, sum(values), histogram(values))
    mean = sum(values) / 100
    true_variance = sum((v - mean) ** 2 for v in values) / 100
    assert sample.variance == pytest.approx(true_variance, rel=0.05)


def test_a_histogram_with_no_observations_or_no_buckets_is_not_a_sample():
    assert mean_sample(None, None, {}).mean is None
    assert mean_sample(0.0, 0.0, {}).variance is None
    no_buckets = mean_sample(10.0, 0.2, {})
    assert no_buckets.mean == pytest.approx(0.02) and no_buckets.variance is None


# --- when the analysis looks -----------------------------------------------------------------------------


class CountingAnalysis(PrometheusAnalysis):
    def __init__(self):
        super().__init__("http://127.0.0.1:1")
        self.looks = []

    async def judge(self, spec, model, namespace, stable, canary, since, now, final, shadow):
        self.looks.append((namespace, now, final))
        return AnalysisResult(AnalysisDecision.PENDING, f"look at {now:g}", ())


def test_observe_looks_every_interval_and_the_last_verdict_stands_in_between():
    plan = Strategy((AnalysisStep(120),), replicas=2, analysis_interval_s=30)
    analysis = CountingAnalysis()
    state = rollout_step(plan, start_rollout(RolloutState("a"), "b", 0), observe_nothing(), 0).state

    async def reconcile(state, now):
        seen = await analysis.observe(None, "m", "ns", plan, state, now)
        observed = observe_nothing(seen.decision, seen.reason, seen.looked_at)
        return rollout_step(plan, state, observed, now).state, seen

    async def run(state):
        seen_at = {}
        for now in range(10, 131, 10):  # reconciles every 10 s through the end of the 120 s window
            state, seen = await reconcile(state, now)
            seen_at[now] = seen
        return seen_at

    seen_at = asyncio.run(run(state))
    assert [now for _, now, _ in analysis.looks] == [10, 40, 70, 100, 120]
    assert analysis.looks[-1] == ("ns", 120, True) and not any(final for _, _, final in analysis.looks[:-1])
    assert seen_at[20].decision is AnalysisDecision.PENDING and seen_at[20].reason == "look at 10"
    assert seen_at[20].looked_at is None and seen_at[20].status is None  # carried, not a new look
    assert seen_at[40].status["reason"] == "look at 40" and seen_at[40].status["time"].endswith("Z")


def observe_nothing(decision=None, reason="", looked_at=None):
    return Observations({"a": 2, "b": 1}, decision, reason, analysis_at=looked_at)


def test_no_prometheus_is_inconclusive():
    result = asyncio.run(PrometheusAnalysis(None).judge(None, "m", "ns", "a", "b", 0, 60, False, False))
    assert result.decision is AnalysisDecision.INCONCLUSIVE and "no Prometheus" in result.reason


class CannedPrometheus(PrometheusAnalysis):
    """Answers each query with the samples of the first metric name it mentions."""

    def __init__(self, answers):
        super().__init__("http://127.0.0.1:1")
        self.answers, self.asked = answers, []

    async def _query(self, client, query):
        self.asked.append(query)
        for metric, samples in self.answers.items():
            if metric + "{" in query:
                return answer(query, [{"metric": m, "value": [0, str(v)]} for m, v in samples])
        return answer(query, [])


def answer(query, result, result_type="vector"):
    """The shared client's reading of a successful /api/v1/query response."""
    body = {"status": "success", "data": {"resultType": result_type, "result": result}}
    return parse_vector_response(200, body, query)


def measure(prometheus, kind=AnalysisMetricKind.ERROR_RATIO, shadow=True):
    metric = AnalysisMetric(name="errors", kind=kind)
    return asyncio.run(prometheus._measure(None, metric, SCOPE, "rev-a", "rev-b", shadow))


def test_a_shadow_step_compares_the_pairs_the_router_reports():
    prometheus = CannedPrometheus(
        {
            "tokenyard_router_shadow_pairs_total": [
                ({"outcome": "both_ok"}, 480),
                ({"outcome": "shadow_only_error"}, 12),
                ({"outcome": "primary_only_error"}, 3),
                ({"outcome": "both_error"}, 5),
            ],
            "tokenyard_router_shadow_output_match_total": [({"match": "true"}, 300), ({"match": "false"}, 6)],
        }
    )
    measured = measure(prometheus)
    assert measured.paired == PairedCounts(500, 12, 3, both_succeeded=306, outputs_differ=6)
    assert all('revision="rev-b"' in q for q in prometheus.asked)


def test_a_shadow_step_falls_back_to_unpaired_counts_with_an_older_router():
    prometheus = CannedPrometheus(
        {
            "tokenyard_router_requests_total": [({"revision": "rev-a"}, 1000)],
            "tokenyard_router_errors_total": [({"revision": "rev-a"}, 10)],
            "tokenyard_router_shadow_requests_total": [({"revision": "rev-b"}, 200)],
        }
    )
    measured = measure(prometheus)
    assert measured.paired is None
    assert (measured.canary.requests, measured.stable.requests, measured.stable.events) == (200, 1000, 10)


def test_a_promql_metric_runs_its_two_queries_per_revision():
    class PerRevision(PrometheusAnalysis):
        def __init__(self):
            super().__init__("http://127.0.0.1:1")
            self.asked = []

        async def _query(self, client, query):
            self.asked.append(query)
            requests = {"rev-a": 1000, "rev-b": 250}["rev-a" if '"rev-a"' in query else "rev-b"]
            value = requests if "my_requests" in query else requests // 50
            # two series (e.g. two routers): their sum is the revision's count
            return answer(query, [{"metric": {}, "value": [0, str(value / 2)]}] * 2)

    prometheus = PerRevision()
    metric = AnalysisMetric(
        name="custom",
        kind=AnalysisMetricKind.PROMQL,
        bad_query='sum(increase(my_errors{rev="$revision",ns="$namespace"}[$window]))',
        total_query='sum(increase(my_requests{rev="$revision"}[$window]))',
    )
    measured = asyncio.run(prometheus._measure(None, metric, SCOPE, "rev-a", "rev-b", False))
    assert (measured.canary.requests, measured.canary.events) == (250, 5)
    assert (measured.stable.requests, measured.stable.events) == (1000, 20)
    assert 'sum(increase(my_errors{rev="rev-b",ns="team-a"}[300s]))' in prometheus.asked


def test_a_shadow_step_leaves_out_the_latencies_it_cannot_measure():
    ttft = AnalysisMetric(name="ttft", kind=AnalysisMetricKind.TTFT_OVER_SLO, slo_seconds=1.0)
    itl = AnalysisMetric(name="itl", kind=AnalysisMetricKind.INTER_TOKEN_LATENCY)
    errors = AnalysisMetric(name="errs", kind=AnalysisMetricKind.ERROR_RATIO)
    assert metrics_for_step([ttft, itl, errors], shadow=False) == ([ttft, itl, errors], [])
    assert metrics_for_step([ttft, itl, errors], shadow=True) == ([errors], ["ttft", "itl"])
    kept, skipped = metrics_for_step([ttft], shadow=True)  # nothing left: the copies' errors are judged
    assert [m.kind for m in kept] == [AnalysisMetricKind.ERROR_RATIO] and skipped == ["ttft"]


def test_a_promql_query_with_an_unknown_name_is_reported_as_the_users_mistake():
    metric = AnalysisMetric(
        name="custom", kind=AnalysisMetricKind.PROMQL, bad_query='sum(x{rev="$rev"})', total_query="sum(y)"
    )
    assert query_problems([metric]) == [
        "analysis metric custom: unknown $rev in the analysis query 'sum(x{rev=\"$rev\"})' "
        "(known: model, namespace, revision, window)"
    ]
    spec = ModelDeploymentSpec.parse(
        {
            "model": {"weights": {"uri": "hf://org/m"}},
            "engine": {"image": "vllm/vllm-openai:v0.13.0"},
            "rollout": {"analysis": {"metrics": [metric.dump()]}},
        }
    )
    prometheus = CannedPrometheus({})
    result = asyncio.run(prometheus.judge(spec, "m", "ns", "rev-a", "rev-b", 0, 60, False, False))
    assert result.decision is AnalysisDecision.INCONCLUSIVE
    assert "analysis metric custom: unknown $rev" in result.reason and "unreachable" not in result.reason
    assert prometheus.asked == []  # nothing was sent


# --- failed and empty queries, through the shared client's readings ---------------------------------------


def default_spec():
    return ModelDeploymentSpec.parse(
        {"model": {"weights": {"uri": "hf://org/m"}}, "engine": {"image": "vllm/vllm-openai:v0.13.0"}}
    )


class FakeClient:
    """Stands in for `tokenyard.core.prometheus.PrometheusClient`: one reading for every query."""

    def __init__(self, reading):
        self.reading, self.asked, self.closed = reading, [], False

    async def query_vector(self, query, at=None):
        self.asked.append(query)
        return self.reading

    async def query_range(self, query, start, end, step):
        self.asked.append(query)
        return MatrixReading(())

    async def close(self):
        self.closed = True


class ReadingAnalysis(PrometheusAnalysis):
    def __init__(self, reading):
        super().__init__("http://prometheus:9090")
        self.fake = FakeClient(reading)

    def client(self):
        return self.fake


def judge(analysis, final=False):
    return asyncio.run(analysis.judge(default_spec(), "m", "ns", "rev-a", "rev-b", 0, 60, final, False))


@pytest.mark.parametrize("final", [False, True])
def test_a_failed_query_makes_the_analysis_inconclusive(final):
    analysis = ReadingAnalysis(VectorReading(None, "Prometheus at http://prometheus:9090 unreachable: boom"))
    result = judge(analysis, final)
    assert result.decision is AnalysisDecision.INCONCLUSIVE, result
    assert "Prometheus" in result.reason and "boom" in result.reason
    assert len(analysis.fake.asked) == 1 and analysis.fake.closed  # the first failure stops the look


@pytest.mark.parametrize("final", [False, True])
def test_an_empty_query_makes_the_analysis_inconclusive_not_a_zero_count(final):
    analysis = ReadingAnalysis(answer("q", []))
    assert analysis.fake.reading.ok and analysis.fake.reading.empty
    result = judge(analysis, final)
    assert result.decision is AnalysisDecision.INCONCLUSIVE, result
    (verdict,) = result.metrics
    assert verdict.decision is AnalysisDecision.INCONCLUSIVE


def test_an_error_response_and_a_nan_are_failed_and_empty_readings():
    error = parse_vector_response(
        422, {"status": "error", "errorType": "bad_data", "error": "parse error"}, "q"
    )
    assert not error.ok and "bad_data: parse error" in error.problem
    nan = answer("q", [{"metric": {"revision": "a"}, "value": [0, "NaN"]}])
    assert nan.ok and nan.empty
    scalar = answer("q", [0, "3"], result_type="scalar")
    assert [(dict(s.labels), s.value) for s in scalar.samples] == [({}, 3.0)]


def test_an_unreachable_prometheus_is_inconclusive_through_the_real_client():
    analysis = PrometheusAnalysis("http://127.0.0.1:1", timeout=2.0)
    result = judge(analysis)
    assert result.decision is AnalysisDecision.INCONCLUSIVE and "unreachable" in result.reason, result


# --- counts per interval ---------------------------------------------------------------------------------


def test_a_range_response_keeps_finite_points_and_failures_read_as_failures():
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"revision": "a"}, "values": [[30, "4"], [60, "NaN"], [90, "2"]]}],
        },
    }
    (series,) = parse_matrix_response(200, body, "q").series
    assert dict(series.labels) == {"revision": "a"} and series.points == ((30.0, 4.0), (90.0, 2.0))
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    assert not parse_matrix_response(200, vector, "q").ok
    error = parse_matrix_response(400, {"status": "error", "errorType": "bad_data", "error": "x"}, "q")
    assert not error.ok and "bad_data" in error.problem


def test_the_grid_ends_an_interval_exactly_at_the_window_start_and_reaches_back_an_hour():
    grid = Timeline(since=10_000.0004, now=10_095.0, interval=30.0).grid()
    points = [grid.start + k * grid.step for k in range(grid.points)]
    assert grid.step == 30.0 and points[grid.last_before] == 10_000.0 and grid.end == points[-1]
    assert grid.last_before == HISTORY_SECONDS // 30  # an hour of intervals, plus the point they start from
    assert points[-1] == 10_090.0  # the last whole interval of the window
    # a timeline too long for one range query gets longer intervals rather than a refused query
    long = Timeline(since=0.0, now=86_400.0, interval=1.0).grid()
    assert long.points <= 11_000


def counter(revision, points, **labels):
    return Series({"revision": revision, **labels}, tuple(points))


GRID = RangeGrid(start=0.0, step=30.0, points=5, last_before=2)  # intervals 1, 2 before; 3, 4 inside


def test_each_series_is_differenced_point_to_point_and_summed_per_revision():
    totals = (
        counter("stable", [(0, 1000), (30, 1100), (60, 1180), (90, 1270), (120, 1400)], router="a"),
        # a second router restarted between 60 and 90: its counter fell to 7, all counted since
        counter("stable", [(0, 50), (30, 60), (60, 70), (90, 7), (120, 17)], router="b"),
        # written to the millisecond: still the grid's point
        counter("canary", [(60.0005, 5), (89.9995, 25), (120, 50)]),
    )
    assert interval_increases(totals, "stable", GRID) == {1: 110, 2: 90, 3: 97, 4: 140}
    assert interval_increases(totals, "canary", GRID) == {3: 20, 4: 25}  # a series starts at its first point


def test_bad_requests_per_interval_from_bad_or_from_good_counters():
    totals = (counter("stable", [(0, 0), (30, 100), (60, 200), (90, 200), (120, 300)]),)
    errors = (counter("stable", [(0, 0), (30, 2), (60, 2), (90, 2), (120, 150)]),)
    before, after = split_intervals(totals, errors, "stable", GRID, others_count_good=False)
    # an interval without requests is left out
    assert before == ((100, 2), (100, 0)) and after == ((100, 100),)  # more bad than requests: capped
    fast = (counter("stable", [(0, 0), (30, 90), (60, 190), (90, 190), (120, 250)]),)
    assert split_intervals(totals, fast, "stable", GRID, others_count_good=True) == (
        ((100, 10), (100, 0)),
        ((100, 40),),
    )
    # no series of bad requests at all: none happened
    assert split_intervals(totals, (), "stable", GRID, others_count_good=False)[1] == ((100, 0),)


class RangeRecordingClient(FakeClient):
    """Every instant query reads 600 requests of each revision; range queries are recorded."""

    def __init__(self):
        super().__init__(
            answer("q", [{"metric": {"revision": r}, "value": [0, "600"]} for r in ("rev-a", "rev-b")])
        )
        self.ranges = []

    async def query_range(self, query, start, end, step):
        self.ranges.append((query, start, end, step))
        return MatrixReading(())


def test_the_range_queries_read_raw_counters_over_the_hour_and_the_window():
    analysis = ReadingAnalysis(None)
    analysis.fake = RangeRecordingClient()
    judge(analysis)
    assert len(analysis.fake.ranges) == 2  # requests and errors, per interval, in one query each
    for query, start, end, step in analysis.fake.ranges:
        assert "increase" not in query and "sum" not in query, query  # differenced per series here
        assert step == 30 and end == 60 and (end - start) / step == HISTORY_SECONDS / 30 + 2


class ClumpedServiceClient(FakeClient):
    """A service whose errors come in bursts: in the window, 2,400 requests per revision, the canary's 80 errors
    in two bad intervals and the stable revision's 12 in one; over the hour before, the stable revision had
    a burst of 7 errors (of 120 requests) in 2 of every 10 intervals. Range queries answer raw counters on the asked grid."""

    def __init__(self, clumped_range=True):
        super().__init__(None)
        self.clumped_range = clumped_range

    async def query_vector(self, query, at=None):
        self.asked.append(query)
        values = {"rev-b": 80, "rev-a": 12} if "errors" in query else {"rev-b": 2400, "rev-a": 2400}
        return answer(query, [{"metric": {"revision": r}, "value": [0, str(v)]} for r, v in values.items()])

    async def query_range(self, query, start, end, step):
        if not self.clumped_range:
            return MatrixReading(())
        points = round((end - start) / step) + 1
        since_index = round((0 - start) / step)
        errors = "errors" in query

        def per_interval(revision, k):  # interval k ends at point k
            if k <= since_index:  # the hour before: only the stable revision
                if revision == "rev-b":
                    return None
                return (7 if k % 10 in (0, 1) else 0) if errors else 120
            if not errors:
                return 120
            burst = {"rev-b": {3: 40, 4: 40}, "rev-a": {7: 12}}[revision]
            return burst.get(k - since_index, 0)

        series = []
        for revision in ("rev-a", "rev-b"):
            total, values = 0.0, []
            for k in range(points):
                grew = per_interval(revision, k) if k else 0
                if grew is None:
                    continue
                total += grew
                values.append((start + k * step, total))
            series.append(Series({"revision": revision, "router": "r"}, tuple(values)))
        return MatrixReading(tuple(series))


def test_clumped_errors_read_through_the_range_queries_widen_the_variance():
    def judged(client):
        analysis = ReadingAnalysis(None)
        analysis.fake = client
        return asyncio.run(analysis.judge(default_spec(), "m", "ns", "rev-a", "rev-b", 0, 600, False, False))

    binomial_only = judged(ClumpedServiceClient(clumped_range=False))
    assert binomial_only.decision is AnalysisDecision.FAIL, binomial_only.reason
    widened = judged(ClumpedServiceClient())
    assert widened.decision is not AnalysisDecision.FAIL, widened.reason
    assert "clumps: variance x" in widened.reason, widened.reason
