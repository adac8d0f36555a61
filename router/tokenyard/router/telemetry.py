"""The router's Prometheus metrics (prefix tokenyard_router_; bounded labels only: namespace, model, revision,
replica, code, outcome; a replica's series are removed when the replica goes).

``namespace`` is the ModelDeployment's namespace (empty for static backends), so that the operator's analysis
can tell apart two deployments serving the same model name. The router's ServiceMonitor honours the scraped
labels: without it Prometheus would rename this label to ``exported_namespace`` in favour of the target's own
(the router pod's) namespace.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from tokenyard.core.metrics import LATENCY_BUCKETS_S  # shared with the operator's analysis
from tokenyard.router.discovery import ModelView
from tokenyard.router.shadowpair import OUTCOMES as PAIR_OUTCOMES

# Outcomes of a shadow copy (tokenyard_router_shadow_requests_total): ok, error, dropped before it ran, and
# abandoned (cut short by the router's shutdown).
SHADOW_OUTCOMES = ("ok", "error", "dropped", "abandoned")
# The code the router answers when a replica fails it (unreachable, or its stream broke): the error series
# declared at zero for every replica, so that an error panel reads 0 in a calm fleet rather than "No data".
UPSTREAM_FAILURE_CODE = "502"

# How long a departed replica's counters stay exported: many Prometheus scrape intervals, so that what was
# counted after the last scrape is still read.
REPLICA_COUNTER_GRACE_SECONDS = 300.0
DECISION_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
PREFIX_BUCKETS_TOKENS = (0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
# Gaps between streamed tokens: tens of milliseconds on a healthy engine, seconds when it stalls.
INTER_TOKEN_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1,
    2.5,
    5,
)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tokenyard_router_requests_total",
            "Requests answered, by model, revision, replica and HTTP status code.",
            ["namespace", "model", "revision", "replica", "code"],
            registry=r,
        )
        self.errors = Counter(
            "tokenyard_router_errors_total",
            "Requests that failed (status >= 400 or a broken stream), by model, revision, replica and code.",
            ["namespace", "model", "revision", "replica", "code"],
            registry=r,
        )
        self.retries = Counter(
            "tokenyard_router_retries_total",
            "Requests retried on another replica after a connect error or a 503 before the first byte.",
            ["model", "replica"],
            registry=r,
        )
        self.ejections = Counter(
            "tokenyard_router_ejections_total",
            "Replicas ejected after repeated failures.",
            ["replica"],
            registry=r,
        )
        self.ttft = Histogram(
            "tokenyard_router_time_to_first_token_seconds",
            "Time from the request's arrival to the first byte of the response sent to the client.",
            ["namespace", "model", "revision"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "tokenyard_router_request_duration_seconds",
            "Time from the request's arrival to the end of the response, as the client sees it.",
            ["namespace", "model", "revision"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token = Histogram(
            "tokenyard_router_inter_token_latency_seconds",
            "Gaps between successive network reads carrying generated text, as the router relays a client's "
            "stream (several events read together are one read), the same for the HTTP and gRPC fronts.",
            ["namespace", "model", "revision"],
            buckets=INTER_TOKEN_BUCKETS_S,
            registry=r,
        )
        self.decision = Histogram(
            "tokenyard_router_decision_duration_seconds",
            "Time spent choosing a replica (filters, scorers, picker, index lookup).",
            buckets=DECISION_BUCKETS_S,
            registry=r,
        )
        self.outstanding_tokens = Gauge(
            "tokenyard_router_outstanding_tokens",
            "Tokens routed to the replica and not yet processed (prefill still due plus expected decode), "
            "as counted by this router and, with Redis, its peers.",
            ["replica"],
            registry=r,
        )
        self.outstanding_requests = Gauge(
            "tokenyard_router_outstanding_requests",
            "Requests in flight on the replica through this router.",
            ["replica"],
            registry=r,
        )
        self.replica_concurrency = Gauge(
            "tokenyard_router_replica_concurrency",
            "Requests the replica runs at once, as learned from its /metrics, else its configured batch size "
            "(filter freeSlot); 0 while unknown.",
            ["replica"],
            registry=r,
        )
        self.prefill_overlap = Gauge(
            "tokenyard_router_prefill_overlap_samples",
            "Short prompts sent behind a long prefill of this router's, by whether their first token came well "
            "before the long one's (overtook: the engines prefill side by side) or not (waited), over the "
            "router's recent window (accounting.PrefillOverlap).",
            ["outcome"],
            registry=r,
        )
        self.prefill_side_by_side = Gauge(
            "tokenyard_router_prefills_side_by_side",
            "1 once the engines are seen to prefill side by side (then prefill owed no longer counts as a "
            "replica's load), 0 while prefills are taken to queue; with --no-prefill-overlap nothing is sampled "
            "and it stays 0.",
            registry=r,
        )
        self.prefix_match = Histogram(
            "tokenyard_router_prefix_match_tokens",
            "Prompt tokens the chosen replica was expected to hold in its prefix cache.",
            ["model"],
            buckets=PREFIX_BUCKETS_TOKENS,
            registry=r,
        )
        self.shadow_requests = Counter(
            "tokenyard_router_shadow_requests_total",
            "Shadow copies sent, by revision and outcome (ok, error, dropped; abandoned: cut short by the router).",
            ["namespace", "model", "revision", "outcome"],
            registry=r,
        )
        self.shadow_duration = Histogram(
            "tokenyard_router_shadow_duration_seconds",
            "End-to-end latency of shadow copies, read to the end and discarded.",
            ["namespace", "model", "revision"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.shadow_pairs = Counter(
            "tokenyard_router_shadow_pairs_total",
            "Shadowed requests whose primary and shadow copy both ended, by the shadow's revision and outcome "
            "(both_ok, shadow_only_error, primary_only_error, both_error). A side errs when it ends with a "
            "status >= 400 or a broken stream; a copy dropped before it ran, or a primary whose client went "
            "away, makes no pair.",
            ["namespace", "model", "revision", "outcome"],
            registry=r,
        )
        self.shadow_output_match = Counter(
            "tokenyard_router_shadow_output_match_total",
            "Greedy (temperature 0) shadowed requests where both sides succeeded, by the shadow's revision and "
            "whether the full output texts were equal.",
            ["namespace", "model", "revision", "match"],
            registry=r,
        )
        self.redis_up = Gauge(
            "tokenyard_router_redis_up",
            "1 while the router shares its state through Redis, 0 while it routes on local state only.",
            registry=r,
        )
        # Without it a router given no Redis (the chart's default) and one whose Redis is down both read
        # redis_up 0: dashboards and alerts could not tell "down" from "not wanted".
        self.redis_configured = Gauge(
            "tokenyard_router_redis_configured",
            "1 when the router was given a Redis to share its state through (--redis-url), 0 when it routes on "
            "its own state by design.",
            registry=r,
        )
        self.redis_errors = Counter(
            "tokenyard_router_redis_errors_total", "Failed Redis synchronisations.", registry=r
        )
        self.replica_healthy = Gauge(
            "tokenyard_router_replica_healthy",
            "1 when the replica can be routed to: its /health answers and it is not ejected (/metrics plays no part).",
            ["replica", "revision"],
            registry=r,
        )
        self.metrics_stale = Gauge(
            "tokenyard_router_replica_metrics_stale",
            "1 when the replica's /metrics scrape is older than the freshness bound (treated as unknown).",
            ["replica"],
            registry=r,
        )
        self.metrics_scrape_failures = Counter(
            "tokenyard_router_metrics_scrape_failures_total",
            "Failed /metrics scrapes of a replica, by reason (http_status, timeout, connection, decode, parse). "
            "Liveness never depends on it; the scraped signals are unknown until a scrape succeeds.",
            ["replica", "reason"],
            registry=r,
        )
        self.health_check_failures = Counter(
            "tokenyard_router_health_check_failures_total",
            "Failed /health probes of a replica, by reason (http_status, timeout, connection). Connection "
            "refused or a non-200 answer makes the replica unreachable at once, timeouts after two in a row.",
            ["replica", "reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "tokenyard_router_in_flight_requests", "Client requests being served now.", registry=r
        )

        # Every metric with a replica label goes when the replica goes: its gauges at once (they would go
        # stale), its counters after a grace period. Prometheus keeps the samples it scraped, so `increase()`
        # over a window still counts a departed replica's requests; what it has not scraped yet (the last
        # errors of a canary replica that failed readiness, say) must stay exported for a few scrapes.
        self.replica_gauges = (
            self.outstanding_tokens,
            self.outstanding_requests,
            self.replica_concurrency,
            self.replica_healthy,
            self.metrics_stale,
        )
        self.replica_counters = (
            self.requests,
            self.errors,
            self.retries,
            self.ejections,
            self.metrics_scrape_failures,
            self.health_check_failures,
        )
        self._departed: dict[str, float] = {}  # replica -> when it left (monotonic seconds)

    def declare(self, views: Iterable[ModelView]) -> None:
        """Export at zero the event counters of every label set discovery knows of, before their first event:
        a dashboard or an alert on errors, retries, ejections or shadow outcomes then reads 0 in a calm fleet
        instead of "No data" (and a ratio such as the shadow mismatch ratio is defined). ``labels()`` without
        an increment creates the child at 0 and leaves an existing one alone, so this is idempotent."""
        for view in views:
            for endpoint in view.endpoints:
                self.ejections.labels(endpoint.name)
                self.retries.labels(view.served_name, endpoint.name)
                self.errors.labels(
                    view.namespace, view.served_name, endpoint.revision, endpoint.name, UPSTREAM_FAILURE_CODE
                )
            if view.shadow is not None:
                labels = (view.namespace, view.served_name, view.shadow.revision)
                for outcome in SHADOW_OUTCOMES:
                    self.shadow_requests.labels(*labels, outcome)
                for outcome in PAIR_OUTCOMES:
                    self.shadow_pairs.labels(*labels, outcome)
                for match in ("true", "false"):
                    self.shadow_output_match.labels(*labels, match)

    def forget_replica(self, replica: str, now: float | None = None) -> None:
        """The replica left discovery: drop its gauges now, its counters once the grace period has passed."""
        if not replica:
            return
        for metric in self.replica_gauges:
            metric.remove_by_labels({"replica": replica})
        self._departed.setdefault(replica, time.monotonic() if now is None else now)

    def retain_replicas(self, known: set[str], now: float | None = None) -> None:
        """Level-based sweep: every replica not in ``known`` is forgotten ('' - errors before a replica was
        chosen - stays); counters of replicas gone for longer than the grace period are dropped, and a replica
        that came back is no longer counted as departed."""
        now = time.monotonic() if now is None else now
        labelled = {
            sample.labels.get("replica", "")
            for metric in (*self.replica_gauges, *self.replica_counters)
            for family in metric.collect()
            for sample in family.samples
        }
        for replica in known & self._departed.keys():
            del self._departed[replica]
        for replica in labelled - known - {""}:
            self.forget_replica(replica, now)
        for replica, left in list(self._departed.items()):
            if now - left >= REPLICA_COUNTER_GRACE_SECONDS:
                for metric in self.replica_counters:
                    metric.remove_by_labels({"replica": replica})
                del self._departed[replica]
