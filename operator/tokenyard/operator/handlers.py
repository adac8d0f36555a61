"""The Kopf adapter: watches, indexes, one reconcile loop per ModelDeployment, and the API writes.

Level-based: each ModelDeployment has a daemon that re-derives the truth from Kopf's in-memory indexes of
engine pods (`group_views`), of GPU use per node and of nodes (`node_view`, with the `ledger` of GPUs promised
to pods not seen yet), takes one typed `snapshot` of the ModelDeployment, runs one step of the rollout state
machine (`canary_plan`, with the analysis' I/O), asks `reconcile_plan.plan_reconcile` what to delete and
create, applies it (new groups are placed by `placement.plan` under the placement lock, where GPU use is
read again), writes the status that `status.compute_status` computes, and sleeps until a pod of the
deployment changes or the resync interval passes. Everything it needs is in the cluster, so a restarted operator (even after kill -9
mid-update) converges from what it finds: pods carry their group, rank, revision and planned node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError
from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec, RolloutStrategy
from tokenyard.operator import metrics
from tokenyard.operator.canary import PrometheusAnalysis, commands_from, state_from_status, strategy_from_spec
from tokenyard.operator.canary_plan import CanaryPlan, canary_plan
from tokenyard.operator.group_views import group_views
from tokenyard.operator.groups import FAILED, READY, GroupView, next_indices, return_to_previous_nodes
from tokenyard.operator.ledger import GpuLedger
from tokenyard.operator.manifests import GroupNames, planned_node, pod_manifest, service_manifest
from tokenyard.operator.node_view import ClusterView
from tokenyard.operator.pacing import delay_before_reconcile
from tokenyard.operator.placement import (
    BEST_FIT,
    SPREAD,
    Assignment,
    GroupRequest,
    GroupShape,
    Node,
    TopologyLevel,
    plan,
    stranded_gpus,
)
from tokenyard.operator.reconcile_plan import RECREATED, Event, plan_reconcile
from tokenyard.operator.revision import revision_hash
from tokenyard.operator.rollout import (
    Observations,
    RolloutState,
    start_rollout,
)
from tokenyard.operator.rollout import step as rollout_step
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot, Events
from tokenyard.operator.status import compute_status, invalid_spec_status, parse_timestamp

log = logging.getLogger("tokenyard.operator")

RESYNC_SECONDS = float(os.environ.get("TOKENYARD_RESYNC_SECONDS", "10"))
BIND_TIMEOUT_SECONDS = float(os.environ.get("TOKENYARD_BIND_TIMEOUT_SECONDS", "30"))
ENGINE_SELECTOR = {keys.MANAGED_BY: keys.MANAGED_BY_VALUE, keys.COMPONENT: keys.COMPONENT_ENGINE}


class Runtime:
    """Process-wide state of the adapter: the API client, wake-up events, GPUs reserved but not yet seen."""

    def __init__(self) -> None:
        self.api: k8s.ApiClient | None = None
        self.wakeups: dict[tuple[str, str], asyncio.Event] = {}
        # GPUs of pods created whose watch event has not reached the index yet: counted as used so that two
        # reconciles in a row never plan the same GPUs twice.
        self.ledger = GpuLedger()
        self.placement_lock = asyncio.Lock()
        self.last_capacity_message: dict[tuple[str, str], str] = {}
        # (namespace, deployment) -> the shape of its groups: best fit protects, and stranded GPUs are measured
        # against, the shapes of every deployment this operator runs, not only the one reconciling.
        self.shapes: dict[tuple[str, str], GroupShape] = {}
        # The rollout analysis, built at start-up from $TOKENYARD_PROMETHEUS_URL (`--prometheus-url`); until
        # then, and without a URL, every look is inconclusive.
        self.analysis = PrometheusAnalysis(None)

    def wakeup(self, key: tuple[str, str]) -> asyncio.Event:
        return self.wakeups.setdefault(key, asyncio.Event())


RUNTIME = Runtime()


# ----------------------------------------------------------------------------- start-up


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.networking.request_timeout = 10
    settings.networking.connect_timeout = 5
    # A watch that silently dies is Kopf's most reported failure: make the server end it and reconnect.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.persistence.finalizer = "tokenyard.dev/finalizer"
    # How long a replica that died without saying goodbye (kill -9, a lost node) blocks its standby peers.
    settings.peering.lifetime = int(os.environ.get("TOKENYARD_PEERING_LIFETIME_SECONDS", "60"))
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tokenyard.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tokenyard.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        await k8s_config.load_kube_config(config_file=kubeconfig)
    else:
        k8s_config.load_incluster_config()
    RUNTIME.api = k8s.ApiClient()
    RUNTIME.analysis = analysis_from_environment()


def analysis_from_environment() -> PrometheusAnalysis:
    """The rollout analysis from the setting (`--prometheus-url`, which `__main__` puts in the environment)."""
    url = os.environ.get("TOKENYARD_PROMETHEUS_URL") or None
    log.info("rollout analysis reads %s", url or "no Prometheus (every analysis is inconclusive)")
    return PrometheusAnalysis(url)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # Kopf's own readers, not a client library's: they read $KUBECONFIG when called, not when imported.
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    if RUNTIME.api is not None:
        await RUNTIME.api.close()


@kopf.on.probe(id="indexes")
def alive(**_: Any) -> bool:
    return RUNTIME.api is not None


# ----------------------------------------------------------------------------- indexes


def _gpus_of(spec: dict[str, Any]) -> int:
    total = 0
    for container in spec.get("containers", []):
        resources = container.get("resources", {})
        value = resources.get("limits", {}).get(keys.GPU_RESOURCE) or resources.get("requests", {}).get(
            keys.GPU_RESOURCE
        )
        total += int(value or 0)
    return total


@kopf.index("pods")
def pod_gpus(
    name: str, namespace: str, spec: Any, status: Any, **_: Any
) -> dict[str, tuple[str, int]] | None:
    """node -> GPUs held by each live pod bound or pinned there (every workload, not only ours)."""
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = _gpus_of(dict(spec))
    node = spec.get("nodeName") or planned_node({"spec": dict(spec)})
    if not gpus or not node:
        return None
    return {node: (f"{namespace}/{name}", gpus)}


@kopf.index("pods", labels=ENGINE_SELECTOR)
def engine_pods(
    name: str, namespace: str, labels: Any, annotations: Any, spec: Any, status: Any, meta: Any, **_: Any
):
    """(namespace, deployment) -> a summary of each engine pod."""
    deployment = labels.get(keys.MODEL_DEPLOYMENT)
    if not deployment:
        return None
    conditions = {c.get("type"): c for c in status.get("conditions", []) or []}
    scheduled = conditions.get("PodScheduled", {})
    unschedulable_since = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable_since = parse_timestamp(scheduled.get("lastTransitionTime"))
    return {
        (namespace, deployment): {
            "name": name,
            "group": int(labels.get(keys.GROUP_INDEX, "-1")),
            "rank": int(labels.get(keys.RANK, "0")),
            "revision": labels.get(keys.REVISION, ""),
            "size": int(annotations.get(keys.ANNOTATION_GROUP_SIZE, "1")),
            "node": spec.get("nodeName"),
            "planned": planned_node({"spec": dict(spec)}),
            "group_nodes": tuple(filter(None, annotations.get(keys.ANNOTATION_GROUP_NODES, "").split(","))),
            "phase": status.get("phase", "Pending"),
            "ready": conditions.get("Ready", {}).get("status") == "True",
            "unschedulable_since": unschedulable_since,
            "terminating": meta.get("deletionTimestamp") is not None,
            "ip": status.get("podIP"),
        }
    }


@kopf.index("nodes")
def nodes(name: str, labels: Any, spec: Any, status: Any, **_: Any):
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []) or []
    )
    blocking = [t for t in spec.get("taints", []) or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    return {
        None: {
            "name": name,
            "labels": dict(labels),
            "gpus": int((status.get("allocatable") or {}).get(keys.GPU_RESOURCE, 0) or 0),
            "ready": ready,
            "schedulable": not spec.get("unschedulable") and not blocking,
        }
    }


@kopf.on.event("pods", labels=ENGINE_SELECTOR)
def engine_pod_changed(namespace: str, labels: Any, **_: Any) -> None:
    deployment = labels.get(keys.MODEL_DEPLOYMENT)
    if deployment:
        RUNTIME.wakeup((namespace, deployment)).set()


# ----------------------------------------------------------------------------- the reconcile loop


@kopf.daemon(keys.GROUP, keys.VERSION, "modeldeployments", cancellation_timeout=10)
async def run_deployment(
    name: str,
    namespace: str,
    body: Any,
    stopped: Any,
    engine_pods: kopf.Index,
    pod_gpus: kopf.Index,
    nodes: kopf.Index,
    logger: logging.Logger,
    **_: Any,
) -> None:
    key = (namespace, name)
    wake = RUNTIME.wakeup(key)
    # Kopf's indexes are live mappings: the view reads them again whenever asked.
    cluster = ClusterView(nodes, pod_gpus, RUNTIME.ledger)
    events = Events(body)
    loop = asyncio.get_running_loop()
    # Errors do not leave this loop: raising (even kopf.TemporaryError) would end the daemon, and Kopf would
    # start it again only after its backoff; the next iteration starts from the truth anyway.
    while not stopped:
        wake.clear()
        last_started = loop.time()
        try:
            await reconcile(body, engine_pods.get(key, []), cluster, events, logger)
        except ApiException as e:
            if e.status == 403 and "being terminated" in str(e.body):
                logger.info("namespace is being deleted; waiting for the ModelDeployment to go")
            else:
                metrics.RECONCILE_ERRORS.labels(namespace, name).inc()
                logger.exception(f"reconcile failed: {e.status} {e.reason}")
        except Exception as e:  # one bad iteration must not end the loop; the next one starts from the truth
            metrics.RECONCILE_ERRORS.labels(namespace, name).inc()
            logger.exception(f"reconcile failed: {e}")
        try:
            await asyncio.wait_for(wake.wait(), timeout=RESYNC_SECONDS)
        except TimeoutError:
            pass
        await asyncio.sleep(delay_before_reconcile(loop.time(), last_started))
    RUNTIME.wakeups.pop(key, None)
    RUNTIME.shapes.pop(key, None)
    metrics.forget_deployment(namespace, name)
    _weighted_revisions.pop(key, None)


async def reconcile(
    body: Any,
    pods: Iterable[dict[str, Any]],
    cluster: ClusterView,
    events: Events,
    logger: logging.Logger,
) -> None:
    now = time.time()
    try:
        snapshot = DeploymentSnapshot.from_body(body)
    except ValidationError as e:
        meta = DeploymentMeta.from_body(body)
        await _patch_status(meta.name, meta.namespace, invalid_spec_status(meta, str(e), now))
        return
    spec, name, namespace = snapshot.spec, snapshot.name, snapshot.namespace
    groups = group_views(pods)
    canary = None
    if spec.rollout.strategy == RolloutStrategy.CANARY:
        canary = await _canary_step(snapshot, events, revision_hash(spec), groups, now)
    RUNTIME.shapes[snapshot.meta.key] = GroupShape(
        spec.parallelism.pods_per_group, spec.parallelism.pod_gpus, spec.placement.gpu_product
    )
    node_list = cluster.nodes(now)
    planned = plan_reconcile(snapshot, groups, node_list, canary, now, BIND_TIMEOUT_SECONDS)

    for deletion in planned.deletions:
        group = deletion.group
        await _delete_group(GroupNames(name, namespace, group.revision, group.index), group)
        if deletion.kind == RECREATED:
            metrics.GROUPS_RECREATED.labels(namespace, name).inc()
        _emit(events, deletion.event)

    capacity_problem = None
    used_indices = {g.index for g in groups}
    for revision, count in planned.creates.items():
        revision_spec = snapshot.spec_of_revision(revision, planned.update_revision)
        if revision_spec is None:
            logger.warning(
                f"cannot recreate groups of revision {revision}: its template is not in the history"
            )
            continue
        dead_groups = list(planned.return_to.get(revision, ()))
        new_groups = NewGroups(revision, revision_spec, count, list(planned.levels), dead_groups)
        problem = await _create_groups(snapshot.meta, events, cluster, new_groups, used_indices)
        capacity_problem = capacity_problem or problem

    remaining = list(planned.remaining)
    status = compute_status(
        snapshot,
        planned.update_revision,
        remaining,
        node_list,
        capacity_problem,
        planned.rollout_status,
        planned.current_revision,
        time.time(),  # when the status is written, which may be seconds after the reconcile began
    )
    await _patch_status(name, namespace, status)
    _export_metrics(namespace, name, remaining, capacity_problem, node_list)


def _emit(events: Events, event: Event) -> None:
    if event.warning:
        events.warn(event.reason, event.message)
    else:
        events.info(event.reason, event.message)


async def _canary_step(
    snapshot: DeploymentSnapshot, events: Events, update_revision: str, groups: list[GroupView], now: float
) -> CanaryPlan:
    """One step of the canary state machine: its targets per revision, and what goes into the status."""
    spec, status = snapshot.spec, snapshot.status
    state = state_from_status(status, update_revision)
    if state.phase.terminal and update_revision not in (state.stable_revision, state.rolled_back_revision):
        state = start_rollout(state, update_revision, now)
    strategy = strategy_from_spec(spec)
    ready = dict(Counter(g.revision for g in groups if g.ready))
    model = spec.model.served_model_name or snapshot.name
    look = await RUNTIME.analysis.observe(spec, model, snapshot.namespace, strategy, state, now)
    observed = Observations(
        ready_groups=ready,
        analysis=look.decision,
        analysis_reason=look.reason,
        analysis_at=look.looked_at,
        commands=commands_from(snapshot.meta.annotations, spec.paused, state),
    )
    decision = rollout_step(strategy, state, observed, now)
    for message in decision.events:
        events.info("Rollout", message)
    plan = canary_plan(decision, look.status, (status.get("rollout") or {}).get("analysis"))
    _export_rollout_metrics(snapshot.meta.key, decision.state, state, plan.traffic, look.status)
    return plan


_weighted_revisions: dict[tuple[str, str], set[str]] = {}


def _export_rollout_metrics(
    key: tuple[str, str],
    new_state: RolloutState,
    old_state: RolloutState,
    traffic: list[dict[str, Any]],
    analysis: Mapping[str, Any] | None,
) -> None:
    namespace, name = key
    for phase in ("Healthy", "Progressing", "Paused", "Promoting", "RollingBack", "RolledBack"):
        metrics.ROLLOUT_PHASE.labels(namespace, name, phase).set(1 if str(new_state.phase) == phase else 0)
    if new_state.phase != old_state.phase:
        metrics.ROLLOUT_TRANSITIONS.labels(namespace, name, str(new_state.phase)).inc()
    metrics.ROLLOUT_STEP.labels(namespace, name).set(new_state.step_index)
    revisions = {weight["revision"] for weight in traffic}
    for gone in _weighted_revisions.get((namespace, name), set()) - revisions:
        metrics.ROLLOUT_WEIGHT.remove(namespace, name, gone)  # a revision out of the traffic loses its series
    _weighted_revisions[(namespace, name)] = revisions
    for weight in traffic:
        metrics.ROLLOUT_WEIGHT.labels(namespace, name, weight["revision"]).set(weight["weight"])
    for verdict in (analysis or {}).get("metrics", []):
        if verdict.get("statistic") is not None:
            metrics.ROLLOUT_ANALYSIS_STATISTIC.labels(namespace, name, verdict["metric"]).set(
                verdict["statistic"]
            )
        metrics.ROLLOUT_ANALYSIS_THRESHOLD.labels(namespace, name, verdict["metric"]).set(
            verdict["threshold"]
        )


@dataclass(frozen=True)
class NewGroups:
    """Groups of one revision that a reconcile creates."""

    revision: str
    spec: ModelDeploymentSpec  # the revision's spec (an older revision's comes from the history)
    count: int
    levels: list[TopologyLevel]
    # groups just deleted because a member died: their replacements return to the same nodes when those
    # still have the GPUs
    dead_groups: list[GroupView]


async def _create_groups(
    meta: DeploymentMeta, events: Events, cluster: ClusterView, new: NewGroups, used_indices: set[int]
) -> str | None:
    """Place and create the new groups; return the capacity problem when some could not be placed.
    `used_indices` is shared by every revision created in one reconcile, and grows with the new groups."""
    name, namespace, spec, revision = meta.name, meta.namespace, new.spec, new.revision
    par = spec.parallelism
    indices = next_indices(used_indices, new.count)
    used_indices.update(indices)
    strategy = SPREAD if spec.placement.strategy == "Spread" else BEST_FIT
    requests = [
        GroupRequest(
            key=f"{name}/{index}",
            pods=par.pods_per_group,
            gpus_per_pod=par.pod_gpus,
            gpu_product=spec.placement.gpu_product,
            required_level=spec.placement.required,
            preferred_level=spec.placement.preferred,
            strategy=strategy,
        )
        for index in indices
    ]
    # The dead groups' pods may still be in the index (deleted a moment ago): their GPUs count as free.
    dead_pods = frozenset(f"{namespace}/{m.name}" for g in new.dead_groups for m in g.members)
    placed: list[tuple[int, Assignment]] = []
    async with RUNTIME.placement_lock:
        # Re-read GPU use inside the lock: another deployment may have just placed groups.
        started = time.perf_counter()
        now = time.time()
        free = {
            n.name: n.gpu_free
            for n in cluster.nodes(now, dead_pods)
            if n.eligible and (not spec.placement.gpu_product or n.gpu_product == spec.placement.gpu_product)
        }
        previous = [g.recorded_nodes for g in new.dead_groups if len(g.recorded_nodes) == par.pods_per_group]
        returned = return_to_previous_nodes(indices, previous, free, par.pod_gpus)
        to_plan = []
        for index, request in zip(indices, requests, strict=True):
            nodes = returned.get(index)
            if nodes is None:
                to_plan.append((index, request))
                continue
            product = spec.placement.gpu_product or ""
            placed.append((index, Assignment(request.key, nodes, par.pod_gpus, product, RETURNED)))
            _reserve(cluster.ledger, GroupNames(name, namespace, revision, index), nodes, par.pod_gpus, now)
        shapes = {*RUNTIME.shapes.values(), *(r.shape for r in requests)}
        # Nodes read again: the returned groups' reservations are in them now.
        result = plan(
            cluster.nodes(now, dead_pods), [r for _, r in to_plan], new.levels, shapes_in_use=list(shapes)
        )
        metrics.PLACEMENT_SECONDS.observe(time.perf_counter() - started)
        for index, request in to_plan:
            outcome = result.results[request.key]
            if isinstance(outcome, Assignment):
                placed.append((index, outcome))
                names = GroupNames(name, namespace, revision, index)
                _reserve(cluster.ledger, names, outcome.nodes, par.pod_gpus, now)
        # Groups are independent: create them all at once (a burst of API calls, not one round trip after
        # another), and only then report the first failure, so one bad call does not hold back the rest.
        owner = meta.owner_reference()
        outcomes = await asyncio.gather(
            *(_create_group(owner, spec, GroupNames(name, namespace, revision, i), a) for i, a in placed),
            return_exceptions=True,
        )
    first_error: BaseException | None = None
    for (index, assignment), outcome in zip(placed, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            # Its GPUs must not stay reserved for a group that was not made (pods that were made are in the
            # index and count there); the next reconcile places it again.
            _release(cluster.ledger, GroupNames(name, namespace, revision, index), len(assignment.nodes))
            first_error = first_error or outcome
            continue
        where = (
            "back on the nodes of the group it replaces"
            if assignment.level == RETURNED
            else f"within one {assignment.level}"
        )
        events.info(
            "GroupPlaced", f"group {index} (revision {revision}) on {', '.join(assignment.nodes)} {where}"
        )
    problems = [u.reason for u in result.unplaceable]
    message = f"{len(problems)} group(s) cannot be placed: {problems[0]}" if problems else None
    if message is None:
        RUNTIME.last_capacity_message.pop(meta.key, None)
    elif RUNTIME.last_capacity_message.get(meta.key) != message:
        events.warn("InsufficientCapacity", message)
        RUNTIME.last_capacity_message[meta.key] = message
    if first_error is not None:
        raise first_error
    return message


RETURNED = "returned"  # Assignment.level of a recreated gang put back on its previous nodes


def _reserve(
    ledger: GpuLedger, names: GroupNames, nodes: tuple[str, ...], gpus_per_pod: int, now: float
) -> None:
    for rank, node in enumerate(nodes):
        ledger.reserve(f"{names.namespace}/{names.pod(rank)}", node, gpus_per_pod, now)


def _release(ledger: GpuLedger, names: GroupNames, pods: int) -> None:
    for rank in range(pods):
        ledger.release(f"{names.namespace}/{names.pod(rank)}")


async def _create_group(
    owner: dict[str, Any], spec: ModelDeploymentSpec, names: GroupNames, assignment: Assignment
) -> None:
    core = k8s.CoreV1Api(RUNTIME.api)
    service = service_manifest(names)
    service["metadata"]["ownerReferences"] = [owner]
    service["spec"]["ports"][0]["port"] = spec.engine.port
    pods = []
    for rank, node in enumerate(assignment.nodes):
        pod = pod_manifest(spec, names, rank, node, assignment.nodes)
        pod["metadata"]["ownerReferences"] = [owner]
        pods.append(pod)
    calls = [core.create_namespaced_service(names.namespace, service)]
    calls += [core.create_namespaced_pod(names.namespace, pod) for pod in pods]
    outcomes = await asyncio.gather(*(_create_ignoring_conflict(c) for c in calls), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def _create_ignoring_conflict(call) -> None:
    try:
        await call
    except ApiException as e:
        if e.status != 409:  # already there: a previous, interrupted reconcile created it
            raise


async def _delete_group(names: GroupNames, group: GroupView) -> None:
    core = k8s.CoreV1Api(RUNTIME.api)
    for member in group.members:
        try:
            await core.delete_namespaced_pod(member.name, names.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
    try:
        await core.delete_namespaced_service(names.service, names.namespace)
    except ApiException as e:
        if e.status != 404:
            raise


# ----------------------------------------------------------------------------- status


async def _patch_status(name: str, namespace: str, status: dict[str, Any]) -> None:
    api = k8s.CustomObjectsApi(RUNTIME.api)
    try:
        await api.patch_namespaced_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            namespace,
            "modeldeployments",
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )
    except ApiException as e:
        if e.status != 404:  # deleted meanwhile
            raise


def _export_metrics(
    namespace: str,
    name: str,
    groups: list[GroupView],
    capacity_problem: str | None,
    node_list: list[Node],
) -> None:
    phases: dict[str, int] = {}
    for g in groups:
        phases[g.phase] = phases.get(g.phase, 0) + 1
    for phase in ("Pending", "Placed", READY, FAILED, "Terminating"):
        metrics.GROUPS.labels(namespace, name, phase).set(phases.get(phase, 0))
    metrics.PENDING_GROUPS.labels(namespace, name, "InsufficientCapacity").set(1 if capacity_problem else 0)
    eligible = [n for n in node_list if n.eligible]
    metrics.GPUS.labels("allocated").set(sum(min(n.gpu_used, n.gpu_allocatable) for n in eligible))
    metrics.GPUS.labels("free").set(sum(n.gpu_free for n in eligible))
    metrics.GPUS.labels("stranded").set(stranded_gpus(eligible, list(set(RUNTIME.shapes.values()))))
