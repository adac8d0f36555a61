"""The status computed from a reconcile: conditions, current revision, revision history, groups."""

import datetime as dt

import pytest
from tokenyard.core import labels
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.placement import Node
from tokenyard.operator.revision import revision_hash, revision_template
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot
from tokenyard.operator.status import (
    HISTORY_LIMIT,
    ConditionUpdate,
    compute_status,
    current_revision,
    group_conditions,
    invalid_spec_status,
    merge_conditions,
    parse_timestamp,
    revision_history,
    timestamp,
)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp()
SPEC = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}},
    "engine": {"image": "vllm:1"},
}


def body(replicas=2, status=None, generation=3, **spec):
    return {
        "metadata": {"name": "llm", "namespace": "ns", "uid": "u-1", "generation": generation},
        "spec": {**SPEC, "replicas": replicas, **spec},
        "status": status or {},
    }


def group(index, revision="new", ready=True, nodes=("n1",), phase="Running", size=None):
    members = tuple(
        MemberView(name=f"g{index}-{rank}", rank=rank, node=node, phase=phase, ready=ready)
        for rank, node in enumerate(nodes)
    )
    return GroupView(
        index, revision, size or len(nodes), members, planned_nodes=tuple(n or "p" for n in nodes)
    )


def conditions_by_type(conditions):
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


def test_timestamp_is_kubernetes_utc_seconds_and_reads_back():
    assert timestamp(T0) == "2026-01-02T03:04:05Z"
    assert parse_timestamp("2026-01-02T03:04:05Z") == T0
    assert parse_timestamp(None) is None and parse_timestamp("") is None


def test_all_groups_ready_at_the_update_revision_is_available_and_converged():
    spec = DeploymentSnapshot.from_body(body(replicas=2)).spec
    updates = group_conditions(spec, [group(0), group(1)], "new", None)
    assert conditions_by_type(merge_conditions([], updates, 1, T0)) == {
        "Available": ("True", "MinimumGroupsReady"),
        "Progressing": ("False", "Converged"),
        "Degraded": ("False", "AllGroupsHealthy"),
        "InsufficientCapacity": ("False", "Placed"),
    }


def test_too_few_ready_groups_is_unavailable_and_an_old_group_is_still_progressing():
    spec = DeploymentSnapshot.from_body(body(replicas=3, rollout={"maxUnavailable": 1})).spec
    groups = [group(0), group(1, ready=False), group(2, revision="old", ready=False)]
    updates = {u.type: u for u in group_conditions(spec, groups, "new", None)}
    assert (updates["Available"].status, updates["Available"].message) == ("False", "1 of 3 groups ready")
    assert updates["Progressing"].reason == "ReconcilingGroups"
    assert updates["Progressing"].message == "2 of 3 groups at revision new"


def test_max_unavailable_lets_a_group_be_missing_but_never_all_of_them():
    spec = DeploymentSnapshot.from_body(body(replicas=2, rollout={"maxUnavailable": 2})).spec
    assert {u.type: u.status for u in group_conditions(spec, [group(0)], "new", None)}["Available"] == "True"
    assert {u.type: u.status for u in group_conditions(spec, [], "new", None)}["Available"] == "False"
    no_replicas = DeploymentSnapshot.from_body(body(replicas=0, rollout={"maxUnavailable": 2})).spec
    assert {u.type: u.status for u in group_conditions(no_replicas, [], "new", None)}["Available"] == "True"


def test_failed_group_degrades_and_a_capacity_problem_is_reported_with_its_message():
    spec = DeploymentSnapshot.from_body(body(replicas=2)).spec
    groups = [group(0), group(1, nodes=("n1", "n2"), size=3)]  # rank 2 is gone: the gang failed
    updates = {
        u.type: u for u in group_conditions(spec, groups, "new", "1 group(s) cannot be placed: 8 GPUs")
    }
    assert (updates["Degraded"].status, updates["Degraded"].reason) == ("True", "GroupFailed")
    assert updates["Degraded"].message == "1 group(s) failed and are being recreated"
    assert updates["InsufficientCapacity"] == ConditionUpdate(
        "InsufficientCapacity", "True", "NotEnoughGPUs", "1 group(s) cannot be placed: 8 GPUs"
    )


def test_transition_time_moves_only_when_the_status_changes():
    first = merge_conditions(
        [], [ConditionUpdate("Available", "False", "TooFewGroupsReady", "0 of 1")], 1, T0
    )
    same = merge_conditions(
        first, [ConditionUpdate("Available", "False", "TooFewGroupsReady", "0 of 2")], 2, T0 + 60
    )
    flipped = merge_conditions(
        same, [ConditionUpdate("Available", "True", "MinimumGroupsReady", "1 of 1")], 2, T0 + 90
    )
    assert same[0]["lastTransitionTime"] == timestamp(T0)
    assert (same[0]["message"], same[0]["observedGeneration"]) == ("0 of 2", 2)
    assert flipped[0]["lastTransitionTime"] == timestamp(T0 + 90)


def test_conditions_not_updated_are_kept_in_their_place():
    previous = [
        {
            "type": "Available",
            "status": "True",
            "reason": "MinimumGroupsReady",
            "message": "",
            "lastTransitionTime": "t",
        },
        {"type": "Custom", "status": "True", "reason": "Mine", "message": "", "lastTransitionTime": "t"},
    ]
    merged = merge_conditions(previous, [ConditionUpdate("Degraded", "True", "InvalidSpec", "bad")], 4, T0)
    assert [c["type"] for c in merged] == ["Available", "Custom", "Degraded"]
    assert merged[0] == previous[0]


