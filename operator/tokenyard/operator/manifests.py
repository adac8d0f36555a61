"""Pure builders of the objects the operator writes: a replica group's pods and headless Service, and the
Gateway API Inference Extension's `InferencePool` of a ModelDeployment.

Names come from one place (`GroupNames`) so that the operator, its tests and the router agree on them.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenyard.core import labels
from tokenyard.core.engines import EngineKind
from tokenyard.core.metrics import REQUESTS_RUNNING, REQUESTS_WAITING
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.engine_command import GroupRank, render_launch

# A DNS label holds 63 characters; the Service name also carries "-<revision>-<index>".
_NAME_BUDGET = 40
STARTUP_PROBE_PERIOD_SECONDS = 10
# Time an engine gets after SIGTERM (past the preStop drain) to close its sockets and free the GPUs.
ENGINE_SHUTDOWN_SECONDS = 30
# The gauges whose sum is an engine's open requests (running and waiting), which the leader's preStop hook
# (drain_wait) reads from the engine's own /metrics to end the drain when they are all done.
OPEN_REQUEST_GAUGES = {
    kind: (REQUESTS_RUNNING[i], REQUESTS_WAITING[i])
    for i, kind in enumerate((EngineKind.VLLM, EngineKind.SGLANG))
}


def pre_stop(kind: EngineKind, port: int, drain_seconds: int, leader: bool) -> dict[str, Any]:
    """The preStop hook of a rendered engine's container (see drain_wait)."""
    if not leader:
        return {"sleep": {"seconds": drain_seconds}}
    url = f"http://127.0.0.1:{port}/metrics"
    command = ["python3", "-c", _drain_wait_source(), url, str(drain_seconds), *OPEN_REQUEST_GAUGES[kind]]
    return {"exec": {"command": command}}


@functools.cache
def _drain_wait_source() -> str:
    """drain_wait.py as the pod runs it: its code without the docstrings, which only the repository needs."""
    tree = ast.parse(Path(__file__).with_name("drain_wait.py").read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@dataclass(frozen=True)
class GroupNames:
    deployment: str
    namespace: str
    revision: str
    index: int

    @property
    def service(self) -> str:
        return f"{self.deployment[:_NAME_BUDGET].rstrip('-')}-{self.revision[:8]}-{self.index}"

    def pod(self, rank: int) -> str:
        return f"{self.service}-{rank}"

    @property
    def leader_address(self) -> str:
        # Resolves through the headless Service: <hostname>.<subdomain>.<namespace>.svc
        return f"r0.{self.service}.{self.namespace}.svc"


def group_labels(names: GroupNames) -> dict[str, str]:
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.COMPONENT: labels.COMPONENT_ENGINE,
        labels.MODEL_DEPLOYMENT: names.deployment,
        labels.REVISION: names.revision,
        labels.GROUP_INDEX: str(names.index),
    }


def leader_labels(deployment: str) -> dict[str, str]:
    """The labels that pick the deployment's group leaders (rank 0, the only pod of a group serving the API)."""
    return {labels.MODEL_DEPLOYMENT: deployment, labels.ROLE: labels.ROLE_LEADER}


def selector(deployment: str) -> str:
    """The scale subresource's selector: one leader pod per group, so a pod count is a group count."""
    return ",".join(f"{key}={value}" for key, value in leader_labels(deployment).items())


def service_manifest(names: GroupNames) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.service, "namespace": names.namespace, "labels": group_labels(names)},
        "spec": {
            "clusterIP": "None",
            # Members must find each other while they start, before they are Ready.
            "publishNotReadyAddresses": True,
            "selector": group_labels(names),
            "ports": [{"name": labels.ENGINE_PORT_NAME, "port": 8000, "targetPort": labels.ENGINE_PORT_NAME}],
        },
    }


