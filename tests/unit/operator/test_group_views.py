"""group_views: the engine pod index's summaries grouped into gangs."""

from tokenyard.operator.group_views import group_views
from tokenyard.operator.groups import FAILED, PENDING, READY, MemberView


def pod(group, rank, revision="r1", size=2, node="n0", ready=True, **extra):
    return {
        "name": f"llm-{revision}-{group}-{rank}",
        "group": group,
        "rank": rank,
        "revision": revision,
        "size": size,
        "node": node,
        "planned": node,
        "group_nodes": (),
        "phase": "Running" if node else "Pending",
        "ready": ready,
        "unschedulable_since": None,
        "terminating": False,
        **extra,
    }


def test_pods_are_grouped_by_index_and_revision_in_order_members_by_rank():
    pods = [pod(1, 1), pod(0, 0, "r2"), pod(1, 0), pod(0, 0), pod(0, 1)]
    views = group_views(pods)
    assert [(g.index, g.revision) for g in views] == [(0, "r1"), (0, "r2"), (1, "r1")]
    assert [m.rank for m in views[2].members] == [0, 1]
    assert views[2].members[0] == MemberView("llm-r1-1-0", 0, "n0", "Running", True, None, False)
    assert views[0].phase == READY
    assert views[1].phase == FAILED  # one pod of two: a member is missing


def test_the_group_size_is_the_largest_any_member_recorded():
    views = group_views([pod(0, 0, size=1), pod(0, 1, size=2)])
    assert views[0].size == 2


def test_planned_and_recorded_nodes():
    pods = [
        pod(0, 0, node=None, ready=False, planned=None, unschedulable_since=5.0),
        pod(0, 1, node=None, ready=False, planned="n2", group_nodes=("n1", "n2")),
    ]
    (view,) = group_views(pods)
    assert view.phase == PENDING
    assert view.planned_nodes == ("", "n2")
    assert view.recorded_nodes == ("n1", "n2")  # from the member that recorded them
    assert view.members[0].unschedulable_since == 5.0


def test_no_pods_no_groups():
    assert group_views([]) == []
