"""decide_targets: per-revision group counts during a canary rollout."""

from tokenyard.operator.groups import decide_targets

from tests.unit.operator.test_groups import group


def test_each_revision_converges_to_its_target_and_unnamed_revisions_go():
    groups = [group(0, "stable"), group(1, "stable"), group(2, "canary"), group(3, "old")]
    d = decide_targets(groups, {"stable": 2, "canary": 2}, now=0)
    assert d.create_per_revision == {"canary": 1}
    assert [(g.index, g.revision) for g, _ in d.delete] == [(3, "old")]


def test_failed_groups_of_any_revision_are_recreated_whole():
    groups = [group(0, "stable"), group(1, "stable", size=2, missing=1)]
    d = decide_targets(groups, {"stable": 2}, now=0)
    assert [g.index for g, _ in d.delete] == [1]
    assert d.create_per_revision == {"stable": 1}


def test_surplus_of_a_revision_is_scaled_down_not_ready_first():
    groups = [group(0, "c"), group(1, "c", ready=False), group(2, "c")]
    d = decide_targets(groups, {"c": 1}, now=0)
    assert [g.index for g, _ in d.delete] == [1]
    assert d.scale_down == 1
