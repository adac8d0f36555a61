"""The operator's writes to the Kubernetes API: groups created and deleted, the status patched, events posted,
and each ModelDeployment's InferencePool published while the API server serves that API.

Idempotent, so that an interrupted reconcile can be applied again: a create that finds the object already
there (409) and a delete that finds it gone (404) are done, not failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.groups import GroupView
from tokenyard.operator.manifests import (
    POOL_API_VERSION,
    POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
    EndpointPicker,
    GroupNames,
    group_manifests,
    inference_pool_drift,
    inference_pool_manifest,
)
from tokenyard.operator.snapshot import DeploymentMeta, Event

log = logging.getLogger("tokenyard.operator")
FIELD_MANAGER = "tokenyard-operator"


class KubeWrites:
    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api

    async def create_group(
        self, owner: dict[str, Any], spec: ModelDeploymentSpec, names: GroupNames, nodes: tuple[str, ...]
    ) -> None:
        """The group's Service and pods, all at once; raises the first failure once every call is done."""
        core = k8s.CoreV1Api(self.api)
        service, pods = group_manifests(owner, spec, names, nodes)
        calls = [core.create_namespaced_service(names.namespace, service)]
        calls += [core.create_namespaced_pod(names.namespace, pod) for pod in pods]
        outcomes = await asyncio.gather(
            *(_create_ignoring_conflict(c) for c in calls), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def delete_group(self, names: GroupNames, group: GroupView, drain: bool) -> None:
        """Delete the group's pods and Service. ``drain``: a healthy group leaving (scale-down, an old revision
        replaced): its pods get their own grace period, so the preStop sleep lets the streams they serve finish
        while they are already out of the router's endpoints. Otherwise (a gang with a dead member, or one that
        could not bind) at once: it serves nothing whole, and its replacement waits for its GPUs."""
        core = k8s.CoreV1Api(self.api)
        grace = None if drain else 0  # None: the pod's terminationGracePeriodSeconds
        for member in group.members:
            try:
                await core.delete_namespaced_pod(member.name, names.namespace, grace_period_seconds=grace)
            except ApiException as e:
                if e.status != 404:
                    raise
        try:
            await core.delete_namespaced_service(names.service, names.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    async def patch_status(self, name: str, namespace: str, status: dict[str, Any]) -> None:
        api = k8s.CustomObjectsApi(self.api)
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


class InferencePools:
    """Publishes one InferencePool per ModelDeployment while the API server serves the InferencePool API.

    Whether it is served is asked of API discovery (GET /apis/inference.networking.k8s.io/v1, readable by
    every authenticated user) at start-up, then by the reconciles once `recheck_seconds` have passed, one call
    for all deployments: a CRD installed later is picked up within that time, one removed likewise (or at
    once, when a write finds the API gone). The log says when that answer changes, not on every pass.
    Each pass reads the deployment's pool and writes it (server-side apply) only when it differs."""

    def __init__(
        self,
        api: k8s.ApiClient,
        picker: EndpointPicker,
        recheck_seconds: float,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.picker, self.recheck_seconds, self.enabled = api, picker, recheck_seconds, enabled
        self._clock = clock
        self._served: bool | None = None  # the last answer of discovery; None: not asked yet
        self._checked_at = 0.0
        self._forbidden_said = False
        self._refused_said: dict[tuple[str, str], str] = {}  # deployment -> the refusal last logged
        if not enabled:
            log.info("InferencePool publishing is off (TOKENYARD_INFERENCE_POOL=off)")

    async def served(self) -> bool:
        now = self._clock()
        if self._served is None or now - self._checked_at >= self.recheck_seconds:
            self._checked_at = now
            served = await self._discover()
            log.debug(
                f"API discovery: {POOL_PLURAL}.{POOL_API_VERSION} {'served' if served else 'not served'}"
            )
            self._note(served)
        return bool(self._served)

    async def publish(self, meta: DeploymentMeta, engine_port: int) -> None:
        """Create or update the pool of one deployment; nothing while the API is not served (or it is off)."""
        if not self.enabled or not await self.served():
            return
        custom = k8s.CustomObjectsApi(self.api)
        desired = inference_pool_manifest(
            meta.owner_reference(), meta.name, meta.namespace, engine_port, self.picker
        )
        try:
            existing = await _read_or_none(
                custom.get_namespaced_custom_object(
                    POOL_GROUP, POOL_VERSION, meta.namespace, POOL_PLURAL, meta.name
                )
            )
            drift = inference_pool_drift(desired, existing)
            if not drift:
                return
            await custom.patch_namespaced_custom_object(
                POOL_GROUP,
                POOL_VERSION,
                meta.namespace,
                POOL_PLURAL,
                meta.name,
                desired,
                field_manager=FIELD_MANAGER,
                force=True,  # the operator owns these fields: a hand edit is put back
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as e:
            if e.status == 404:  # apply creates a missing pool: a 404 is the API gone since discovery
                self._checked_at = float("-inf")  # ask discovery again on the next pass
                return
            if e.status != 403:
                # A pool refused (an admission webhook's 422, a conflict, a 5xx) is the gateway's side: said once
                # per deployment and error, retried on the next pass, never counted as a failed reconcile (the
                # groups and the status were written before).
                said = f"HTTP {e.status} {e.reason}"
                if self._refused_said.get(meta.key) != said:
                    self._refused_said[meta.key] = said
                    log.warning(
                        f"cannot publish InferencePool {meta.namespace}/{meta.name}: {said}: "
                        f"{str(e.body)[:300]}; retrying on each pass"
                    )
                return
            if "being terminated" in str(e.body):  # the namespace goes, and the pool with it
                return
            if not self._forbidden_said:
                self._forbidden_said = True
                log.warning(
                    f"InferencePools cannot be published: the operator may not read or write {POOL_PLURAL}."
                    f"{POOL_GROUP} ({e.reason}); grant it (chart: inferencePool.enabled=true) or set "
                    "TOKENYARD_INFERENCE_POOL=off"
                )
            return
        self._forbidden_said = False
        self._refused_said.pop(meta.key, None)
        what = "created" if existing is None else f"updated ({', '.join(drift)})"
        log.info(f"InferencePool {meta.namespace}/{meta.name} {what}")

    async def _discover(self) -> bool:
        try:
            resources = await self.api.call_api(
                f"/apis/{POOL_API_VERSION}",
                "GET",
                header_params={"Accept": "application/json"},
                response_types_map={200: "V1APIResourceList"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return any(r.name == POOL_PLURAL for r in resources.resources or [])

    def _note(self, served: bool) -> None:
        if served == self._served:
            return
        if served:
            log.info(
                f"the API server serves {POOL_PLURAL}.{POOL_API_VERSION}: publishing one InferencePool per "
                f"ModelDeployment (endpoint picker: Service {self.picker.service} port {self.picker.port}, "
                f"{self.picker.failure_mode})"
            )
        else:
            log.info(
                f"the API server does not serve {POOL_PLURAL}.{POOL_API_VERSION} (no InferencePool CRD): no "
                f"InferencePools are published; asked again every {self.recheck_seconds:g}s while ModelDeployments "
                "reconcile"
            )
        self._served = served


async def _read_or_none(call: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return await call
    except ApiException as e:
        if e.status == 404:
            return None
        raise


class Events:
    """Kubernetes Events about one ModelDeployment (Kopf posts them against the body it was given)."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def emit(self, event: Event) -> None:
        if event.warning:
            self.warn(event.reason, event.message)
        else:
            self.info(event.reason, event.message)

    def info(self, reason: str, message: str) -> None:
        kopf.info(self._body, reason=reason, message=message)

    def warn(self, reason: str, message: str) -> None:
        kopf.warn(self._body, reason=reason, message=message)


async def _create_ignoring_conflict(call: Awaitable[Any]) -> None:
    try:
        await call
    except ApiException as e:
        if e.status != 409:  # already there: a previous, interrupted reconcile created it
            raise
