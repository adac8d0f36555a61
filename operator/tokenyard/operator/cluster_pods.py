"""GPUs held by the pods of every namespace, for an operator that watches only some namespaces.

Kopf watches namespaced resources only in the operator's namespaces, so with `--namespace` its `pod_gpus` index
sees none of the GPUs that other namespaces' pods hold: the planner then pins groups on nodes that look free,
kube-scheduler refuses them (Insufficient nvidia.com/gpu), and every re-plan picks the same nodes again. This
module keeps the same summary (`indexes.pod_gpus_entry`) from a watch of its own over all namespaces.

`PodGpuTable` is the pure part (events in, the `pod_gpus` index's shape out); `watch_pod_gpus` is the adapter.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException
from tokenyard.operator.indexes import pod_gpus_entry

log = logging.getLogger("tokenyard.operator")

RETRY_SECONDS = 2.0


def _entry(pod: Mapping[str, Any]) -> tuple[str, tuple[str, int]] | None:
    meta = pod.get("metadata") or {}
    entry = pod_gpus_entry(
        meta.get("name", ""), meta.get("namespace", ""), pod.get("spec") or {}, pod.get("status") or {}
    )
    return next(iter(entry.items())) if entry else None


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class PodGpuTable(Mapping[str, list[tuple[str, int]]]):
    """node -> [("namespace/name", GPUs)] of every live pod bound or pinned there: what Kopf's `pod_gpus` index
    holds, for the pods of all namespaces. Read like the index (`ClusterView` takes either)."""

    def __init__(self) -> None:
        # kept by node as well as by pod: the planner reads every node at each reconcile
        self._node_of: dict[str, str] = {}
        self._by_node: dict[str, dict[str, int]] = {}
        self.synced = asyncio.Event()

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The result of a full list: every pod not in it is gone."""
        self._node_of, self._by_node = {}, {}
        for pod in pods:
            self.apply("ADDED", pod)
        self.synced.set()

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        key, entry = _key(pod), _entry(pod)
        self._forget(key)
        if event_type != "DELETED" and entry is not None:
            node, (_, gpus) = entry
            self._node_of[key] = node
            self._by_node.setdefault(node, {})[key] = gpus

    def _forget(self, key: str) -> None:
        node = self._node_of.pop(key, None)
        if node is not None:
            held = self._by_node[node]
            del held[key]
            if not held:
                del self._by_node[node]

    def __getitem__(self, node: str) -> list[tuple[str, int]]:
        return list(self._by_node[node].items())

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_node)

    def __len__(self) -> int:
        return len(self._by_node)


async def watch_pod_gpus(api: k8s.ApiClient, table: PodGpuTable) -> None:
    """List then watch the pods of every namespace into `table`, relisting after any failure, until cancelled."""
    core = k8s.CoreV1Api(api)
    while True:
        try:
            response = await core.list_pod_for_all_namespaces(_preload_content=False)
            listed = json.loads(await response.read())
            table.replace(listed.get("items", []))
            version = listed["metadata"]["resourceVersion"]
            async with watch.Watch() as stream:
                async for event in stream.stream(
                    core.list_pod_for_all_namespaces, resource_version=version, timeout_seconds=120
                ):
                    if event["type"] == "ERROR":
                        break  # 410 Gone and the like: list again
                    table.apply(event["type"], event["raw_object"])
        except asyncio.CancelledError:
            raise
        except (ApiException, OSError, aiohttp.ClientError, ValueError, KeyError) as e:
            log.warning(f"watch of the pods of all namespaces failed ({e}); GPU accounting relists in 2 s")
            await asyncio.sleep(RETRY_SECONDS)
