"""The rollout analysis' measurements, read from Prometheus: the one I/O of a canary step (the adapter fetches
the verdict, `canary_plan.canary_step` takes it as an input).

- `PrometheusAnalysis` measures each revision over the analysis window from the router's metrics (through the
  shared `tokenyard.core.prometheus` client) and asks the sequential test for a verdict. No Prometheus, a
  failed query, or no samples are inconclusive, never a failure: a failed query stops the look, and a revision
  without samples has no count (None), never a zero one.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tokenyard.core.metrics import bucket_at_or_below
from tokenyard.core.prometheus import MatrixReading, PrometheusClient, Series, VectorReading
from tokenyard.core.types import AnalysisMetric, AnalysisMetricKind, ModelDeploymentSpec
from tokenyard.operator.analysis import (
    AnalysisDecision,
    AnalysisResult,
    AnalysisSettings,
    Margin,
    MeanSample,
    MetricInput,
    PairedCounts,
    ProportionCounts,
    evaluate,
)
from tokenyard.operator.canary_plan import AnalysisObservation
from tokenyard.operator.rollout import (
    RolloutState,
    ShadowStep,
    Strategy,
    analysis_look_due,
    analysis_window,
    last_analysis,
)


def _settings(spec: ModelDeploymentSpec) -> AnalysisSettings:
    analysis = spec.rollout.analysis
    return AnalysisSettings(
        alpha=analysis.alpha, margin=Margin(absolute=analysis.margin), min_requests=analysis.min_requests
    )


class QueryFailed(Exception):
    """A query of the analysis failed (the shared client's reading has no samples): the look is inconclusive."""


class PrometheusAnalysis:
    """Counts per revision from the router's metrics in Prometheus, judged by the sequential test."""

    def __init__(self, url: str | None, timeout: float = 5.0):
        self.url = url.rstrip("/") if url else None
        self.timeout = timeout

    def client(self) -> PrometheusClient:
        """A client for one look (its session lives as long as the look, in the reconcile's event loop)."""
        return PrometheusClient(self.url or "", timeout_s=self.timeout)

    async def observe(
        self,
        spec: ModelDeploymentSpec,
        model: str,
        namespace: str,
        strategy: Strategy,
        state: RolloutState,
        now: float,
    ) -> AnalysisObservation:
        """Look when a look is due (``rollout.analysis_look_due``: every ``intervalSeconds``, and at the end
        of the window); in between, the last look's verdict stands."""
        window = analysis_window(strategy, state, now)
        if window is None or not state.canary_revision:
            return AnalysisObservation()
        if not analysis_look_due(strategy, state, now):
            decision, reason = last_analysis(state)
            return AnalysisObservation(decision, reason)
        since, final = window
        result = await self.judge(
            spec,
            model,
            namespace,
            state.stable_revision,
            state.canary_revision,
            since=since,
            now=now,
            final=final,
            shadow=isinstance(strategy.steps[state.step_index], ShadowStep),
        )
        looked = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {**result.to_dict(), "time": looked}
        return AnalysisObservation(result.decision, result.reason, now, status)

    async def judge(
        self,
        spec: ModelDeploymentSpec,
        model: str,
        namespace: str,
        stable: str,
        canary: str,
        since: float,
        now: float,
        final: bool,
        shadow: bool,
    ) -> AnalysisResult:
        if not self.url:
            return AnalysisResult(
                AnalysisDecision.INCONCLUSIVE,
                "no Prometheus configured for the analysis (--prometheus-url)",
                (),
            )
        scope = QueryScope(model, namespace, f"{max(1, math.ceil(now - since))}s")
        timeline = Timeline(since, now, float(spec.rollout.analysis.interval_seconds))
        metrics, skipped = metrics_for_step(spec.rollout.analysis.metrics, shadow)
        problems = query_problems(metrics)
        if problems:
            # The user's query is wrong, not Prometheus: say so, and wait (paused) for a fixed spec.
            return AnalysisResult(AnalysisDecision.INCONCLUSIVE, "; ".join(problems), ())
        inputs = []
        try:
            client = self.client()
        except ValueError as e:  # not an http(s) URL
            return AnalysisResult(AnalysisDecision.INCONCLUSIVE, f"Prometheus for the analysis: {e}", ())
        try:
            for metric in metrics:
                measured = await self._measure(client, metric, scope, stable, canary, shadow)
                if not shadow and metric.kind in SPREAD_KINDS:
                    measured = await self._with_spread(
                        client, measured, metric, scope, timeline, stable, canary
                    )
                inputs.append(measured)
        except QueryFailed as e:
            return AnalysisResult(
                AnalysisDecision.INCONCLUSIVE, f"Prometheus at {self.url} unreachable or failing: {e}", ()
            )
        finally:
            await client.close()
        result = evaluate(inputs, _settings(spec), final=final)
        if skipped:
            note = f"{', '.join(skipped)}: not measured in a shadow step (the router times only what clients see)"
            result = replace(result, reason=f"{result.reason}; {note}")
        return result

    async def _measure(
        self, client, metric: AnalysisMetric, scope: QueryScope, stable, canary, shadow
    ) -> MetricInput:
        name, kind = metric.name, metric.kind
        if kind == AnalysisMetricKind.INTER_TOKEN_LATENCY:
            count, total, buckets = inter_token_latency_queries(scope)
            counts = await self._vector(client, count, "revision")
            sums = await self._vector(client, total, "revision")
            by_bucket = await self._vector(client, buckets, "revision", "le")

            def sample(revision: str) -> MeanSample:
                cumulative = {float(le): v for (r, le), v in by_bucket.items() if r == revision}
                return mean_sample(counts.get(revision), sums.get(revision), cumulative)

            return MetricInput(name, canary=sample(canary), stable=sample(stable))
        if kind == AnalysisMetricKind.PROMQL:
            canary_counts, stable_counts = [
                await self._promql_counts(client, metric, scope, r) for r in (canary, stable)
            ]
            return MetricInput(
                name, canary=canary_counts, stable=stable_counts, label="share of bad requests"
            )
        if shadow and kind == AnalysisMetricKind.ERROR_RATIO:
            # The very same requests answered by both: compare pairs when the router reports them.
            outcomes_query, matches_query = shadow_pair_queries(scope, canary)
            outcomes = await self._vector(client, outcomes_query, "outcome")
            if outcomes:
                matches = await self._vector(client, matches_query, "match")
                return MetricInput(name, paired=paired_counts(outcomes, matches))
        total, bad = proportion_queries(kind, metric.slo_seconds, scope)
        totals, bads = (
            await self._vector(client, total, "revision"),
            await self._vector(client, bad, "revision"),
        )
        if shadow:
            # A shadow step's canary answers only copies: its counts come from the shadow metrics.
            # Dropped copies (no shadow replica available, or too many in flight) were never answered.
            shadow_total, shadow_bad = shadow_request_queries(scope)
            totals[canary] = (await self._vector(client, shadow_total, "revision")).get(canary)
            bads[canary] = (await self._vector(client, shadow_bad, "revision")).get(
                canary, 0.0 if totals[canary] else None
            )
        label = "share over TTFT SLO" if kind == AnalysisMetricKind.TTFT_OVER_SLO else "error ratio"
        return MetricInput(
            name,
            canary=_proportion(totals.get(canary), bads.get(canary)),
            stable=_proportion(totals.get(stable), bads.get(stable)),
            label=label,
        )

    async def _with_spread(
        self,
        client,
        measured: MetricInput,
        metric: AnalysisMetric,
        scope: QueryScope,
        timeline: Timeline,
        stable: str,
        canary: str,
    ) -> MetricInput:
        """The metric's counts split into the analysis' intervals (the window's, per revision, and the stable
        revision's over the hour before it: the history includes any earlier canary steps, when the stable
        revision served most requests as well), so that the test sees whether bad requests come in clumps
        (``analysis.overdispersion``). Two range queries per metric, whatever the number of intervals.

        A failed range query stops the look (inconclusive) like a failed instant query: judging bursty
        failures with the binomial variance would roll back healthy canaries, and a rollout waits out a
        Prometheus outage rather than act on half its data."""
        counted = [measured.canary, measured.stable]
        if not all(isinstance(c, ProportionCounts) and c.requests is not None for c in counted):
            return measured  # nothing to spread: the totals already make the verdict inconclusive
        grid = timeline.grid()
        total, other = counter_selectors(metric.kind, metric.slo_seconds, scope)
        totals = await self._matrix(client, total.selector, grid)
        others = await self._matrix(client, other.selector, grid)
        split = {r: split_intervals(totals, others, r, grid, other.counts_good) for r in (canary, stable)}
        return replace(
            measured,
            canary=replace(measured.canary, intervals=split[canary][1]),
            stable=replace(measured.stable, intervals=split[stable][1]),
            history=split[stable][0],
        )

    async def _matrix(self, client, query: str, grid: RangeGrid) -> tuple[Series, ...]:
        reading: MatrixReading = await client.query_range(query, grid.start, grid.end, grid.step)
        if not reading.ok:
            raise QueryFailed(reading.problem)
        return reading.series

    async def _promql_counts(
        self, client, metric: AnalysisMetric, scope: QueryScope, revision: str
    ) -> ProportionCounts:
        values = {
            "revision": revision,
            "window": scope.window,
            "model": scope.model,
            "namespace": scope.namespace,
        }
        total = await self._number(client, substitute(metric.total_query or "", values))
        bad = await self._number(client, substitute(metric.bad_query or "", values))
        return _proportion(total, bad)

    async def _query(self, client: PrometheusClient, query: str) -> VectorReading:
        return await client.query_vector(query)

    async def _samples(self, client: PrometheusClient, query: str) -> VectorReading:
        """The query's reading through the shared client; a failed one stops the look (`QueryFailed`)."""
        reading = await self._query(client, query)
        if not reading.ok:
            raise QueryFailed(reading.problem)
        return reading

    async def _vector(self, client: PrometheusClient, query: str, *labels: str) -> dict:
        """The finite samples of an instant vector, keyed by the value of ``labels`` (a tuple for several).
        An empty result gives no keys: the caller reads a missing revision as no count (None)."""
        out = {}
        for sample in (await self._samples(client, query)).samples:
            key = tuple(sample.labels.get(label, "") for label in labels)
            out[key if len(labels) > 1 else key[0]] = sample.value
        return out

    async def _number(self, client: PrometheusClient, query: str) -> float | None:
        """One number from a query: a scalar, or the sum of a vector's samples; None when it has none."""
        values = [sample.value for sample in (await self._samples(client, query)).samples]
        return sum(values) if values else None


def _proportion(requests: float | None, events: float | None) -> ProportionCounts:
    if requests is not None and events is None:
        events = 0.0  # no series of bad requests: none happened
    if requests is not None and events is not None:
        # increase() extrapolates each series on its own, so errors can exceed requests by a hair.
        events = min(events, requests)
    return ProportionCounts(requests, events)


# --- how the counts were spread over time (pure) -------------------------------------------------------------

# The proportion metrics whose counts are split into intervals: the router's own series, whose queries the
# operator writes (a user's PromQL metric is judged on its totals only).
SPREAD_KINDS = (AnalysisMetricKind.ERROR_RATIO, AnalysisMetricKind.TTFT_OVER_SLO)
# How far back the stable revision's intervals are read: an hour of 30 s intervals estimates how clumped the
# service's failures are well enough; the window of one step is too short for it.
HISTORY_SECONDS = 3600.0


@dataclass(frozen=True)
class RangeGrid:
    """The points of one range query: ``start + k·step`` for k = 0 .. ``points`` − 1. Interval k (k ≥ 1) runs
    from point k − 1 to point k; intervals 1 .. ``last_before`` end by the window's start, the rest inside it."""

    start: float
    step: float
    points: int
    last_before: int

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step

    def index(self, at: float) -> int:
        """The grid point a returned timestamp stands for (Prometheus writes them rounded to the millisecond)."""
        return round((at - self.start) / self.step)


@dataclass(frozen=True)
class Timeline:
    """The analysis window (``since`` to ``now``) and the interval its looks are spaced by."""

    since: float
    now: float
    interval: float

    def grid(self) -> RangeGrid:
        """The range query's grid: one point exactly on ``since``, an hour of intervals before it and the whole
        intervals of the window after it, plus the point before the first interval (to difference from)."""
        # Prometheus refuses a range query of more than 11,000 points: a longer timeline gets longer intervals.
        step = float(
            max(1, math.ceil(self.interval), math.ceil((HISTORY_SECONDS + self.now - self.since) / 10_000))
        )
        before = max(1, int(HISTORY_SECONDS // step))
        after = max(0, int((self.now - self.since) // step))
        # the millisecond is what the query's start is written to: the grid must be the one Prometheus uses
        since = round(self.since, 3)
        return RangeGrid(
            start=since - before * step, step=step, points=before + after + 1, last_before=before
        )


def interval_increases(series: Sequence[Series], revision: str, grid: RangeGrid) -> dict[int, float]:
    """How much one revision's counters grew over each interval of the grid (by the index of the point that
    ends it), summed over its series (one per router pod and label set).

    Each series is differenced point to point, so the intervals tile the timeline whatever the scrape
    interval: a point of a range query over a raw counter is its last sample at or before the point, and the
    increase between two points is exactly what was counted between those two samples. (``increase()`` over
    a range as long as the step extrapolates each window's first and last samples to its edges instead: with
    a 15 s scrape and 30 s intervals it doubles every count, and with a scrape as long as the step it has
    no two samples to work with.) A drop is a counter reset, read as ``increase()`` reads it: the new value
    was all counted since (what the series counted between the point before and the reset itself is lost,
    at most one interval of one router's counts). A series' first point is where its count starts from."""
    grew: dict[int, float] = {}
    for one in series:
        if one.labels.get("revision", "") != revision:
            continue
        previous: float | None = None
        for at, value in one.points:
            if previous is not None:
                k = grid.index(at)
                grew[k] = grew.get(k, 0.0) + (value - previous if value >= previous else value)
            previous = value
    return grew


def split_intervals(
    totals: Sequence[Series],
    others: Sequence[Series],
    revision: str,
    grid: RangeGrid,
    others_count_good: bool,
) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]:
    """One revision's (requests, bad requests) per interval: those that ended by the window's start (the
    history) and those inside the window. ``others`` are the bad requests' counters, or the good ones' when
    ``others_count_good`` (a histogram's bucket at the SLO: bad = all − good). An interval without requests is
    left out; one without any growth of ``others`` had no bad (or no good) request."""
    requests = interval_increases(totals, revision, grid)
    other = interval_increases(others, revision, grid)
    before, after = [], []
    for k in sorted(requests):
        count = requests[k]
        if count <= 0:
            continue
        bad = count - other.get(k, 0.0) if others_count_good else other.get(k, 0.0)
        pair = (count, min(count, max(0.0, bad)))
        (before if k <= grid.last_before else after).append(pair)
    return tuple(before), tuple(after)


# --- the queries (pure, so that their text is tested) ------------------------------------------------------


@dataclass(frozen=True)
class QueryScope:
    """Whose metrics, over which window: one ModelDeployment's model in its namespace."""

    model: str
    namespace: str
    window: str  # a PromQL range, e.g. "300s"

    @property
    def selector(self) -> str:
        # The router labels its series with the ModelDeployment's namespace; an older router does not, and an
        # absent label matches the empty string, so the alternative keeps both working. Namespaces are DNS
        # labels: no regular-expression metacharacter can occur in one.
        return f'model="{_escape(self.model)}",namespace=~"{self.namespace}|"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _increase(metric: str, scope: QueryScope, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (increase({metric}{{{scope.selector}{extra}}}[{scope.window}]))"


@dataclass(frozen=True)
class CounterSelector:
    """A router counter's raw series (no function applied: ``interval_increases`` differences them)."""

    selector: str
    counts_good: bool = False  # the good requests (a histogram's bucket at the SLO), not the bad ones


def counter_selectors(
    kind: AnalysisMetricKind, slo: float | None, scope: QueryScope
) -> tuple[CounterSelector, CounterSelector]:
    """(all requests, bad or good requests) as raw counters, for the per-interval range queries."""
    if kind == AnalysisMetricKind.ERROR_RATIO:
        return (
            CounterSelector(f"tokenyard_router_requests_total{{{scope.selector}}}"),
            CounterSelector(f"tokenyard_router_errors_total{{{scope.selector}}}"),
        )
    if kind == AnalysisMetricKind.TTFT_OVER_SLO:
        histogram = "tokenyard_router_time_to_first_token_seconds"
        return (
            CounterSelector(f"{histogram}_count{{{scope.selector}}}"),
            CounterSelector(f'{histogram}_bucket{{{scope.selector},le="{_le(slo)}"}}', counts_good=True),
        )
    raise ValueError(f"{kind} is not a proportion metric")


def proportion_queries(kind: AnalysisMetricKind, slo: float | None, scope: QueryScope) -> tuple[str, str]:
    """(all requests, bad requests) per revision over the window for a proportion metric: the increase of the
    counters ``counter_selectors`` names."""
    total_counter, other_counter = counter_selectors(kind, slo, scope)

    def increase(counter: CounterSelector) -> str:
        return f"sum by (revision) (increase({counter.selector}[{scope.window}]))"

    total, other = increase(total_counter), increase(other_counter)
    return (total, f"({total}) - ({other})") if other_counter.counts_good else (total, other)


def shadow_request_queries(scope: QueryScope) -> tuple[str, str]:
    """(answered shadow copies, failed ones) per revision."""
    metric = "tokenyard_router_shadow_requests_total"
    return (
        _increase(metric, scope, "revision", ',outcome=~"ok|error"'),
        _increase(metric, scope, "revision", ',outcome="error"'),
    )


def shadow_pair_queries(scope: QueryScope, canary: str) -> tuple[str, str]:
    """(pairs by outcome, greedy both-succeeded pairs by whether the outputs matched) of the shadow revision."""
    revision = f',revision="{_escape(canary)}"'
    return (
        _increase("tokenyard_router_shadow_pairs_total", scope, "outcome", revision),
        _increase("tokenyard_router_shadow_output_match_total", scope, "match", revision),
    )


def paired_counts(outcomes: Mapping[str, float], matches: Mapping[str, float]) -> PairedCounts:
    """The router's pair outcomes (both_ok, shadow_only_error, primary_only_error, both_error) and output
    matches (greedy pairs where both succeeded) as the paired test's counts. The shadow is the canary."""
    pairs = sum(outcomes.values())
    compared = matches.get("true", 0.0) + matches.get("false", 0.0)
    return PairedCounts(
        pairs=pairs,
        canary_only_failures=outcomes.get("shadow_only_error", 0.0),
        stable_only_failures=outcomes.get("primary_only_error", 0.0),
        # no greedy pairs compared: there is no output agreement to test
        both_succeeded=compared if compared > 0 else None,
        outputs_differ=matches.get("false", 0.0) if compared > 0 else None,
    )


def inter_token_latency_queries(scope: QueryScope) -> tuple[str, str, str]:
    """(count, sum, cumulative buckets by le) per revision of the router's inter-token latency histogram."""
    metric = "tokenyard_router_inter_token_latency_seconds"
    return (
        _increase(f"{metric}_count", scope, "revision"),
        _increase(f"{metric}_sum", scope, "revision"),
        _increase(f"{metric}_bucket", scope, "revision, le"),
    )


def mean_sample(count: float | None, total: float | None, cumulative: Mapping[float, float]) -> MeanSample:
    """Mean and variance of a histogram's observations from its count, sum and cumulative buckets.

    Observations are taken as spread evenly within each bucket (a bucket (lo, hi] adds its mass times
    (midpoint − mean)² + (hi − lo)²/12); those above the last finite bound sit at the mean the sum leaves
    for them (at least that bound). Buckets wide against the spread make this err on the large side
    (Sheppard's correction would subtract the (hi − lo)²/12 instead, and can fall far below the truth):
    a variance too large only slows detection, one too small would roll back by chance. Without buckets
    the variance is unknown (None: inconclusive).
    """
    if count is None or total is None or count <= 0:
        return MeanSample(count, None, None)
    mean = total / count
    bounds = sorted(b for b in cumulative if math.isfinite(b))
    if not bounds:
        return MeanSample(count, mean, None)
    squares, mass_below, sum_below, low = 0.0, 0.0, 0.0, 0.0
    for high in bounds:
        mass = max(0.0, min(cumulative[high], count) - mass_below)
        middle = (low + high) / 2
        squares += mass * ((middle - mean) ** 2 + (high - low) ** 2 / 12)
        mass_below, sum_below, low = mass_below + mass, sum_below + mass * middle, high
    above = count - mass_below
    if above > 0:
        tail_mean = max(low, (total - sum_below) / above)
        squares += above * (tail_mean - mean) ** 2
    return MeanSample(count, mean, squares / count)


LATENCY_KINDS = (AnalysisMetricKind.TTFT_OVER_SLO, AnalysisMetricKind.INTER_TOKEN_LATENCY)
QUERY_NAMES = ("revision", "window", "model", "namespace")  # the $names a PromQL analysis query may use


def metrics_for_step(
    configured: Sequence[AnalysisMetric], shadow: bool
) -> tuple[list[AnalysisMetric], list[str]]:
    """The metrics a step judges, and the names of those it cannot. A shadow step's canary answers copies the
    client never sees, so their time to first token and inter-token latency are not measured: comparing them
    with the stable revision's would compare two different things. What remains of a shadow step is judged
    on its copies' errors."""
    metrics = list(configured) or [AnalysisMetric(name="errors", kind=AnalysisMetricKind.ERROR_RATIO)]
    if not shadow:
        return metrics, []
    kept = [m for m in metrics if m.kind not in LATENCY_KINDS]
    skipped = [m.name for m in metrics if m.kind in LATENCY_KINDS]
    return kept or [AnalysisMetric(name="errors", kind=AnalysisMetricKind.ERROR_RATIO)], skipped


def query_problems(metrics: Sequence[AnalysisMetric]) -> list[str]:
    """What is wrong with the PromQL queries of the analysis metrics, each naming its metric."""
    problems = []
    placeholders = {name: "" for name in QUERY_NAMES}
    for metric in metrics:
        if metric.kind != AnalysisMetricKind.PROMQL:
            continue
        for query in (metric.bad_query, metric.total_query):
            try:
                substitute(query or "", placeholders)
            except ValueError as e:
                problems.append(f"analysis metric {metric.name}: {e}")
    return problems


def substitute(query: str, values: Mapping[str, str]) -> str:
    """A PromQL analysis query with its $names replaced; an unknown $name is an error that names it."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise ValueError(
                f"unknown ${name} in the analysis query {query!r} (known: {', '.join(sorted(values))})"
            )
        return values[name]

    return re.sub(r"\$([a-z]+)", one, query)


def _le(slo: float | None) -> str:
    """The router's histogram bound for an SLO (the largest bucket at or below it, since a series for any other
    `le` does not exist), formatted as prometheus_client writes `le` labels."""
    return repr(bucket_at_or_below(float(slo or 0)))
