"""The operator's writes to the Kubernetes API: groups created and deleted, the status patched, events posted.

Idempotent, so that an interrupted reconcile can be applied again: a create that finds the object already
there (409) and a delete that finds it gone (404) are done, not failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import kopf
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.groups import GroupView
from tokenyard.operator.manifests import GroupNames, group_manifests
from tokenyard.operator.snapshot import Event


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

    async def delete_group(self, names: GroupNames, group: GroupView) -> None:
        core = k8s.CoreV1Api(self.api)
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
