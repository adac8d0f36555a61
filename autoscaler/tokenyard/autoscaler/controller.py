"""The autoscaler's control loop: InferenceAutoscalers in the API server, signals from Prometheus, the policy.

A plain asyncio loop over kubernetes_asyncio rather than Kopf timers, because
- the policy keeps a memory (sample windows, recent recommendations) per autoscaler that must live across
  iterations in one place and be dropped when the object goes -- a dict here, no Kopf memo juggling;
- two replicas must not both write: one coordination.k8s.io Lease (client-go's leader-election scheme)
  needs no extra CRD, whereas Kopf peering needs the KopfPeering resources installed and freezes when two
  replicas have the same priority;
- every autoscaler is decided on its own interval in one pass, which is easy to start and stop from a test
  (:func:`run_autoscaler` takes a kubeconfig path, a Prometheus URL and a stop event).

Each iteration: read the target's scale subresource and status, query Prometheus, ask the policy, write the
scale (unless RecommendOnly), write status and events. An exception in one autoscaler is logged, counted and
reported in its status; the others and the next iteration go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import ValidationError
from tokenyard.autoscaler.policy import (
    Direction,
    Observation,
    Policy,
    PolicyConfig,
    RateLimit,
    SampleWindow,
    ScalingDecision,
    SignalKind,
    SignalSpec,
)
from tokenyard.autoscaler.prometheus import (
    DEFAULT_SELECTOR,
    QueryTemplateError,
    freshness_query,
    kv_cache_sizes,
    kv_cache_sizes_query,
    signal_query,
)
from tokenyard.core import labels
from tokenyard.core.prometheus import PrometheusClient, Reading
from tokenyard.core.types import AutoscalerMode, InferenceAutoscalerSpec

log = logging.getLogger("tokenyard.autoscaler")

PLURAL = "inferenceautoscalers"
COMPONENT_NAME = "tokenyard-autoscaler"
LEASE_NAME = "tokenyard-autoscaler"
MERGE_PATCH = "application/merge-patch+json"
# Stages of tokenyard_autoscaler_errors_total: the loop itself (listing autoscalers), one autoscaler's pass.
STAGE_LOOP, STAGE_RECONCILE = "loop", "reconcile"
ERROR_STAGES = (STAGE_LOOP, STAGE_RECONCILE)
# On SIGTERM: how long the pass in flight may go on, then how long releasing the Lease may take. Together well
# inside Kubernetes' default 30 s termination grace period, whatever the API server and Prometheus do.
DRAIN_SECONDS = 5.0
RELEASE_SECONDS = 3.0

# Engine samples older than this are not a reading of now: Prometheus restarted (it answers from before its
# outage for up to its 5-minute lookback) or stopped scraping the engines. Several scrape intervals (the chart's
# PodMonitor scrapes every 15 s), so one late scrape is not a gap.
MAX_SAMPLE_AGE_SECONDS = 60.0


def without_stale_values(readings: dict[str, Reading], age: Reading, max_age_s: float) -> dict[str, Reading]:
    """The signals' readings, each with a value turned into "no data" (which holds the count: never a scale-down
    on it) when the target's newest engine sample is older than ``max_age_s``. An age that cannot be read (no
    engine series: a custom selector or query, or Prometheus down) leaves them as they are: the signal queries
    then say for themselves whether they have data."""
    if age.value is None or age.value <= max_age_s:
        return readings
    problem = (
        f"the newest engine sample is {age.value:.0f}s old (more than {max_age_s:.0f}s): Prometheus is not "
        "scraping the engines now (restarted, or its targets are down); holding until fresh samples arrive"
    )
    return {n: Reading(None, problem, r.sampled_at) if r.ok else r for n, r in readings.items()}


# Plurals of the kinds a scaleTargetRef usually names; others fall back to lower-case kind + "s".
KNOWN_PLURALS = {
    "ModelDeployment": "modeldeployments",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "ReplicaSet": "replicasets",
    "LeaderWorkerSet": "leaderworkersets",
}


# ---------------------------------------------------------------------------------------------- pure helpers
def now_iso(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def signal_names(spec: InferenceAutoscalerSpec) -> list[str]:
    """A stable name per signal: its kind, with the list index when a kind repeats."""
    kinds = [s.kind.value for s in spec.signals]
    return [k if kinds.count(k) == 1 else f"{k}-{i}" for i, k in enumerate(kinds)]


def effective_panic_window(spec: InferenceAutoscalerSpec) -> tuple[int, str]:
    """The panic window the policy runs with, and a warning when it differs from the spec's.

    The CRD's CEL rules keep the panic window between intervalSeconds and stableWindowSeconds, but objects
    stored before those rules existed (the old defaults were interval 15 s, panic 6 s) still reach the
    controller. Refusing them would stop their autoscaling on an upgrade; instead the window is brought inside
    the bounds (a panic window shorter than the interval holds at most one sample) and the user is told.
    """
    panic = min(max(spec.panic_window_seconds, spec.interval_seconds), spec.stable_window_seconds)
    if panic == spec.panic_window_seconds:
        return panic, ""
    return panic, (
        f"spec.panicWindowSeconds ({spec.panic_window_seconds}) must lie between spec.intervalSeconds "
        f"({spec.interval_seconds}) and spec.stableWindowSeconds ({spec.stable_window_seconds}); "
        f"running with {panic} s until the spec is fixed"
    )


def policy_config_from_spec(spec: InferenceAutoscalerSpec) -> PolicyConfig:
    """The CRD's spec as the policy's configuration (the panic window brought inside its bounds)."""
    panic_window, _ = effective_panic_window(spec)
    return PolicyConfig(
        signals=tuple(
            SignalSpec(name, SignalKind(s.kind.value), s.target)
            for name, s in zip(signal_names(spec), spec.signals, strict=True)
        ),
        min_groups=spec.min_replicas,
        max_groups=spec.max_replicas,
        stable_window_seconds=spec.stable_window_seconds,
        panic_window_seconds=panic_window,
        panic_threshold=spec.panic_threshold,
        tolerance=spec.tolerance,
        scale_up_limit=RateLimit(spec.scale_up.max_groups, 0.0, spec.scale_up.period_seconds),
        scale_down_limit=RateLimit(spec.scale_down.max_groups, 0.0, spec.scale_down.period_seconds),
        scale_up_stabilization_seconds=spec.scale_up.stabilization_window_seconds,
        scale_down_stabilization_seconds=spec.scale_down.stabilization_window_seconds,
        cold_start_seconds=spec.cold_start_seconds,
        stale_after_seconds=spec.stale_after_seconds,
        spare_groups=spec.spare_groups,
    )


def split_api_version(api_version: str) -> tuple[str, str]:
    if "/" not in api_version:
        raise ValueError(
            f"scaleTargetRef.apiVersion {api_version!r}: core-group kinds have no scale subresource here; "
            "use group/version, e.g. apps/v1"
        )
    group, version = api_version.split("/", 1)
    return group, version


def plural_for(kind: str) -> str:
    return KNOWN_PLURALS.get(kind, kind.lower() + "s")


@dataclass(frozen=True)
class TargetCounts:
    current: int
    ready: int
    pending: int
    insufficient_capacity: bool


def target_counts(scale: dict[str, Any], target: dict[str, Any]) -> TargetCounts:
    """Group counts from the scale subresource (spec.replicas) and the target's status (readyReplicas and
    an InsufficientCapacity condition, as ModelDeployment, Deployment and LeaderWorkerSet report them)."""
    current = int((scale.get("spec") or {}).get("replicas") or 0)
    status = target.get("status") or {}
    ready = min(int(status.get("readyReplicas") or 0), current)
    full = any(
        c.get("type") == "InsufficientCapacity" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return TargetCounts(current, ready, max(current - ready, 0), full)


def condition(
    previous: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> dict[str, Any]:
    """A metav1.Condition whose lastTransitionTime moves only when its status does."""
    text = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    changed = old is None or old.get("status") != text
    return {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now if changed else old.get("lastTransitionTime", now),
        "observedGeneration": generation,
    }


def decision_conditions(
    previous: list[dict[str, Any]],
    decision: ScalingDecision,
    now: str,
    generation: int | None,
    scale_error: str = "",
    query_problems: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """AbleToScale, ScalingActive and ScalingLimited, with the HPA's meanings."""
    able = condition(
        previous,
        "AbleToScale",
        not scale_error,
        "FailedUpdateScale" if scale_error else "ReadyForNewScale",
        scale_error or "the target's scale subresource can be read and written",
        now,
        generation,
    )
    missing = [r for r in decision.readings if r.problem]
    # Say why Prometheus gave nothing (unreachable, empty, an error), not only that a window is empty.
    query_problems = query_problems or {}
    active_message = (
        "; ".join(f"{r.name}: {query_problems.get(r.name) or r.problem}" for r in missing)
        + "; holding, never scaling down without data"
        if missing
        else "every signal has fresh data"
    )
    active = condition(
        previous,
        "ScalingActive",
        not missing,
        "MissingData" if missing else "ValidMetricFound",
        active_message,
        now,
        generation,
    )
    limited_reason = {
        "MaxReplicas": "TooManyReplicas",
        "MinReplicas": "TooFewReplicas",
        "InsufficientCapacity": "InsufficientCapacity",
        "ScaleUpLimit": "ScaleUpLimit",
        "ScaleDownLimit": "ScaleDownLimit",
    }.get(decision.limited_by, "DesiredWithinRange")
    limited_message = (
        "the cluster is full: the target reports InsufficientCapacity, not asking for more groups"
        if decision.limited_by == "InsufficientCapacity"
        else f"held back by {decision.limited_by}: {decision.reason}"
        if decision.limited_by
        else "the desired count is within bounds and rate limits"
    )
    limited = condition(
        previous,
        "ScalingLimited",
        bool(decision.limited_by),
        limited_reason,
        limited_message,
        now,
        generation,
    )
    return [able, active, limited]


