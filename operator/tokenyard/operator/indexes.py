"""What Kopf's in-memory indexes keep of each pod and node: pure summaries of the objects' fields.

The adapter registers one index per function (`handlers.pod_gpus`, `.engine_pods`, `.nodes`) and reads them
through `node_view.ClusterView` and `group_views.group_views`. Each function returns the index entry
({key: value}) or None when the object does not belong in the index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenyard.core import labels as keys
from tokenyard.operator.manifests import planned_node
from tokenyard.operator.status import parse_timestamp

ENGINE_SELECTOR = {keys.MANAGED_BY: keys.MANAGED_BY_VALUE, keys.COMPONENT: keys.COMPONENT_ENGINE}


def gpus_of(spec: Mapping[str, Any]) -> int:
    """GPUs a pod asks for: its containers' limits (or requests) of the GPU resource."""
    total = 0
    for container in spec.get("containers", []):
        resources = container.get("resources", {})
        value = resources.get("limits", {}).get(keys.GPU_RESOURCE) or resources.get("requests", {}).get(
            keys.GPU_RESOURCE
        )
        total += int(value or 0)
    return total


def pod_gpus_entry(
    name: str, namespace: str, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[str, tuple[str, int]] | None:
    """node -> ("namespace/name", GPUs) of a live pod bound or pinned there (every workload, not only ours)."""
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = gpus_of(dict(spec))
    node = spec.get("nodeName") or planned_node({"spec": dict(spec)})
    if not gpus or not node:
        return None
    return {node: (f"{namespace}/{name}", gpus)}


def engine_pod_entry(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> dict[tuple[str, str], dict[str, Any]] | None:
    """(namespace, deployment) -> a summary of one engine pod (what `group_views` reads)."""
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


def node_entry(
    name: str, labels: Mapping[str, str], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[None, dict[str, Any]]:
    """None -> a summary of one node (all nodes under one key; what `node_view.nodes_from` reads)."""
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
