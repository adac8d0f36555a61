"""The nodes as the placement planner sees them: Kopf's node summaries, the GPUs that pods hold on each, and
the GPUs the ledger has promised to pods not seen yet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenyard.core import labels as keys
from tokenyard.operator.ledger import GpuLedger
from tokenyard.operator.placement import Node

# One node as the `nodes` index summarises it: name, labels, gpus (allocatable), ready, schedulable.
NodeSummary = Mapping[str, Any]
# node name -> ("namespace/pod", GPUs) of every live pod bound or pinned there (the `pod_gpus` index).
PodGpus = Mapping[str, Iterable[tuple[str, int]]]


def nodes_from(
    summaries: Iterable[NodeSummary],
    pod_gpus: PodGpus,
    ledger: GpuLedger,
    now: float,
    ignore_pods: frozenset[str] = frozenset(),
) -> list[Node]:
    """Nodes with the GPUs in use on each: live pods' and the ledger's. `ignore_pods` ("namespace/name") are
    being deleted and their GPUs count as free. Pods seen here leave the ledger (the index counts them now)."""
    summaries = list(summaries)
    seen_pods: set[str] = set()
    used: dict[str, int] = {}
    # Pods per node let best fit prefer the busier of two equal nodes (packing keeps the emptier one whole).
    pods: dict[str, int] = {}
    for summary in summaries:
        node = summary["name"]
        for pod_key, gpus in pod_gpus.get(node, []):
            seen_pods.add(pod_key)
            if pod_key in ignore_pods:
                continue
            used[node] = used.get(node, 0) + gpus
            pods[node] = pods.get(node, 0) + 1
    for node, reserved in ledger.used_by_node(seen_pods, now).items():
        used[node] = used.get(node, 0) + reserved.gpus
        pods[node] = pods.get(node, 0) + reserved.pods
    return [
        Node(
            name=s["name"],
            labels=s["labels"],
            gpu_allocatable=s["gpus"],
            gpu_used=used.get(s["name"], 0),
            gpu_pods=pods.get(s["name"], 0),
            gpu_product=s["labels"].get(keys.NODE_GPU_PRODUCT, ""),
            ready=s["ready"],
            schedulable=s["schedulable"],
        )
        for s in summaries
    ]


class ClusterView:
    """Kopf's live `nodes` and `pod_gpus` indexes with the ledger: read again whenever asked, so that the
    placement lock sees what other deployments placed a moment ago."""

    def __init__(self, node_index: Mapping[Any, Iterable[NodeSummary]], pod_gpus: PodGpus, ledger: GpuLedger):
        self._node_index = node_index
        self._pod_gpus = pod_gpus
        self.ledger = ledger

    def nodes(self, now: float, ignore_pods: frozenset[str] = frozenset()) -> list[Node]:
        return nodes_from(self._node_index.get(None, []), self._pod_gpus, self.ledger, now, ignore_pods)
