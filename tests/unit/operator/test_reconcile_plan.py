"""plan_reconcile: what one reconcile deletes, creates and reports, decided from a snapshot with no API server."""

import pytest
from tokenyard.core import labels
from tokenyard.operator.canary_plan import NO_CANARY_STATUS, CanaryPlan
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.placement import Node, TopologyLevel
from tokenyard.operator.reconcile_plan import RECREATED, REMOVED, Event, plan_reconcile
from tokenyard.operator.revision import revision_hash
from tokenyard.operator.snapshot import DeploymentSnapshot

NOW = 1_000_000.0
BIND_TIMEOUT = 30.0
SPEC = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}},
    "engine": {"image": "vllm:1"},
    "parallelism": {"tensor": 8},  # one pod of 8 GPUs per group
}


def snapshot(replicas=2, **spec):
    return DeploymentSnapshot.from_body(
        {
            "metadata": {"name": "llm", "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": {**SPEC, "replicas": replicas, **spec},
            "status": {},
        }
    )


REV = revision_hash(snapshot().spec)


def group(index, revision=REV, nodes=("n0",), ready=True, size=None, unschedulable_since=None):
    members = tuple(
        MemberView(
            name=f"llm-{index}-{rank}",
            rank=rank,
            node=node,
            phase="Running" if node else "Pending",
            ready=ready,
            unschedulable_since=unschedulable_since,
        )
        for rank, node in enumerate(nodes)
    )
    size = size or len(nodes)
    return GroupView(
        index, revision, size, members, planned_nodes=tuple(n or "p" for n in nodes), recorded_nodes=nodes
    )


def node(name, nvlink, rack="r0", used=8):
    node_labels = {labels.NODE_NVLINK_DOMAIN: nvlink, labels.NODE_RACK: rack, labels.NODE_ZONE: "z1"}
    return Node(name, node_labels, 8, used, "H100-SXM")


NODES = [node("n0", "nv0"), node("n1", "nv0"), node("n2", "nv1"), node("n3", "nv1", used=0)]


def keys(deletions):
    return [(d.group.index, d.group.revision, d.kind) for d in deletions]


def test_scale_up_creates_the_missing_groups_at_the_update_revision():
    p = plan_reconcile(snapshot(replicas=3), [group(0)], NODES, None, NOW, BIND_TIMEOUT)
    assert p.update_revision == REV
    assert p.creates == {REV: 2}
    assert p.deletions == () and p.events == [] and p.return_to == {}
    assert [g.index for g in p.remaining] == [0]
    assert p.rollout_status == NO_CANARY_STATUS and p.current_revision is None
    assert [level.name for level in p.levels] == ["nvlink", "rack", "zone"]


def test_nothing_to_do_when_the_groups_match_the_spec():
    p = plan_reconcile(snapshot(replicas=2), [group(0), group(1, nodes=("n1",))], NODES, None, NOW, 30)
    assert p.creates == {} and p.deletions == ()


def test_scale_down_removes_the_group_whose_removal_frees_a_whole_nvlink_domain():
    # g1 alone on nv1 (n3 is empty): removing it frees the whole domain, so it goes, not the newest (g2)
    groups = [group(0, nodes=("n0",)), group(1, nodes=("n2",)), group(2, nodes=("n1",))]
    p = plan_reconcile(snapshot(replicas=2), groups, NODES, None, NOW, BIND_TIMEOUT)
    assert keys(p.deletions) == [(1, REV, REMOVED)]
    assert p.deletions[0].reason == "scaling down to 2 groups"
    assert p.events == [Event("GroupRemoved", f"group 1 (revision {REV}): scaling down to 2 groups")]
    assert p.creates == {} and p.return_to == {}
    assert [g.index for g in p.remaining] == [0, 2]


def test_scale_down_takes_not_ready_groups_before_asking_the_planner():
    groups = [group(0, nodes=("n0",)), group(1, nodes=("n2",)), group(2, nodes=("n1",), ready=False)]
    p = plan_reconcile(snapshot(replicas=2), groups, NODES, None, NOW, BIND_TIMEOUT)
    assert keys(p.deletions) == [(2, REV, REMOVED)]


TWO_PODS = {"parallelism": {"tensor": 16}}  # two pods of 8 GPUs per group
REV2 = revision_hash(snapshot(**TWO_PODS).spec)


def test_a_group_with_a_dead_member_is_recreated_and_returns_to_its_nodes():
    dead = GroupView(
        1,
        REV2,
        2,
        (MemberView("llm-1-0", 0, "n2", "Running", ready=True),),  # rank 1 is gone
        planned_nodes=("n2",),
        recorded_nodes=("n2", "n3"),
    )
    p = plan_reconcile(snapshot(replicas=2, **TWO_PODS), [dead], NODES, None, NOW, BIND_TIMEOUT)
    assert keys(p.deletions) == [(1, REV2, RECREATED)]
    assert "a member failed or disappeared" in p.deletions[0].reason
    assert p.events[0].reason == "GroupRecreated" and p.events[0].warning
    assert p.return_to == {REV2: (dead,)}
    assert p.creates == {REV2: 2}
    assert p.remaining == ()


def test_a_group_that_could_not_bind_is_re_planned_not_returned_to_its_nodes():
    stuck = group(1, nodes=(None,), ready=False, unschedulable_since=NOW - 60)
    p = plan_reconcile(snapshot(replicas=2), [group(0), stuck], NODES, None, NOW, BIND_TIMEOUT)
    assert keys(p.deletions) == [(1, REV, RECREATED)]
    assert "re-planning" in p.deletions[0].reason
    assert p.events[0] == Event("GroupRecreated", f"group 1: {p.deletions[0].reason}", warning=True)
    assert p.return_to == {}
    assert p.creates == {REV: 1}


def test_a_group_still_within_the_bind_timeout_is_left_alone():
    waiting = group(1, nodes=(None,), ready=False, unschedulable_since=NOW - 10)
    p = plan_reconcile(snapshot(replicas=2), [group(0), waiting], NODES, None, NOW, BIND_TIMEOUT)
    assert p.deletions == () and p.creates == {}


def test_a_rolling_update_surges_first_then_replaces_old_groups():
    spec = {"rollout": {"maxSurge": 1, "maxUnavailable": 0}}
    old = [group(0, "old"), group(1, "old", nodes=("n1",))]
    p = plan_reconcile(snapshot(replicas=2, **spec), old, NODES, None, NOW, BIND_TIMEOUT)
    assert p.creates == {REV: 1} and p.deletions == ()  # one surge group, nothing removed yet

    # the surge group is ready: an old one goes (the newest index first) and the last new one is made
    groups = [*old, group(2, nodes=("n2",))]
    p = plan_reconcile(snapshot(replicas=2, **spec), groups, NODES, None, NOW, BIND_TIMEOUT)
    assert keys(p.deletions) == [(1, "old", REMOVED)]
    assert p.deletions[0].reason == f"replaced by revision {REV}"
    assert p.creates == {REV: 1}
    assert [(g.index, g.revision) for g in p.remaining] == [(0, "old"), (2, REV)]


CANARY = {"rollout": {"strategy": "Canary", "steps": [{"setWeight": 10}]}}


def canary(targets):
    return CanaryPlan(
        targets=targets,
        stable_revision="stable",
        traffic=[{"revision": "stable", "weight": 90}, {"revision": REV, "weight": 10}],
        shadow=None,
        rollout={"phase": "Progressing"},
    )


def test_a_canary_creates_per_revision_and_removes_revisions_it_no_longer_names():
    groups = [group(0, "stable"), group(1, "stable", nodes=("n1",)), group(2, "gone", nodes=("n2",))]
    step = canary({"stable": 2, REV: 1})
    p = plan_reconcile(snapshot(replicas=2, **CANARY), groups, NODES, step, NOW, BIND_TIMEOUT)
    assert p.creates == {REV: 1}
    assert keys(p.deletions) == [(2, "gone", REMOVED)]
    assert p.deletions[0].reason == "revision gone is no longer part of the rollout"
    assert p.rollout_status == step.status_fields()
    assert p.current_revision == "stable"


def test_a_canary_recreates_a_dead_group_of_the_stable_revision_on_its_nodes():
    dead = GroupView(0, "stable", 1, (MemberView("llm-0-0", 0, "n0", "Failed"),), ("n0",), ("n0",))
    p = plan_reconcile(
        snapshot(**CANARY), [dead, group(1, "stable")], NODES, canary({"stable": 2}), NOW, BIND_TIMEOUT
    )
    assert keys(p.deletions) == [(0, "stable", RECREATED)]
    assert p.return_to == {"stable": (dead,)}
    assert p.creates == {"stable": 1}


def test_a_canary_needs_its_plan():
    with pytest.raises(ValueError, match="ns/llm"):
        plan_reconcile(snapshot(**CANARY), [], NODES, None, NOW, BIND_TIMEOUT)


def test_custom_topology_levels_are_passed_on():
    topology = [{"name": "switch", "nodeLabel": "example.com/switch"}]
    p = plan_reconcile(snapshot(placement={"topology": topology}), [], [], None, NOW, BIND_TIMEOUT)
    assert p.levels == (TopologyLevel("switch", "example.com/switch"),)
