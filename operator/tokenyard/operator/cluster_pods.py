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

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import watch
from tokenyard.operator.indexes import pod_gpus_entry

log = logging.getLogger("tokenyard.operator")

RETRY_SECONDS = 2.0
LIST_TIMEOUT_SECONDS = 60
WATCH_SECONDS = 120


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


class TableOnceSynced(Mapping[str, list[tuple[str, int]]]):
    """The table once its first list has arrived, `fallback` (Kopf's index of the watched namespaces) before:
    read at every access, so a reconcile loop started before the first list moves over when it lands."""

    def __init__(self, table: PodGpuTable, fallback: Mapping[str, Any]):
        self._table = table
        self._fallback = fallback

    def _current(self) -> Mapping[str, Any]:
        return self._table if self._table.synced.is_set() else self._fallback

    def __getitem__(self, node: str) -> Any:
        return self._current()[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


async def watch_pod_gpus(api: k8s.ApiClient, table: PodGpuTable) -> None:
    """List then watch the pods of every namespace into `table` until cancelled. A watch that ends (the server's
    timeout) resumes from the last resourceVersion seen; anything else (410 Gone, an API server away, a decode
    error) is logged and followed by a fresh list."""
    core = k8s.CoreV1Api(api)
    version: str | None = None
    while True:
        try:
            if version is None:
                response = await core.list_pod_for_all_namespaces(
                    _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS
                )
                listed = json.loads(await response.read())
                table.replace(listed.get("items", []))
                version = listed["metadata"]["resourceVersion"]
            async with watch.Watch() as stream:
                # the client-side timeout outlasts the server's, so a dead connection cannot hang the watch
                async for event in stream.stream(
                    core.list_pod_for_all_namespaces,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_SECONDS + 30,
                ):
                    # kubernetes_asyncio raises ApiException on an ERROR event (410 Gone included)
                    table.apply(event["type"], event["raw_object"])
                    version = event["raw_object"].get("metadata", {}).get("resourceVersion", version)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever broke the watch, the table must be listed again
            version = None
            log.warning(
                f"watch of the pods of all namespaces failed ({e!r}); GPU accounting relists in {RETRY_SECONDS:g} s"
            )
            await asyncio.sleep(RETRY_SECONDS)
