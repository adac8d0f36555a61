"""The Kopf shell: start-up, the indexes, and one reconcile loop per ModelDeployment: read, plan, apply.

Level-based: each ModelDeployment has a daemon that re-derives the truth from Kopf's in-memory indexes of
engine pods (`indexes`, grouped by `group_views`), of GPU use per node and of nodes (`node_view`, with the
`ledger` of GPUs promised to pods not seen yet). Each iteration takes one typed `snapshot`, fetches the
rollout analysis' verdict when a canary runs (the only read outside the cluster), asks `reconcile_plan.plan`
what to do, applies it (`apply_plan`: deletions, then new groups placed by `group_placement`), writes the
status that `status.compute_status` computes, exports the metrics and publishes the deployment's
InferencePool when the cluster serves that API (`kube_writes.InferencePools`); then it sleeps until a pod of
the deployment changes or the resync interval passes. Everything it needs is in the cluster, so a restarted
operator (even after kill -9 mid-update) converges from what it finds: pods carry their group, rank, revision
and planned node. Settings are read at start-up (`settings.OperatorSettings`), never at import.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError
from tokenyard.core import labels as keys
from tokenyard.core.types import RolloutStrategy
from tokenyard.operator import indexes, reconcile_plan
from tokenyard.operator.apply_plan import apply_plan
from tokenyard.operator.canary_plan import rollout_position
from tokenyard.operator.group_views import group_views
from tokenyard.operator.kube_writes import Events
from tokenyard.operator.node_view import ClusterView
from tokenyard.operator.pacing import delay_before_reconcile
from tokenyard.operator.placement import GroupShape
from tokenyard.operator.runtime import Runtime
from tokenyard.operator.settings import OperatorSettings, SettingError
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot
from tokenyard.operator.status import compute_status, invalid_spec_status

log = logging.getLogger("tokenyard.operator")

RUNTIME = Runtime()


# ----------------------------------------------------------------------------- start-up


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    try:
        ours = OperatorSettings.from_environment(os.environ)
    except SettingError as e:
        raise kopf.PermanentError(str(e)) from None  # the operator stops, naming the variable
    settings.networking.request_timeout = 10
    settings.networking.connect_timeout = 5
    # A watch that silently dies is Kopf's most reported failure: make the server end it and reconnect.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.persistence.finalizer = "tokenyard.dev/finalizer"
    settings.peering.lifetime = ours.peering_lifetime_seconds
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tokenyard.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tokenyard.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    RUNTIME.kopf_settings = settings
    if RUNTIME.stop_flag is not None:
        # Kopf installs its signal handlers as its tasks start, about when this handler runs; a second later
        # ours replace them for certain (a signal before that gets Kopf's own, slower, way out).
        asyncio.get_running_loop().call_later(1.0, RUNTIME.take_over_signals)
    if ours.kubeconfig:
        await k8s_config.load_kube_config(config_file=ours.kubeconfig)
    else:
        k8s_config.load_incluster_config()
    log.info(
        "rollout analysis reads %s", ours.prometheus_url or "no Prometheus (every analysis is inconclusive)"
    )
    RUNTIME.start(ours, k8s.ApiClient())
    if RUNTIME.namespaced:
        try:
            await RUNTIME.watch_cluster_pods(first_list_timeout=30)
        except TimeoutError:
            log.warning(
                "no list of the pods of all namespaces within 30 s (RBAC?); until one succeeds, placement counts "
                "only the GPUs of the watched namespaces' pods (other namespaces' pods hold GPUs it cannot see)"
            )
    if RUNTIME.pools.enabled:
        try:  # say at start-up whether InferencePools will be published; each reconcile re-checks on a timer
            await RUNTIME.pools.served()
        except (ApiException, OSError, aiohttp.ClientError) as e:
            log.warning(
                f"InferencePool API discovery failed at start-up ({e}); the first reconcile asks again"
            )


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # Kopf's own readers, not a client library's: they read $KUBECONFIG when called, not when imported.
    in_pod = kopf.login_with_service_account(**kwargs)
    if in_pod is not None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        # Kopf's reader dials https://kubernetes.default.svc, which needs cluster DNS (a hostNetwork pod or a
        # cluster without it has none); the address the kubelet puts in the env is what client-go and our
        # own API client (load_incluster_config in `configure`) use, so both clients reach the same server.
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host  # an IPv6 Service address
        in_pod = dataclasses.replace(in_pod, server=f"https://{host}:{port}")
    return in_pod or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    await RUNTIME.stop_watching_cluster_pods()
    if RUNTIME.api is not None:
        await RUNTIME.api.close()


@kopf.on.probe(id="indexes")
def alive(**_: Any) -> bool:
    return RUNTIME.api is not None


# ----------------------------------------------------------------------------- indexes


@kopf.index("pods")
def pod_gpus(name: str, namespace: str, spec: Any, status: Any, **_: Any):
    return indexes.pod_gpus_entry(name, namespace, spec, status)


@kopf.index("pods", labels=indexes.ENGINE_SELECTOR)
def engine_pods(
    name: str, namespace: str, labels: Any, annotations: Any, spec: Any, status: Any, meta: Any, **_: Any
):
    return indexes.engine_pod_entry(name, namespace, labels, annotations, spec, status, meta)


@kopf.index("nodes")
def nodes(name: str, labels: Any, spec: Any, status: Any, **_: Any):
    return indexes.node_entry(name, labels, spec, status)


@kopf.on.event("pods", labels=indexes.ENGINE_SELECTOR)
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
    # Kopf's indexes are live mappings: the view reads them again whenever asked. A namespaced operator's
    # `pod_gpus` index misses other namespaces' pods, whose GPUs the placement must not plan on.
    held = RUNTIME.pod_gpus_view(pod_gpus)
    cluster = ClusterView(nodes, held, RUNTIME.ledger)
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
                RUNTIME.metrics.reconcile_errors.labels(namespace, name).inc()
                logger.exception(f"reconcile failed: {e.status} {e.reason}")
        except Exception as e:  # one bad iteration must not end the loop; the next one starts from the truth
            RUNTIME.metrics.reconcile_errors.labels(namespace, name).inc()
            logger.exception(f"reconcile failed: {e}")
        try:
            await asyncio.wait_for(wake.wait(), timeout=RUNTIME.settings.resync_seconds)
        except TimeoutError:
            pass
        await asyncio.sleep(delay_before_reconcile(loop.time(), last_started))
    RUNTIME.forget(key)


async def reconcile(
    body: Any, pods: Iterable[dict[str, Any]], cluster: ClusterView, events: Events, logger: logging.Logger
) -> None:
    # Read.
    now = time.time()
    try:
        snapshot = DeploymentSnapshot.from_body(body)
    except ValidationError as e:
        meta = DeploymentMeta.from_body(body)
        await RUNTIME.writes.patch_status(meta.name, meta.namespace, invalid_spec_status(meta, str(e), now))
        return
    spec = snapshot.spec
    groups = group_views(pods)
    verdict = None
    if spec.rollout.strategy == RolloutStrategy.CANARY:
        position = rollout_position(snapshot, now)
        verdict = await RUNTIME.analysis.observe(
            spec, position.model, snapshot.namespace, position.strategy, position.state, now
        )
    RUNTIME.shapes[snapshot.meta.key] = GroupShape(
        spec.parallelism.pods_per_group, spec.parallelism.pod_gpus, spec.placement.gpu_product
    )
    node_list = cluster.nodes(now)
    # Plan.
    planned = reconcile_plan.plan(
        snapshot, groups, node_list, verdict, now, RUNTIME.settings.bind_timeout_seconds
    )
    # Apply.
    capacity_problem = await apply_plan(RUNTIME, snapshot, planned, cluster, events, logger)
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
    await RUNTIME.writes.patch_status(snapshot.name, snapshot.namespace, status)
    RUNTIME.metrics.export_groups(
        snapshot.meta.key, remaining, capacity_problem, node_list, RUNTIME.shapes.values()
    )
    # Last, so that a gateway-side failure never holds up the groups or the status.
    await RUNTIME.pools.publish(snapshot.meta, spec.engine.port)