def failure_conditions(
    previous: list[dict[str, Any]], reason: str, message: str, now: str, generation: int | None
) -> list[dict[str, Any]]:
    return [
        condition(previous, "AbleToScale", False, reason, message, now, generation),
        condition(previous, "ScalingActive", False, reason, message, now, generation),
    ]


# ---------------------------------------------------------------------------------------------- metrics
class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        key = ["namespace", "autoscaler"]
        r = self.registry
        self.desired = Gauge(
            "tokenyard_autoscaler_desired_groups", "Groups the policy wants.", key, registry=r
        )
        self.current = Gauge(
            "tokenyard_autoscaler_current_groups",
            "Groups the target asks for (spec.replicas).",
            key,
            registry=r,
        )
        self.ready = Gauge(
            "tokenyard_autoscaler_ready_groups", "Groups of the target that are ready.", key, registry=r
        )
        self.signal = Gauge(
            "tokenyard_autoscaler_signal_value",
            "Last value of each signal (NaN: no data).",
            [*key, "signal"],
            registry=r,
        )
        self.target = Gauge(
            "tokenyard_autoscaler_signal_target",
            "Target of each signal, per group.",
            [*key, "signal"],
            registry=r,
        )
        self.decisions = Counter(
            "tokenyard_autoscaler_decisions_total",
            "Decisions by direction and reason.",
            [*key, "direction", "reason"],
            registry=r,
        )
        self.scale_actions = Counter(
            "tokenyard_autoscaler_scale_actions_total",
            "Writes of the target's scale subresource.",
            [*key, "direction"],
            registry=r,
        )
        self.errors = Counter(
            "tokenyard_autoscaler_errors_total", "Failed iterations by stage.", ["stage"], registry=r
        )
        for stage in ERROR_STAGES:  # at zero from the start: a healthy autoscaler's error panel reads 0
            self.errors.labels(stage)
        self.leader = Gauge(
            "tokenyard_autoscaler_leader", "1 while this replica holds the lease.", registry=r
        )
        self.iteration = Gauge(
            "tokenyard_autoscaler_last_iteration_timestamp_seconds",
            "When the loop last finished a pass.",
            registry=r,
        )

    def forget(self, namespace: str, name: str, signals: list[str]) -> None:
        """Remove an autoscaler's series when the object goes (bounded label sets)."""
        for gauge in (self.desired, self.current, self.ready):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        for signal in signals:
            for gauge in (self.signal, self.target):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, signal)


