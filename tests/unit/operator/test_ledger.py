"""The GPU ledger and the node view built on it: GPUs promised to pods the index has not shown yet."""

from tokenyard.operator.ledger import GpuLedger, NodeUse
from tokenyard.operator.node_view import ClusterView, nodes_from


def test_a_reservation_counts_until_it_expires():
    ledger = GpuLedger(expiry_seconds=30)
    ledger.reserve("ns/a-0", "n1", 4, now=100.0)
    assert ledger.used_by_node((), now=130.0) == {"n1": NodeUse(gpus=4, pods=1)}
    assert ledger.used_by_node((), now=130.1) == {}
    assert "ns/a-0" not in ledger  # dropped for good, not only left out of the count


def test_reservations_on_one_node_add_up():
    ledger = GpuLedger()
    ledger.reserve("ns/a-0", "n1", 4, now=0.0)
    ledger.reserve("ns/a-1", "n1", 2, now=0.0)
    ledger.reserve("ns/b-0", "n2", 8, now=0.0)
    assert ledger.used_by_node((), now=1.0) == {"n1": NodeUse(6, 2), "n2": NodeUse(8, 1)}


def test_a_seen_pod_leaves_the_ledger_even_once_unseen_again():
    ledger = GpuLedger()
    ledger.reserve("ns/a-0", "n1", 4, now=0.0)
    ledger.reserve("ns/a-1", "n1", 4, now=0.0)
    assert ledger.used_by_node({"ns/a-0"}, now=1.0) == {"n1": NodeUse(4, 1)}
    # The index counts it from now on; a pod that then goes away must free its GPUs, not be reserved again.
    assert ledger.used_by_node((), now=2.0) == {"n1": NodeUse(4, 1)}
    assert len(ledger) == 1


def test_seen_pods_match_by_namespace_too():
    ledger = GpuLedger()
    ledger.reserve("team-a/m-0", "n1", 4, now=0.0)
    assert ledger.used_by_node({"team-b/m-0"}, now=1.0) == {"n1": NodeUse(4, 1)}


def test_release_frees_at_once_and_ignores_unknown_pods():
    ledger = GpuLedger()
    ledger.reserve("ns/a-0", "n1", 4, now=0.0)
    ledger.release("ns/a-0")
    ledger.release("ns/never-reserved")
    assert ledger.used_by_node((), now=0.0) == {}


def test_reserving_again_restarts_the_expiry():
    ledger = GpuLedger(expiry_seconds=10)
    ledger.reserve("ns/a-0", "n1", 4, now=0.0)
    ledger.reserve("ns/a-0", "n2", 2, now=8.0)
    assert ledger.used_by_node((), now=15.0) == {"n2": NodeUse(2, 1)}


def summary(name, gpus=8, **labels):
    return {"name": name, "labels": labels, "gpus": gpus, "ready": True, "schedulable": True}


def test_node_view_adds_live_pods_and_reservations():
    ledger = GpuLedger()
    ledger.reserve("ns/new-0", "n1", 2, now=0.0)
    pods = {"n1": [("ns/old-0", 4)], "n2": [("other/x", 1)]}
    by_name = {n.name: n for n in nodes_from([summary("n1"), summary("n2")], pods, ledger, now=1.0)}
    assert (by_name["n1"].gpu_used, by_name["n1"].gpu_pods, by_name["n1"].gpu_free) == (6, 2, 2)
    assert (by_name["n2"].gpu_used, by_name["n2"].gpu_pods) == (1, 1)


def test_node_view_frees_pods_being_deleted_and_drops_reservations_of_pods_it_sees():
    ledger = GpuLedger()
    ledger.reserve("ns/new-0", "n1", 4, now=0.0)
    pods = {"n1": [("ns/new-0", 4), ("ns/dying-0", 4)]}
    [node] = nodes_from([summary("n1")], pods, ledger, now=1.0, ignore_pods=frozenset({"ns/dying-0"}))
    assert (node.gpu_used, node.gpu_pods) == (4, 1)  # the new pod once, not twice; the dying one not at all
    assert len(ledger) == 0


def test_cluster_view_reads_the_live_indexes_each_time():
    node_index = {None: [summary("n1")]}
    pod_gpus = {"n1": []}
    view = ClusterView(node_index, pod_gpus, GpuLedger())
    assert view.nodes(now=0.0)[0].gpu_used == 0
    pod_gpus["n1"] = [("ns/p", 3)]
    node_index[None] = [summary("n1"), summary("n2")]
    assert [(n.name, n.gpu_used) for n in view.nodes(now=1.0)] == [("n1", 3), ("n2", 0)]
