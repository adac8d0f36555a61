"""An operator that watches one namespace still counts the GPUs that other namespaces' pods hold.

Kopf watches pods only in the operator's namespaces; GPUs held outside them once looked free, so the planner
pinned groups on full nodes, kube-scheduler refused them, and each re-plan chose the same nodes again (seen as a
deployment stuck at "2 of 3 groups ready" after the demo stack had left its pods in the session's cluster).
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client
from tokenyard.core import labels
from tokenyard.operator.indexes import gpus_of

from tests.integration.conftest import operator_process, wait_for
from tests.integration.test_operator import GROUP, PLURAL, VERSION, mdep, ready_groups

pytestmark = pytest.mark.integration

GROUP_GPUS = 4
LEFT_FREE = 2  # nodes left with room; the others keep fewer free GPUs than a group needs


def _gpus_in_use(core: client.CoreV1Api) -> dict[str, int]:
    used: dict[str, int] = {}
    for pod in core.list_pod_for_all_namespaces().items:
        if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
            spec = client.ApiClient().sanitize_for_serialization(pod.spec)
            used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + gpus_of(spec)
    return used


def test_gpus_held_in_other_namespaces_are_not_planned_on(devcluster, kube_api, namespace, tmp_path):
    core, custom = client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    other = f"t-other-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": other}})
    operator = None
    try:
        wait_for(
            lambda: core.read_namespaced_service_account("default", other), what=f"ServiceAccount in {other}"
        )
        # Every node but the last two (by name) keeps fewer free GPUs than a group needs, through pods of
        # another namespace bound there directly (nodeName, as a DaemonSet's or another scheduler's would be).
        nodes = sorted(core.list_node().items, key=lambda n: n.metadata.name)
        used = _gpus_in_use(core)
        for i, node in enumerate(nodes[:-LEFT_FREE]):
            name = node.metadata.name
            allocatable = int(node.status.allocatable.get(labels.GPU_RESOURCE, "0"))
            hold = allocatable - used.get(name, 0) - (GROUP_GPUS - 1)
            if hold > 0:
                core.create_namespaced_pod(
                    other,
                    {
                        "metadata": {"name": f"holder-{i}"},
                        "spec": {
                            "nodeName": name,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [
                                {
                                    "name": "holder",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {labels.GPU_RESOURCE: str(hold)}},
                                }
                            ],
                        },
                    },
                )
        operator = operator_process(
            devcluster.kubeconfig, tmp_path / "operator.log", "--namespace", namespace
        ).start()
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, mdep("spread", tensor=GROUP_GPUS, replicas=3)
        )
        apis = (custom, core)
        # Two free nodes of 8 GPUs hold 3 groups of 4; placed on any other node, a group never binds.
        obj = wait_for(ready_groups(apis, namespace, "spread", 3), timeout=60, what="3 Ready groups")
        free = {n.metadata.name for n in nodes[-LEFT_FREE:]}
        assert {node for g in obj["status"]["groups"] for node in g["nodes"]} <= free
    finally:
        if operator is not None:
            operator.stop()
        core.delete_namespace(other)
        # the GPUs are free again for the tests after this one
        wait_for(
            lambda: not core.list_namespaced_pod(other).items, timeout=60, what=f"the pods of {other} to go"
        )
