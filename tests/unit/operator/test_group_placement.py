"""group_placement: where a reconcile's new groups go, and the InsufficientCapacity warning, with no API server."""

from tokenyard.core import labels
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.group_placement import (
    RETURNED,
    CapacityWarnings,
    NewGroups,
    capacity_message,
    group_requests,
    place_new_groups,
    placed_event,
    return_to_nodes,
)
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.placement import BEST_FIT, SPREAD, Assignment, GroupShape, Node, TopologyLevel

LEVELS = (
    TopologyLevel("nvlink", labels.NODE_NVLINK_DOMAIN),
    TopologyLevel("rack", labels.NODE_RACK),
    TopologyLevel("zone", labels.NODE_ZONE),
)


def spec(tensor=8, **placement):
    return ModelDeploymentSpec.parse(
        {
            "model": {"weights": {"uri": "hf://m"}},
            "engine": {"image": "vllm:1"},
            "parallelism": {"tensor": tensor, "gpusPerPod": 8},
            "placement": placement,
        }
    )


def node(name, used=0, product="H100-SXM", nvlink=None, **extra):
    node_labels = {labels.NODE_NVLINK_DOMAIN: nvlink or name, labels.NODE_RACK: "r0", labels.NODE_ZONE: "z1"}
    return Node(name, node_labels, 8, used, product, **extra)


def dead(index, nodes):
    members = tuple(MemberView(f"llm-{index}-{r}", r, n, "Failed") for r, n in enumerate(nodes))
    return GroupView(index, "rev", len(nodes), members, tuple(nodes), tuple(nodes))


def test_requests_carry_the_spec_of_the_revision():
    new = NewGroups("rev", spec(tensor=16, strategy="Spread", required="rack"), 2, LEVELS, ())
    requests = group_requests("llm", new, [3, 5])
    assert [(i, r.key) for i, r in requests] == [(3, "llm/3"), (5, "llm/5")]
    request = requests[0][1]
    assert (request.pods, request.gpus_per_pod, request.strategy) == (2, 8, SPREAD)
    assert request.required_level == "rack"
    assert group_requests("llm", NewGroups("rev", spec(), 1, LEVELS, ()), [0])[0][1].strategy == BEST_FIT
    assert new.shape() == GroupShape(2, 8, None)


def test_the_dead_groups_pods_are_named_with_their_namespace():
    new = NewGroups("rev", spec(tensor=16), 1, LEVELS, (dead(0, ("a", "b")),))
    assert new.dead_pods("ns") == {"ns/llm-0-0", "ns/llm-0-1"}


def test_a_replacement_returns_to_its_dead_groups_nodes_when_they_are_free():
    new = NewGroups("rev", spec(tensor=16), 1, LEVELS, (dead(0, ("a", "b")),))
    requests = group_requests("llm", new, [2])
    returned = return_to_nodes(new, requests, [node("a"), node("b"), node("c")])
    assert returned == [(2, Assignment("llm/2", ("a", "b"), 8, "", RETURNED))]


def test_no_return_to_a_taken_unready_or_other_product_node():
    new = NewGroups("rev", spec(tensor=16), 1, LEVELS, (dead(0, ("a", "b")),))
    requests = group_requests("llm", new, [2])
    assert return_to_nodes(new, requests, [node("a", used=8), node("b")]) == []
    assert return_to_nodes(new, requests, [node("a", ready=False), node("b")]) == []
    wanted = NewGroups("rev", spec(tensor=16, gpuProduct="H100-SXM"), 1, LEVELS, (dead(0, ("a", "b")),))
    assert return_to_nodes(wanted, requests, [node("a", product="A100"), node("b")]) == []


def test_a_dead_group_of_another_size_is_not_returned_to():
    new = NewGroups("rev", spec(tensor=16), 1, LEVELS, (dead(0, ("a",)),))
    assert return_to_nodes(new, group_requests("llm", new, [1]), [node("a"), node("b")]) == []


def test_new_groups_are_placed_and_those_that_do_not_fit_are_reported():
    new = NewGroups("rev", spec(), 3, LEVELS, ())
    placement = place_new_groups(
        [node("a"), node("b", used=8), node("c")], group_requests("llm", new, [0, 1, 2]), LEVELS, []
    )
    assert [(i, a.nodes) for i, a in placement.placed] == [(0, ("a",)), (1, ("c",))]
    assert placement.unplaceable == ("needs 8 GPUs on one node; the best node has 0 free (short 8)",)
    assert placement.capacity_problem == f"1 group(s) cannot be placed: {placement.unplaceable[0]}"


def test_everything_placed_is_no_capacity_problem():
    new = NewGroups("rev", spec(), 1, LEVELS, ())
    placement = place_new_groups(
        [node("a")], group_requests("llm", new, [0]), LEVELS, [GroupShape(1, 4, None)]
    )
    assert placement.unplaceable == () and placement.capacity_problem is None
    assert capacity_message([]) is None


def test_the_placed_event_says_where_and_why():
    within = placed_event(1, "rev", Assignment("llm/1", ("a", "b"), 8, "", "nvlink"))
    assert (within.reason, within.message, within.warning) == (
        "GroupPlaced",
        "group 1 (revision rev) on a, b within one nvlink",
        False,
    )
    back = placed_event(2, "rev", Assignment("llm/2", ("a",), 8, "", RETURNED))
    assert back.message == "group 2 (revision rev) on a back on the nodes of the group it replaces"


def test_capacity_warnings_are_posted_once_per_change():
    warnings = CapacityWarnings()
    key = ("ns", "llm")
    first = warnings.report(key, "1 group(s) cannot be placed: x")
    assert first is not None and first.warning and first.reason == "InsufficientCapacity"
    assert warnings.report(key, "1 group(s) cannot be placed: x") is None  # the same again: not re-posted
    assert warnings.report(key, "2 group(s) cannot be placed: x") is not None  # changed
    assert warnings.report(("ns", "other"), "2 group(s) cannot be placed: x") is not None  # per deployment
    assert warnings.report(key, None) is None  # placed: forgotten
    assert key not in warnings.last
    assert warnings.report(key, "2 group(s) cannot be placed: x") is not None  # a new problem is posted anew
