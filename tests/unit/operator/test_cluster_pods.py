"""cluster_pods: the GPUs held by the pods of every namespace, kept from list and watch events."""

import asyncio
import logging

from tokenyard.core import labels as keys
from tokenyard.operator.cluster_pods import PodGpuTable, TableOnceSynced
from tokenyard.operator.ledger import GpuLedger
from tokenyard.operator.node_view import nodes_from
from tokenyard.operator.runtime import Runtime


def pod(name, namespace="other", node="n1", gpus=4, phase="Running"):
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def test_pods_are_grouped_by_node_as_the_pod_gpus_index_is():
    table = PodGpuTable()
    table.apply("ADDED", pod("a", node="n1", gpus=4))
    table.apply("ADDED", pod("b", namespace="mine", node="n1", gpus=2))
    table.apply("ADDED", pod("c", node="n2", gpus=8))
    table.apply("ADDED", pod("cpu-only", node="n2", gpus=0))
    table.apply("MODIFIED", pod("a", node="n1", gpus=4))  # a status update: still one pod
    assert {node: sorted(held) for node, held in table.items()} == {
        "n1": [("mine/b", 2), ("other/a", 4)],
        "n2": [("other/c", 8)],
    }


def test_deleted_and_finished_pods_free_their_gpus():
    table = PodGpuTable()
    table.apply("ADDED", pod("a", node="n1"))
    table.apply("ADDED", pod("b", node="n1"))
    table.apply("DELETED", pod("a", node="n1"))
    table.apply("MODIFIED", pod("b", node="n1", phase="Succeeded"))
    assert dict(table) == {}


def test_a_relist_forgets_pods_that_went_while_the_watch_was_down():
    table = PodGpuTable()
    table.apply("ADDED", pod("gone", node="n1"))
    assert not table.synced.is_set()
    table.replace([pod("kept", node="n2")])
    assert dict(table) == {"n2": [("other/kept", 4)]}
    assert table.synced.is_set()


def test_the_planner_sees_gpus_held_in_other_namespaces():
    table = PodGpuTable()
    table.replace([pod("holder", namespace="other", node="n1", gpus=5)])
    summary = {"name": "n1", "labels": {}, "gpus": 8, "ready": True, "schedulable": True}
    (node,) = nodes_from([summary], table, GpuLedger(), now=0.0)
    assert node.gpu_used == 5


def test_until_the_first_list_lands_placement_reads_kopfs_index_then_the_table():
    table = PodGpuTable()
    kopf_index = {"n1": [("mine/a", 2)]}
    view = TableOnceSynced(table, kopf_index)
    table.apply("ADDED", pod("early", node="n2"))  # a watch event before any list: not yet trusted
    assert dict(view) == kopf_index
    table.replace([pod("holder", node="n3", gpus=6)])
    assert dict(view) == {"n3": [("other/holder", 6)]}


def test_stopping_a_watch_that_had_died_logs_instead_of_raising(caplog):
    async def scenario():
        runtime = Runtime()

        async def broken() -> None:
            raise RuntimeError("connection reset")

        runtime._cluster_pods_task = asyncio.create_task(broken())
        await asyncio.sleep(0)  # let it die
        await runtime.stop_watching_cluster_pods()
        await runtime.stop_watching_cluster_pods()  # and a second stop is harmless

    with caplog.at_level(logging.WARNING, logger="tokenyard.operator"):
        asyncio.run(scenario())
    assert "connection reset" in caplog.text
