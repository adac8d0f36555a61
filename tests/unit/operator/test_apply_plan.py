"""apply_plan: a reconcile's plan applied through fake API writes (no API server): deletions, then new groups
placed with the ledger's reservations, events, and the InsufficientCapacity warning once per change."""

from kubernetes_asyncio.client.exceptions import ApiException
from tokenyard.core import labels
from tokenyard.operator.apply_plan import apply_plan
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.node_view import ClusterView
from tokenyard.operator.reconcile_plan import plan
from tokenyard.operator.runtime import Runtime
from tokenyard.operator.snapshot import DeploymentSnapshot

NOW = 1_000_000.0
SPEC = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}},
    "engine": {"image": "vllm:1"},
    "parallelism": {"tensor": 8},
}


class FakeWrites:
    def __init__(self, fail_groups=()):
        self.calls = []
        self.drained = []  # per delete_group: whether the pods got their grace period
        self.fail_groups = set(fail_groups)

    async def create_group(self, owner, spec, names, nodes):
        self.calls.append(("create", names.index, names.revision, nodes))
        if names.index in self.fail_groups:
            raise ApiException(status=500, reason="boom")

    async def delete_group(self, names, group, drain):
        self.calls.append(("delete", names.index, names.revision))
        self.drained.append(drain)

    async def patch_status(self, name, namespace, status):
        self.calls.append(("status", name))


class RecordedEvents:
    def __init__(self):
        self.posted = []

    def emit(self, event):
        self.posted.append((event.reason, event.warning))


def snapshot(replicas):
    return DeploymentSnapshot.from_body(
        {"metadata": {"name": "llm", "namespace": "ns", "uid": "u"}, "spec": {**SPEC, "replicas": replicas}}
    )


def runtime(writes):
    rt = Runtime()
    rt._writes = writes
    return rt


def cluster(rt, free_nodes=2):
    summaries = [
        {
            "name": f"n{i}",
            "labels": {labels.NODE_NVLINK_DOMAIN: f"nv{i}"},
            "gpus": 8,
            "ready": True,
            "schedulable": True,
        }
        for i in range(free_nodes)
    ]
    return ClusterView({None: summaries}, {}, rt.ledger)


def failed_group(index, node, revision):
    member = MemberView(f"llm-{index}-0", 0, node, "Failed")
    return GroupView(index, revision, 1, (member,), (node,), (node,))


async def test_new_groups_are_created_reserved_and_announced():
    writes, events = FakeWrites(), RecordedEvents()
    rt = runtime(writes)
    view = cluster(rt)
    snap = snapshot(2)
    planned = plan(snap, [], view.nodes(NOW), None, NOW, 30)
    problem = await apply_plan(rt, snap, planned, view, events, logger=None)
    assert problem is None
    assert sorted(c[3] for c in writes.calls) == [("n0",), ("n1",)]
    assert len(rt.ledger) == 2  # promised until the index shows the pods
    assert events.posted == [("GroupPlaced", False), ("GroupPlaced", False)]


async def test_groups_that_do_not_fit_are_warned_about_once():
    writes, events = FakeWrites(), RecordedEvents()
    rt = runtime(writes)
    view = cluster(rt, free_nodes=1)
    snap = snapshot(2)
    problem = await apply_plan(rt, snap, plan(snap, [], view.nodes(NOW), None, NOW, 30), view, events, None)
    assert problem and problem.startswith("1 group(s) cannot be placed")
    assert events.posted == [("GroupPlaced", False), ("InsufficientCapacity", True)]
    events.posted.clear()
    # the next reconcile sees the placed group (its GPUs still in the ledger) and the same problem: no second warning
    made = GroupView(
        0, planned_revision(snap), 1, (MemberView(writes_pod(writes), 0, None, "Pending"),), ("n0",)
    )
    again = await apply_plan(rt, snap, plan(snap, [made], view.nodes(NOW), None, NOW, 30), view, events, None)
    assert again == problem and ("InsufficientCapacity", True) not in events.posted


async def test_a_failed_create_frees_its_reservation_and_is_raised():
    writes, events = FakeWrites(fail_groups={0}), RecordedEvents()
    rt = runtime(writes)
    view = cluster(rt)
    snap = snapshot(2)
    try:
        await apply_plan(rt, snap, plan(snap, [], view.nodes(NOW), None, NOW, 30), view, events, None)
    except ApiException as e:
        assert e.status == 500
    else:
        raise AssertionError("the failed create was not raised")
    assert len(rt.ledger) == 1  # only the group that was made keeps its GPUs
    assert events.posted == [("GroupPlaced", False)]


async def test_a_dead_group_is_deleted_then_replaced_on_its_node():
    writes, events = FakeWrites(), RecordedEvents()
    rt = runtime(writes)
    view = cluster(rt)
    snap = snapshot(1)
    dead = failed_group(0, "n1", planned_revision(snap))
    planned = plan(snap, [dead], view.nodes(NOW), None, NOW, 30)
    await apply_plan(rt, snap, planned, view, events, None)
    assert [c[0] for c in writes.calls] == ["delete", "create"]
    assert writes.drained == [False]  # a broken gang goes at once: nothing whole to drain
    assert writes.calls[1][1] == 1 and writes.calls[1][3] == ("n1",)  # a new index, back on the same node
    assert events.posted == [("GroupRecreated", True), ("GroupPlaced", False)]
    assert (
        rt.metrics.registry.get_sample_value(
            "tokenyard_operator_groups_recreated_total", {"namespace": "ns", "deployment": "llm"}
        )
        == 1
    )


async def test_a_healthy_group_removed_by_a_scale_down_drains_its_streams():
    writes, events = FakeWrites(), RecordedEvents()
    rt = runtime(writes)
    view = cluster(rt)
    snap = snapshot(1)
    revision = planned_revision(snap)

    def group(i, ready):  # on nodes outside the view: the placement planner then has no removal to weigh
        member = MemberView(f"llm-{i}-0", 0, f"x{i}", "Running", ready=ready)
        return GroupView(i, revision, 1, (member,), (f"x{i}",), (f"x{i}",))

    planned = plan(snap, [group(0, True), group(1, True)], view.nodes(NOW), None, NOW, 30)
    await apply_plan(rt, snap, planned, view, events, None)
    assert [c[0] for c in writes.calls] == ["delete"] and writes.drained == [True]
    assert events.posted == [("GroupRemoved", False)]
    # A group still loading serves nothing: removed first, at once, its GPUs freed without waiting.
    writes = FakeWrites()
    rt = runtime(writes)
    view = cluster(rt)
    planned = plan(snap, [group(0, True), group(1, False)], view.nodes(NOW), None, NOW, 30)
    await apply_plan(rt, snap, planned, view, RecordedEvents(), None)
    assert [c[1] for c in writes.calls] == [1] and writes.drained == [False]


def planned_revision(snap):
    return plan(snap, [], [], None, NOW, 30).update_revision


def writes_pod(writes):
    return f"llm-group-{writes.calls[0][1]}"
