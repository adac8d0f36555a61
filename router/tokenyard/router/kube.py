"""Kubernetes discovery: watches engine pods and ModelDeployments of one namespace and feeds
``discovery.models_from_cluster`` (the pure part, unit-tested). Watch-driven; lists once per (re)connect and
never calls the API server per request. ``connect`` runs first and fails the start-up when the cluster cannot
be read; ``run`` then watches (call ``connect`` before it)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import aiohttp
from tokenyard.core import labels
from tokenyard.router.discovery import models_from_cluster
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")

PLURAL = "modeldeployments"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
CONNECT_TIMEOUT_S = 10.0


class DiscoveryUnavailable(RuntimeError):
    """Kubernetes discovery cannot start; the message names the kubeconfig or API server and what failed.
    Raised at start-up only: a router that cannot see its cluster must fail loudly (and be restarted), not
    serve "no models". Once running, a lost watch is retried instead."""


class KubeDiscovery:
    def __init__(
        self, state: RouterState, metrics: RouterMetrics, kubeconfig: str | None, namespace: str | None
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._synced_kinds: set[str] = set()

    def recompute(self) -> None:
        gone = self.state.set_models(models_from_cluster(self.pods.values(), self.deployments.values()))
        for endpoint in gone:
            self.metrics.forget_replica(endpoint.name)

    @property
    def source(self) -> str:
        return f"kubeconfig {self.kubeconfig}" if self.kubeconfig else "the in-cluster service account"

    async def _load_config(self) -> None:
        from kubernetes_asyncio import config

        if self.kubeconfig and not os.path.isfile(self.kubeconfig):
            raise DiscoveryUnavailable(f"{self.source} cannot be loaded: no such file")
        try:
            if self.kubeconfig:
                await config.load_kube_config(config_file=self.kubeconfig)
                if not self.namespace:
                    _, context = config.list_kube_config_contexts(config_file=self.kubeconfig)
                    self.namespace = (context.get("context") or {}).get("namespace") or "default"
            else:
                config.load_incluster_config()
                if not self.namespace:
                    with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as handle:
                        self.namespace = handle.read().strip()
        except Exception as error:  # a missing file, bad YAML, no current context: all mean "cannot start"
            reason = " ".join(str(error).split())  # YAML errors span lines; the message is one
            raise DiscoveryUnavailable(f"{self.source} cannot be loaded: {reason}") from None

    async def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Load the configuration and list the ModelDeployments once, so that an unreadable kubeconfig, an
        unreachable API server, a missing CRD or missing RBAC stop the start-up with a message naming it."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        await self._load_config()
        async with client.ApiClient() as api:
            host = api.configuration.host
            where = f"the Kubernetes API server at {host} (from {self.source})"
            try:
                await asyncio.wait_for(
                    client.CustomObjectsApi(api).list_namespaced_custom_object(
                        labels.GROUP, labels.VERSION, self.namespace, PLURAL, limit=1
                    ),
                    timeout_s,
                )
            except ApiException as error:
                raise DiscoveryUnavailable(
                    f"{where} refused to list {PLURAL}.{labels.GROUP} in namespace {self.namespace}: "
                    f"{error.status} {error.reason}"
                ) from None
            except TimeoutError:
                raise DiscoveryUnavailable(f"{where} did not answer within {timeout_s:.0f}s") from None
            except (aiohttp.ClientError, OSError) as error:
                raise DiscoveryUnavailable(f"{where} is unreachable: {error}") from None

    async def run(self) -> None:
        from kubernetes_asyncio import client

        async with client.ApiClient() as api:
            core = client.CoreV1Api(api)
            custom = client.CustomObjectsApi(api)
            selector = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE}"
            await asyncio.gather(
                self._watch(
                    "pods",
                    lambda **kw: core.list_namespaced_pod(self.namespace, label_selector=selector, **kw),
                    self.pods,
                    api.sanitize_for_serialization,
                ),
                self._watch(
                    PLURAL,
                    lambda **kw: custom.list_namespaced_custom_object(
                        labels.GROUP, labels.VERSION, self.namespace, PLURAL, **kw
                    ),
                    self.deployments,
                    lambda obj: obj,
                ),
            )

    async def _watch(self, kind: str, list_fn: Callable[..., Any], store: dict, to_dict: Callable) -> None:
        from kubernetes_asyncio import watch

        backoff = 0.5
        while True:
            try:
                listing = to_dict(await list_fn())
                store.clear()
                for item in listing.get("items") or ():
                    store[item["metadata"]["name"]] = item
                version = listing["metadata"].get("resourceVersion")
                self._synced_kinds.add(kind)
                if len(self._synced_kinds) == 2:
                    self.synced.set()
                self.recompute()
                async with watch.Watch() as stream:
                    async for event in stream.stream(list_fn, resource_version=version, timeout_seconds=300):
                        obj = to_dict(event["object"])
                        if event["type"] == "ERROR":
                            raise RuntimeError(f"watch of {kind} failed: {obj}")
                        name = obj["metadata"]["name"]
                        if event["type"] == "DELETED":
                            store.pop(name, None)
                        else:
                            store[name] = obj
                        self.recompute()
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as error:  # reconnect on any watch failure; the list re-syncs what was missed
                log.warning(
                    "watch of %s in namespace %s failed (%r); reconnecting in %.1fs",
                    kind,
                    self.namespace,
                    error,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