# ---------------------------------------------------------------------------------------------- leader election
class LeaseElector:
    """client-go's Lease-based leader election, reduced: hold the Lease while renewing it in time; take it
    over when its holder has not renewed it for its lease duration. Conflicting writes (HTTP 409) lose."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        namespace: str,
        name: str = LEASE_NAME,
        identity: str | None = None,
        lease_seconds: int = 15,
    ) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lease_seconds = lease_seconds
        self.is_leader = False

    def _body(
        self, now: datetime, acquired: datetime, transitions: int, resource_version: str | None
    ) -> dict:
        stamp = lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731  (MicroTime)
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": stamp(acquired),
                "renewTime": stamp(now),
                "leaseTransitions": transitions,
            },
        }

    async def ensure_leader(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease = await self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                await self.api.create_namespaced_lease(self.namespace, self._body(now, now, 0, None))
                self.is_leader = True
            except ApiException as create_exc:
                if create_exc.status != 409:
                    raise
                self.is_leader = False
            return self.is_leader
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time
        duration = spec.lease_duration_seconds or self.lease_seconds
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder != self.identity and holder and not expired:
            self.is_leader = False
            return False
        mine = holder == self.identity
        acquired = spec.acquire_time if mine and spec.acquire_time else now
        transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
        try:
            await self.api.replace_namespaced_lease(
                self.name,
                self.namespace,
                self._body(now, acquired, transitions, lease.metadata.resource_version),
            )
            self.is_leader = True
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.is_leader = False  # another replica wrote first
        return self.is_leader

    async def release(self) -> None:
        """Give the lease up on a clean stop, so a successor need not wait for it to expire."""
        if not self.is_leader:
            return
        with contextlib.suppress(ApiException):
            await self.api.patch_namespaced_lease(
                self.name,
                self.namespace,
                {"spec": {"holderIdentity": None, "renewTime": None}},
                _content_type=MERGE_PATCH,
            )
        self.is_leader = False


# ---------------------------------------------------------------------------------------------- the loop
@dataclass
class _Tracked:
    generation: int | None
    policy: Policy
    window: SampleWindow
    signals: list[str]
    next_due: float = 0.0
    last_written: int | None = None  # the count this controller last wrote (to spot a human's kubectl scale)
    last_event: str = ""  # the last condition we announced by an event, so a state is announced once


class AutoscalerController:
    def __init__(
        self,
        api_client: client.ApiClient,
        prometheus: PrometheusClient,
        *,
        lease_namespace: str = "default",
        tick_seconds: float = 2.0,
        selector: str = DEFAULT_SELECTOR,
        metrics: AutoscalerMetrics | None = None,
        identity: str | None = None,
        clock=time.time,
        drain_seconds: float = DRAIN_SECONDS,
        release_seconds: float = RELEASE_SECONDS,
        max_sample_age_s: float = MAX_SAMPLE_AGE_SECONDS,
    ) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.max_sample_age_s = max_sample_age_s
        self.drain_seconds = drain_seconds
        self.release_seconds = release_seconds
        self.core = client.CoreV1Api(api_client)
        self.prometheus = prometheus
        self.elector = LeaseElector(client.CoordinationV1Api(api_client), lease_namespace, identity=identity)
        self.tick_seconds = tick_seconds
        self.selector = selector
        self.metrics = metrics or AutoscalerMetrics()
        self.clock = clock
        self._tracked: dict[tuple[str, str, str], _Tracked] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set. A stop that comes mid-pass gives the pass `drain_seconds` to finish (its
        scale writes are worth completing), then abandons it; the Lease is released within `release_seconds`.
        So the process exits in bounded time even when the API server or Prometheus hangs or is gone: a pass
        or a release stuck on a dead connection is cancelled, not awaited."""
        log.info("autoscaler loop starting (identity %s)", self.elector.identity)
        try:
            while not stop.is_set():
                one_pass = asyncio.create_task(self._one_pass(), name="autoscaler-pass")
                stopped = asyncio.create_task(stop.wait(), name="autoscaler-stop")
                await asyncio.wait({one_pass, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not one_pass.done():
                    await self._finish_or_abandon(one_pass)
                stopped.cancel()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick_seconds)
        finally:
            await self._release_lease()
            self.metrics.leader.set(0)
            log.info("autoscaler loop stopped")

    async def _one_pass(self) -> None:
        try:
            leader = await self.elector.ensure_leader()
            self.metrics.leader.set(1 if leader else 0)
            if leader:
                await self.reconcile_all()
            self.metrics.iteration.set(self.clock())
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop survives anything one pass throws
            self.metrics.errors.labels(STAGE_LOOP).inc()
            log.exception("autoscaler pass failed; retrying in %.0fs", self.tick_seconds)

    async def _finish_or_abandon(self, one_pass: asyncio.Task) -> None:
        done, _ = await asyncio.wait({one_pass}, timeout=self.drain_seconds)
        if not done:
            log.warning("stopping: abandoning the pass in flight after %.1fs", self.drain_seconds)
            one_pass.cancel()
            await asyncio.gather(one_pass, return_exceptions=True)

    async def _release_lease(self) -> None:
        try:
            await asyncio.wait_for(self.elector.release(), self.release_seconds)
        except (TimeoutError, OSError, ApiException, aiohttp.ClientError) as exc:
            # The Lease then expires by itself after its duration; a successor waits that long at worst.
            log.warning(
                "could not release the leader Lease (%s); it expires by itself", exc or type(exc).__name__
            )

    async def reconcile_all(self) -> None:
        listing = await self.custom.list_cluster_custom_object(labels.GROUP, labels.VERSION, PLURAL)
        seen = set()
        for obj in listing.get("items", []):
            meta = obj["metadata"]
            key = (meta["namespace"], meta["name"], meta.get("uid", ""))
            seen.add(key)
            try:
                await self.reconcile(obj, key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.errors.labels(STAGE_RECONCILE).inc()
                log.exception("%s/%s: reconcile failed", key[0], key[1])
                with contextlib.suppress(Exception):
                    await self._write_failure(obj, "InternalError", f"{exc.__class__.__name__}: {exc}")
        for key in set(self._tracked) - seen:
            self.metrics.forget(key[0], key[1], self._tracked.pop(key).signals)

    async def reconcile(self, obj: dict[str, Any], key: tuple[str, str, str]) -> None:
        namespace, name, _ = key
        now = self.clock()
        generation = obj["metadata"].get("generation")
        try:
            spec = InferenceAutoscalerSpec.parse(obj.get("spec"))
            policy_config = policy_config_from_spec(spec)
        except (ValidationError, ValueError) as exc:
            await self._write_failure(obj, "InvalidSpec", str(exc).replace("\n", " "))
            return
        tracked = self._tracked.get(key)
        if tracked is None or tracked.generation != generation:
            # A new or edited spec starts a fresh policy (its windows and limits may have changed).
            tracked = _Tracked(
                generation,
                Policy(policy_config),
                SampleWindow(policy_config.history_seconds + 60),
                signal_names(spec),
                last_written=tracked.last_written if tracked else None,
            )
            self._tracked[key] = tracked
            _, window_warning = effective_panic_window(spec)
            if window_warning:
                log.warning("%s/%s: %s", namespace, name, window_warning)
                await self._event(obj, None, "WindowAdjusted", window_warning, warning=True)
        if now < tracked.next_due:
            return
        tracked.next_due = now + spec.interval_seconds

        ref = spec.scale_target_ref
        try:
            group, version = split_api_version(ref.api_version)
        except ValueError as exc:
            await self._write_failure(obj, "InvalidSpec", str(exc))
            return
        plural = plural_for(ref.kind)
        try:
            scale = await self.custom.get_namespaced_custom_object_scale(
                group, version, namespace, plural, ref.name
            )
            target = await self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, ref.name
            )
        except ApiException as exc:
            message = f"cannot read {ref.kind} {namespace}/{ref.name} scale: HTTP {exc.status} {exc.reason}"
            await self._write_failure(obj, "FailedGetScale", message)
            await self._event(obj, tracked, "FailedGetScale", message, warning=True)
            return
        counts = target_counts(scale, target)
        if tracked.last_written is not None and counts.current != tracked.last_written:
            # Someone else (a human's kubectl scale) changed the count: the rate limits count it.
            tracked.policy.note_external_change(now, tracked.last_written, counts.current)
            tracked.last_written = None

        kv_sizes = ()
        if any(s.kind.value == SignalKind.TOKEN_LOAD.value and not s.query for s in spec.signals):
            # The default TokenLoad reads vLLM's KV occupancy in tokens, which needs the engines' cache sizes
            # first (a failed read leaves none: the query then estimates vLLM's share from request counts).
            kv_sizes = kv_cache_sizes(
                await self.prometheus.query_vector(kv_cache_sizes_query(namespace, ref.name, self.selector))
            )
        try:
            queries = {
                n: signal_query(
                    SignalKind(s.kind.value), namespace, ref.name, s.query, self.selector, kv_sizes
                )
                for n, s in zip(tracked.signals, spec.signals, strict=True)
            }
        except QueryTemplateError as exc:
            await self._write_failure(obj, "InvalidSpec", f"spec.signals[].query: {exc}")
            return
        readings, age = await asyncio.gather(
            self.prometheus.query_many(queries),
            self.prometheus.query(freshness_query(namespace, ref.name, self.selector)),
        )
        readings = without_stale_values(readings, age, self.max_sample_age_s)
        for n, reading in readings.items():
            tracked.window.add(n, now, reading.value)
        decision = tracked.policy.decide(
            Observation(
                now=now,
                current=counts.current,
                ready=counts.ready,
                pending=counts.pending,
                samples=tracked.window.snapshot(),
                insufficient_capacity=counts.insufficient_capacity,
            )
        )

        scale_error = ""
        scaled = False
        if spec.mode == AutoscalerMode.AUTO and decision.direction is not Direction.HOLD:
            try:
                await self.custom.patch_namespaced_custom_object_scale(
                    group,
                    version,
                    namespace,
                    plural,
                    ref.name,
                    {"spec": {"replicas": decision.desired}},
                    _content_type=MERGE_PATCH,
                )
                scaled = True
                tracked.last_written = decision.desired
                self.metrics.scale_actions.labels(namespace, name, decision.direction.value).inc()
            except ApiException as exc:
                scale_error = (
                    f"cannot write {ref.kind} {namespace}/{ref.name} scale: HTTP {exc.status} {exc.reason}"
                )
        elif spec.mode == AutoscalerMode.AUTO:
            tracked.last_written = counts.current

        self._record_metrics(namespace, name, spec, tracked, counts, decision, readings)
        await self._write_status(obj, spec, tracked, counts, decision, readings, now, scaled, scale_error)
        await self._announce(obj, tracked, spec, decision, scaled, scale_error)

    # ---- writes ----------------------------------------------------------------------------------
    def _record_metrics(
        self,
        namespace: str,
        name: str,
        spec: InferenceAutoscalerSpec,
        tracked: _Tracked,
        counts: TargetCounts,
        decision: ScalingDecision,
        readings: dict[str, Reading],
    ) -> None:
        m = self.metrics
        m.desired.labels(namespace, name).set(decision.desired)
        m.current.labels(namespace, name).set(counts.current)
        m.ready.labels(namespace, name).set(counts.ready)
        for n, s in zip(tracked.signals, spec.signals, strict=True):
            value = readings[n].value
            m.signal.labels(namespace, name, n).set(float("nan") if value is None else value)
            m.target.labels(namespace, name, n).set(s.target)
        m.decisions.labels(namespace, name, decision.direction.value, decision.reason_code).inc()
        # Scale writes are events: declared at zero so that a calm autoscaler's panel reads 0, not "No data".
        for direction in (Direction.UP, Direction.DOWN):
            m.scale_actions.labels(namespace, name, direction.value)

    async def _write_status(self, obj, spec, tracked, counts, decision, readings, now, scaled, scale_error):
        meta = obj["metadata"]
        previous = (obj.get("status") or {}).get("conditions") or []
        stamp = now_iso(now)
        desired = decision.desired if decision.direction is not Direction.HOLD else decision.recommendation
        status: dict[str, Any] = {
            "observedGeneration": meta.get("generation"),
            "currentReplicas": counts.current,
            "desiredReplicas": desired,
            "signals": [
                {
                    "name": n,
                    "kind": s.kind.value,
                    "target": s.target,
                    **({"value": readings[n].value, "sampled": stamp} if readings[n].ok else {}),
                }
                for n, s in zip(tracked.signals, spec.signals, strict=True)
            ],
            "lastDecision": {
                "direction": decision.direction.value,
                "desired": decision.desired,
                "reason": decision.reason[:1024],
                "time": stamp,
            },
            "conditions": decision_conditions(
                previous,
                decision,
                stamp,
                meta.get("generation"),
                scale_error,
                {n: r.problem for n, r in readings.items() if r.problem},
            ),
        }
        if scaled:
            status["lastScaleTime"] = stamp
        await self.custom.patch_namespaced_custom_object_status(
            labels.GROUP,
            labels.VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {"status": status},
            _content_type=MERGE_PATCH,
        )

    async def _write_failure(self, obj: dict[str, Any], reason: str, message: str) -> None:
        meta = obj["metadata"]
        previous = (obj.get("status") or {}).get("conditions") or []
        status = {
            "observedGeneration": meta.get("generation"),
            "conditions": failure_conditions(
                previous, reason, message, now_iso(self.clock()), meta.get("generation")
            ),
        }
        await self.custom.patch_namespaced_custom_object_status(
            labels.GROUP,
            labels.VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {"status": status},
            _content_type=MERGE_PATCH,
        )

    async def _announce(
        self, obj, tracked: _Tracked, spec, decision: ScalingDecision, scaled: bool, scale_error: str
    ):
        if scale_error:
            await self._event(obj, tracked, "FailedRescale", scale_error, warning=True)
        elif scaled:
            await self._event(obj, tracked, "SuccessfulRescale", decision.reason, once=False)
        elif decision.missing_data:
            await self._event(obj, tracked, "MissingData", decision.reason, warning=True)
        elif decision.limited_by == "InsufficientCapacity":
            await self._event(obj, tracked, "InsufficientCapacity", decision.reason, warning=True)
        elif spec.mode == AutoscalerMode.RECOMMEND_ONLY and decision.direction is not Direction.HOLD:
            await self._event(obj, tracked, "Recommendation", f"RecommendOnly: {decision.reason}", once=False)
        else:
            tracked.last_event = ""

    async def _event(
        self,
        obj,
        tracked: _Tracked | None,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        once: bool = True,
    ) -> None:
        """Record a Kubernetes Event; a lasting state (missing data, a full cluster) is announced once."""
        if once and tracked is not None and tracked.last_event == reason:
            return
        if tracked is not None:
            tracked.last_event = reason
        meta = obj["metadata"]
        stamp = now_iso(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": labels.API_VERSION,
                "kind": "InferenceAutoscaler",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT_NAME},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(meta["namespace"], body)
        except ApiException as exc:  # an event is best effort; the status already says it
            log.warning(
                "%s/%s: cannot record event %s: HTTP %s", meta["namespace"], meta["name"], reason, exc.status
            )


# ---------------------------------------------------------------------------------------------- entry point
async def _serve_metrics(metrics: AutoscalerMetrics, host: str, port: int) -> tuple[web.AppRunner, int]:
    async def handle(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    return runner, bound


async def run_autoscaler(
    prometheus_url: str,
    stop: asyncio.Event,
    *,
    kubeconfig: str | None = None,
    interval: float = 2.0,
    metrics_host: str = "0.0.0.0",
    metrics_port: int | None = None,
    lease_namespace: str | None = None,
    selector: str = DEFAULT_SELECTOR,
    identity: str | None = None,
    metrics: AutoscalerMetrics | None = None,
    started: asyncio.Future | None = None,
    drain_seconds: float = DRAIN_SECONDS,
) -> None:
    """Run the autoscaler until ``stop`` is set. ``started`` (if given) receives the metrics port."""
    api_client = await _api_client(kubeconfig)
    prometheus = PrometheusClient(prometheus_url)
    metrics = metrics or AutoscalerMetrics()
    runner = None
    try:
        port = None
        if metrics_port is not None:
            runner, port = await _serve_metrics(metrics, metrics_host, metrics_port)
            log.info("metrics on http://%s:%d/metrics", metrics_host, port)
        if started is not None and not started.done():
            started.set_result(port)
        controller = AutoscalerController(
            api_client,
            prometheus,
            lease_namespace=lease_namespace or os.environ.get("POD_NAMESPACE", "default"),
            tick_seconds=interval,
            selector=selector,
            metrics=metrics,
            identity=identity,
            drain_seconds=drain_seconds,
        )
        await controller.run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
        await prometheus.close()
        await api_client.close()


async def _api_client(kubeconfig: str | None) -> client.ApiClient:
    configuration = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)
