"""Pure builders of the objects a replica group is made of: its pods and its headless Service.

Names come from one place (`GroupNames`) so that the operator, its tests and the router agree on them.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from tokenyard.core import labels
from tokenyard.core.engines import EngineKind
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.engine_command import GroupRank, render_launch

# A DNS label holds 63 characters; the Service name also carries "-<revision>-<index>".
_NAME_BUDGET = 40
STARTUP_PROBE_PERIOD_SECONDS = 10
# Time an engine gets after SIGTERM (past the preStop drain) to close its sockets and free the GPUs.
ENGINE_SHUTDOWN_SECONDS = 30


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


def selector(deployment: str) -> str:
    """The scale subresource's selector: one leader pod per group, so a pod count is a group count."""
    return f"{labels.MODEL_DEPLOYMENT}={deployment},{labels.ROLE}={labels.ROLE_LEADER}"


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
        # Deleted out of band (a node drain, kubectl delete): the pod leaves the router's endpoints at once, and
        # the engine gets SIGTERM only after the streams it is serving have had the drain period to finish.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": drain}}}
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