def test_current_revision_is_the_one_with_most_ready_groups_the_update_revision_on_a_tie():
    assert current_revision([group(0, "old"), group(1, "old"), group(2, "new")], "new", None, None) == "old"
    assert current_revision([group(0, "old"), group(1, "new")], "new", "old", None) == "new"
    # Groups that are not ready do not count.
    assert current_revision([group(0, "old"), group(1, "new", ready=False)], "new", None, None) == "old"


def test_current_revision_without_ready_groups_stays_and_starts_at_the_update_revision():
    assert current_revision([group(0, "new", ready=False)], "new", "old", None) == "old"
    assert current_revision([], "new", None, None) == "new"


def test_a_canary_stable_revision_wins_over_ready_counts():
    assert current_revision([group(0, "new"), group(1, "new")], "new", "old", "old") == "old"


def test_history_records_a_new_revision_once_and_keeps_the_newest():
    spec = DeploymentSnapshot.from_body(body()).spec
    full = [{"revision": f"r{i}", "created": "t", "template": {}} for i in range(HISTORY_LIMIT)]
    history = revision_history(full, spec, "new", T0)
    assert len(history) == HISTORY_LIMIT
    assert [h["revision"] for h in history] == [f"r{i}" for i in range(1, HISTORY_LIMIT)] + ["new"]
    assert history[-1] == {"revision": "new", "created": timestamp(T0), "template": revision_template(spec)}
    assert revision_history(history, spec, "new", T0 + 60) == history  # already there: unchanged
    assert revision_history(full, spec, "r3", T0) == full  # an old revision is not moved to the end


def snapshot_with_nodes():
    snapshot = DeploymentSnapshot.from_body(
        body(
            replicas=2,
            placement={
                "topology": [{"name": "rack", "nodeLabel": "rack"}, {"name": "zone", "nodeLabel": "zone"}]
            },
            status={"currentRevision": "old", "revisionHistory": []},
        )
    )
    nodes = [
        Node("n1", {"rack": "r1", "zone": "z"}, 8),
        Node("n2", {"rack": "r2", "zone": "z"}, 8),
        Node("n3", {"rack": "r1", "zone": "z"}, 8),
    ]
    return snapshot, nodes


def test_compute_status_counts_groups_and_names_their_domain():
    snapshot, nodes = snapshot_with_nodes()
    update = revision_hash(snapshot.spec)
    groups = [
        group(0, update, nodes=("n1", "n3")),
        group(1, update, nodes=("n1", "n2"), ready=False),
        group(2, "old", nodes=(None,), ready=False),
    ]
    status = compute_status(snapshot, update, groups, nodes, None, {"traffic": []}, None, T0)
    assert status["observedGeneration"] == 3
    assert (
        status["replicas"],
        status["placedReplicas"],
        status["readyReplicas"],
        status["updatedReplicas"],
    ) == (
        3,
        2,
        1,
        2,
    )
    assert status["selector"] == f"{labels.MODEL_DEPLOYMENT}=llm,{labels.ROLE}={labels.ROLE_LEADER}"
    assert [g["domain"] for g in status["groups"]] == ["rack/r1", "zone/z", None]
    assert status["groups"][2]["nodes"] == ["p"]  # not bound yet: the planned node
    assert (status["currentRevision"], status["updateRevision"]) == (update, update)
    assert [h["revision"] for h in status["revisionHistory"]] == [update]
    assert status["traffic"] == []
    assert conditions_by_type(status["conditions"])["Available"] == ("False", "TooFewGroupsReady")


def test_compute_status_takes_the_rollout_fields_and_stable_revision():
    snapshot, nodes = snapshot_with_nodes()
    update = revision_hash(snapshot.spec)
    rollout = {
        "traffic": [{"revision": "old", "weight": 100}],
        "shadow": None,
        "rollout": {"phase": "Progressing"},
    }
    status = compute_status(snapshot, update, [group(0, update)], nodes, None, rollout, "old", T0)
    assert status["currentRevision"] == "old"
    assert {k: status[k] for k in rollout} == rollout


def test_invalid_spec_only_marks_degraded():
    meta = DeploymentMeta.from_body(
        body(status={"conditions": [{"type": "Available", "status": "True", "reason": "R", "message": ""}]})
    )
    status = invalid_spec_status(meta, "spec.replicas: must be >= 0", T0)
    assert set(status) == {"conditions"}
    assert conditions_by_type(status["conditions"]) == {
        "Available": ("True", "R"),
        "Degraded": ("True", "InvalidSpec"),
    }
    assert status["conditions"][1]["message"] == "spec.replicas: must be >= 0"


@pytest.mark.parametrize("missing", ["status", "generation"])
def test_a_new_object_without_status_or_generation_still_gets_one(missing):
    data = body()
    if missing == "status":
        del data["status"]
    else:
        del data["metadata"]["generation"]
    snapshot = DeploymentSnapshot.from_body(data)
    status = compute_status(snapshot, "new", [], [], None, {}, None, T0)
    assert status["currentRevision"] == "new" and len(status["revisionHistory"]) == 1
