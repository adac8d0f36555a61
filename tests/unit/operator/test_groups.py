"""The group reconciliation core: gang phases, recreation, scaling and surge-bounded rolling updates."""

from hypothesis import given
from hypothesis import strategies as st
from tokenyard.operator.groups import (
    FAILED,
    PENDING,
    PLACED,
    READY,
    GroupView,
    MemberView,
    decide,
    next_indices,
)


def group(
    index, revision="new", size=1, ready=True, node="n", phase="Running", missing=0, unschedulable_since=None
):
    members = tuple(
        MemberView(
            name=f"g{index}-{rank}",
            rank=rank,
            node=node,
            phase=phase,
            ready=ready,
            unschedulable_since=unschedulable_since,
        )
        for rank in range(size - missing)
    )
    return GroupView(index=index, revision=revision, size=size, members=members)


def test_gang_phase_needs_every_member():
    assert group(0, size=2).phase == READY
    assert group(0, size=2, ready=False).phase == PLACED
    assert group(0, size=2, ready=False, node=None).phase == PENDING
    assert group(0, size=2, missing=1).phase == FAILED
    assert group(0, size=2, phase="Failed", ready=False).phase == FAILED


def test_failed_group_is_deleted_whole_and_replaced():
    groups = [group(0), group(1, size=2, missing=1)]
    d = decide(groups, replicas=2, update_revision="new", max_surge=1, max_unavailable=0, now=100)
    assert [g.index for g, _ in d.delete] == [1]
    assert d.create == 1


def test_group_that_cannot_bind_is_replanned_after_the_timeout():
    stuck = group(0, ready=False, node=None, unschedulable_since=50.0)
    assert decide([stuck], 1, "new", 1, 0, now=60, bind_timeout=30).delete == []
    d = decide([stuck], 1, "new", 1, 0, now=90, bind_timeout=30)
    assert [g.index for g, _ in d.delete] == [0] and d.create == 1


def test_scale_up_and_down_count_groups():
    assert decide([group(0)], 4, "new", 1, 0, now=0).create == 3
    d = decide([group(0), group(1, ready=False), group(2)], 1, "new", 1, 0, now=0)
    assert [g.index for g, _ in d.delete] == [1]  # the not-ready group goes first
    assert d.scale_down == 1 and {g.index for g in d.scale_down_candidates} == {0, 2}


def test_rolling_update_surges_before_removing_old_groups():
    old = [group(i, revision="old") for i in range(3)]
    d = decide(old, 3, "new", max_surge=1, max_unavailable=0, now=0)
    assert d.create == 1 and d.delete == []
    # The new group is not ready yet: nothing old may go.
    d = decide([*old, group(3, ready=False)], 3, "new", 1, 0, now=0)
    assert d.create == 0 and d.delete == []
    # Once it is ready, one old group goes, and one more new group is created.
    d = decide([*old, group(3)], 3, "new", 1, 0, now=0)
    assert len(d.delete) == 1 and d.create == 1


def test_rolling_update_without_surge_uses_max_unavailable():
    old = [group(i, revision="old") for i in range(2)]
    d = decide(old, 2, "new", max_surge=0, max_unavailable=1, now=0)
    assert len(d.delete) == 1 and d.create == 1


def test_next_indices_fill_holes():
    assert next_indices({0, 2}, 3) == [1, 3, 4]


@given(
    old_ready=st.lists(st.booleans(), max_size=6),
    new_ready=st.lists(st.booleans(), max_size=6),
    replicas=st.integers(0, 6),
    max_surge=st.integers(0, 3),
    max_unavailable=st.integers(0, 3),
)
def test_update_never_drops_ready_groups_below_the_floor(
    old_ready, new_ready, replicas, max_surge, max_unavailable
):
    if max_surge == 0 and max_unavailable == 0:
        max_surge = 1  # the API rejects both zero
    groups = [group(i, revision="old", ready=r) for i, r in enumerate(old_ready)]
    groups += [group(100 + i, revision="new", ready=r) for i, r in enumerate(new_ready)]
    d = decide(groups, replicas, "new", max_surge, max_unavailable, now=0)
    deleted = {g.index for g, _ in d.delete}
    ready_before = sum(1 for g in groups if g.ready)
    ready_after = sum(1 for g in groups if g.ready and g.index not in deleted)
    floor = max(0, replicas - max_unavailable)
    # What decide() deletes itself (failed, not-ready and replaced groups) never takes Ready groups below the
    # floor; a scale-down of Ready groups is left to the adapter (d.scale_down) and is wanted by the user.
    assert ready_after >= min(ready_before, floor)
    # ... and creation never exceeds the surge budget.
    live_after = len(groups) - len(deleted)
    assert live_after + d.create <= max(replicas + max_surge, live_after)


def test_a_recreated_gang_returns_to_its_nodes_only_when_they_still_have_the_gpus():
    from tokenyard.operator.groups import reusable_nodes

    free = {"n1": 8, "n2": 8, "n3": 4}
    assert reusable_nodes(("n1", "n2"), free, 8) == ("n1", "n2")
    assert reusable_nodes(("n1", "n3"), free, 8) is None  # n3 lost half its GPUs to someone else
    assert reusable_nodes(("n1", "gone"), free, 8) is None  # a node that left (or is no longer eligible)
    assert reusable_nodes(("n3", "n3"), free, 2) == ("n3", "n3")  # two ranks on one node need both shares
    assert reusable_nodes(("n3", "n3"), free, 4) is None
    assert reusable_nodes(("n1", ""), free, 8) is None  # a rank whose node was never recorded
    assert reusable_nodes((), free, 8) is None


def test_replacements_skip_a_node_set_that_no_longer_fits_and_return_the_others_home():
    from tokenyard.operator.groups import return_to_previous_nodes

    free = {"a": 0, "b": 8, "c": 8, "d": 8}  # someone took node a after group 0 died
    returned = return_to_previous_nodes([5, 6, 7], [("a",), ("b",), ("c",)], free, 8)
    fresh = [index for index in (5, 6, 7) if index not in returned]
    # Before: index 5 kept retrying ("a",), so 6 and 7 never got back to b and c.
    assert returned == {5: ("b",), 6: ("c",)}
    assert fresh == [7]
    assert free["b"] == 8  # the caller's view is not changed


def test_two_replacements_do_not_return_to_the_same_gpus():
    from tokenyard.operator.groups import return_to_previous_nodes

    # Both dead groups ran on node a, which has room for one of them now.
    returned = return_to_previous_nodes([1, 2], [("a",), ("a",)], {"a": 4}, 4)
    fresh = [index for index in (1, 2) if index not in returned]
    assert returned == {1: ("a",)}
    assert fresh == [2]