def pod_manifest(
    spec: ModelDeploymentSpec, names: GroupNames, rank: int, node: str, group_nodes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Pod `rank` of the group, pinned to `node` by a required node affinity (kube-scheduler still binds it).
    `group_nodes`, the planned node of every rank, is recorded so a recreated gang can return there."""
    par = spec.parallelism
    pods = par.pods_per_group
    engine = spec.engine
    served = spec.model.served_model_name or names.deployment
    role = labels.ROLE_LEADER if rank == 0 else labels.ROLE_WORKER
    env = [
        {"name": labels.ENV_MODEL_DEPLOYMENT, "value": names.deployment},
        {"name": labels.ENV_SERVED_MODEL_NAME, "value": served},
        {"name": labels.ENV_REVISION, "value": names.revision},
        {"name": labels.ENV_GROUP_INDEX, "value": str(names.index)},
        {"name": labels.ENV_RANK, "value": str(rank)},
        {"name": labels.ENV_GROUP_SIZE, "value": str(pods)},
        {"name": labels.ENV_LEADER_ADDRESS, "value": names.leader_address},
        {"name": labels.ENV_TENSOR_PARALLEL, "value": str(par.tensor)},
        {"name": labels.ENV_PIPELINE_PARALLEL, "value": str(par.pipeline)},
        {"name": labels.ENV_ENGINE_PORT, "value": str(engine.port)},
    ]
    limits: dict[str, str] = {labels.GPU_RESOURCE: str(par.pod_gpus)}
    if engine.resources.cpu:
        limits["cpu"] = engine.resources.cpu
    if engine.resources.memory:
        limits["memory"] = engine.resources.memory
    launch = render_launch(spec, served, GroupRank(rank, pods, names.leader_address))
    container: dict[str, Any] = {"name": "engine", "image": engine.image}
    if launch.command is not None:
        container["command"] = launch.command
    container.update(
        {
            "args": launch.args,
            "env": env + launch.env + [e.dump() for e in engine.env],
            "ports": [{"name": labels.ENGINE_PORT_NAME, "containerPort": engine.port}],
            "resources": {"limits": limits, "requests": dict(limits)},
        }
    )
    if launch.volume_mounts:
        container["volumeMounts"] = launch.volume_mounts
    rendered = engine.kind is not EngineKind.CUSTOM
    if rank == 0:  # only the leader serves the API; workers run the model's other ranks
        if rendered:
            container["startupProbe"] = {
                "httpGet": {"path": "/health", "port": labels.ENGINE_PORT_NAME},
                "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
                "failureThreshold": math.ceil(engine.startup_timeout_seconds / STARTUP_PROBE_PERIOD_SECONDS),
            }
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": labels.ENGINE_PORT_NAME},
            "periodSeconds": 5,
        }
    drain = spec.rollout.drain_seconds
    if rendered and drain > 0:
        # A deleted pod (scale-down, an old revision, a node drain, kubectl delete) leaves the router's endpoints
        # at once, and the engine gets SIGTERM only after the streams it is serving have finished or had the
        # drain period. The leader waits on its engine's open requests, so an idle group frees its GPUs in
        # seconds; a worker cannot see them (its leader may be gone from DNS with the group's Service), so it
        # sleeps the whole period rather than break a group still streaming.
        container["lifecycle"] = {"preStop": pre_stop(engine.kind, engine.port, drain, leader=rank == 0)}
    template = copy.deepcopy(engine.pod_template or {})
    meta = template.get("metadata", {})
    pod_spec = template.get("spec", {})
    if rendered:
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *launch.volumes]
        pod_spec.setdefault("terminationGracePeriodSeconds", drain + ENGINE_SHUTDOWN_SECONDS)
    pod_spec.update(
        {
            "hostname": f"r{rank}",
            "subdomain": names.service,
            "restartPolicy": "Never",  # a failed member fails the group; the operator recreates the gang
            "containers": [container, *pod_spec.get("containers", [])],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                        ]
                    }
                }
            },
        }
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod(rank),
            "namespace": names.namespace,
            "labels": {
                **meta.get("labels", {}),
                **group_labels(names),
                labels.RANK: str(rank),
                labels.ROLE: role,
            },
            "annotations": {
                **meta.get("annotations", {}),
                labels.ANNOTATION_GROUP_SIZE: str(pods),
                labels.ANNOTATION_GROUP_NODES: ",".join(group_nodes or (node,)),
            },
        },
        "spec": pod_spec,
    }


def group_manifests(
    owner: dict[str, Any], spec: ModelDeploymentSpec, names: GroupNames, nodes: tuple[str, ...]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The headless Service and the pods of one group placed on `nodes` (one per rank), owned by `owner`
    (the ModelDeployment's owner reference), the Service on the engine's port."""
    service = service_manifest(names)
    service["metadata"]["ownerReferences"] = [owner]
    service["spec"]["ports"][0]["port"] = spec.engine.port
    pods = []
    for rank, node in enumerate(nodes):
        pod = pod_manifest(spec, names, rank, node, nodes)
        pod["metadata"]["ownerReferences"] = [owner]
        pods.append(pod)
    return service, pods


def planned_node(pod: dict[str, Any]) -> str | None:
    """The node a pod was pinned to, read back from its affinity."""
    try:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        return terms[0]["matchFields"][0]["values"][0]
    except (KeyError, IndexError, TypeError):
        return None


# ----------------------------------------------------------------------------- InferencePool

# The Inference Extension's GA API (kubernetes-sigs/gateway-api-inference-extension v1.0.0 and later; the CRD
# of v1.6.0 is in tests/fixtures/crds). Its v1alpha2 predecessor (inference.networking.x-k8s.io) was removed
# upstream in v1.5.0 and is not published.
POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_PLURAL = "inferencepools"
POOL_API_VERSION = f"{POOL_GROUP}/{POOL_VERSION}"
EPP_FAILURE_MODES = ("FailClose", "FailOpen")


@dataclass(frozen=True)
class EndpointPicker:
    """The endpoint picker a pool names: tokenyard's router Service and the Service port of its EPP (ext_proc)
    front. The API has no namespace here: the Service must be in the pool's (the ModelDeployment's) namespace."""

    service: str = "tokenyard-router"
    port: int = 9002  # the Inference Extension's customary EPP port, and the chart's router.epp.port
    # What the gateway does when the picker does not answer: FailClose refuses the request, FailOpen lets the
    # gateway pick one of the pool's pods itself (without tokenyard's readiness of whole groups or its scoring).
    failure_mode: str = "FailClose"


def inference_pool_manifest(
    owner: dict[str, Any], deployment: str, namespace: str, engine_port: int, picker: EndpointPicker
) -> dict[str, Any]:
    """The InferencePool of one ModelDeployment, named after it and owned by it (garbage-collected with it).

    It selects the group leaders of every revision (a canary's too: the picker applies the traffic split).
    A selector cannot ask for readiness: a leader is selected from creation on, Ready or not. The gateway
    sends a request only where the picker says (the router names leaders of Ready groups only); a gateway
    that also tracks the pool's pods itself (for FailOpen, or through a shadow Service, as the Inference
    Extension's implementer guide describes) sees them as Service endpoints do, not Ready until Ready.
    Every field the API would default is written, so that a pool read back can be
    compared with this one field by field (`inference_pool_drift`)."""
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": {
            "name": deployment,
            "namespace": namespace,
            "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.MODEL_DEPLOYMENT: deployment},
            "ownerReferences": [owner],
        },
        "spec": {
            "selector": {"matchLabels": leader_labels(deployment)},
            "targetPorts": [{"number": engine_port}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": picker.service,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode,
            },
        },
    }


def inference_pool_drift(desired: dict[str, Any], existing: dict[str, Any] | None) -> list[str]:
    """The fields of `desired` that `existing` (the pool read back, None when there is none) lacks or holds
    otherwise; empty when nothing needs writing. Labels and owners others added are left alone."""
    if existing is None:
        return ["metadata.name"]
    drift = [
        f"spec.{field}"
        for field, value in desired["spec"].items()
        if (existing.get("spec") or {}).get(field) != value
    ]
    meta, have = desired["metadata"], existing.get("metadata") or {}
    have_labels = have.get("labels") or {}
    if any(have_labels.get(key) != value for key, value in meta["labels"].items()):
        drift.append("metadata.labels")
    have_owners = {o.get("uid") for o in have.get("ownerReferences") or []}
    if any(o["uid"] not in have_owners for o in meta["ownerReferences"]):
        drift.append("metadata.ownerReferences")
    return drift
