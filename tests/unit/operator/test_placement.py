"""The placement planner on small hand-made clusters: what it chooses and why it refuses."""

from dataclasses import replace

import pytest
from tokenyard.core import labels
from tokenyard.operator.placement import (
    Assignment,
    GroupRequest,
    GroupShape,
    Node,
    Planner,
    TopologyLevel,
    Unplaceable,
    choose_scale_down,
    expected_stranded_gpus,
    plan,
    stranded_gpus,
)


def gpu_node(name, nvlink, rack, zone="z1", used=0, allocatable=8, product="H100-SXM", **extra):
    node_labels = {}
    for key, value in (
        (labels.NODE_NVLINK_DOMAIN, nvlink),
        (labels.NODE_RACK, rack),
        (labels.NODE_ZONE, zone),
    ):
        if value is not None:
            node_labels[key] = value
    return Node(name, node_labels, allocatable, used, product, **extra)


def two_racks(used=None):
    """8 nodes of 8 GPUs: racks r0 (n0..n3) and r1 (n4..n7), NVLink domains of two nodes."""
    used = used or {}
    return [gpu_node(f"n{i}", f"nv{i // 2}", f"r{i // 4}", used=used.get(f"n{i}", 0)) for i in range(8)]


def placed(result):
    assert isinstance(result, Assignment), result
    return result


def refused(result):
    assert isinstance(result, Unplaceable), result
    return result


def test_one_pod_takes_the_exact_fit_not_an_empty_node():
    nodes = two_racks(used={"n5": 4})
    result = placed(plan(nodes, [GroupRequest("g", 1, 4)]).results["g"])
    assert result.nodes == ("n5",)
    assert result.level == "node"
    assert result.domains == {"nvlink": "nv2", "rack": "r1", "zone": "z1"}


def test_a_whole_node_pod_goes_where_it_breaks_no_free_nvlink_domain():
    # nv0 (n0, n1) is empty; n2 is full so n3 alone cannot be half of a 16-GPU group anyway
    nodes = two_racks(used={"n2": 8, "n4": 8, "n5": 8, "n6": 8, "n7": 8})
    shapes = [GroupShape(2, 8, required_level="nvlink"), GroupShape(1, 8)]
    result = placed(plan(nodes, [GroupRequest("g", 1, 8)], shapes_in_use=shapes).results["g"])
    assert result.nodes == ("n3",)


def test_small_pods_fill_a_started_node_before_breaking_an_empty_one():
    nodes = two_racks(used={"n1": 6})
    results = plan(nodes, [GroupRequest("a", 1, 1), GroupRequest("b", 1, 1)]).results
    assert placed(results["a"]).nodes == ("n1",)
    assert placed(results["b"]).nodes == ("n1",)


def test_among_equal_nodes_a_pod_joins_the_node_running_the_most_pods():
    # n0 and n1 both have 4 free in the same NVLink domain: first fit takes n0; best fit adds the pod to n1,
    # whose 4 pods keep it busy for longer than n0's one pod anyway
    nodes = [
        gpu_node("n0", "nv0", "r0", used=4, gpu_pods=1),
        gpu_node("n1", "nv0", "r0", used=4, gpu_pods=4),
    ]
    assert placed(plan(nodes, [GroupRequest("g", 1, 2)]).results["g"]).nodes == ("n1",)
    # without the pod counts the two nodes are equal and the order decides
    unknown = [replace(node, gpu_pods=0) for node in nodes]
    assert placed(plan(unknown, [GroupRequest("g", 1, 2)]).results["g"]).nodes == ("n0",)


def test_the_planner_counts_the_pods_it_places_and_releases():
    planner = Planner([gpu_node("x", "nv0", "r0"), gpu_node("y", "nv0", "r0")])
    first = placed(planner.place(GroupRequest("a", 1, 4)))
    assert placed(planner.place(GroupRequest("b", 1, 4))).nodes == first.nodes == ("x",)  # the exact fit
    assert placed(planner.place(GroupRequest("c", 1, 2))).nodes == ("y",)
    assert placed(planner.place(GroupRequest("d", 1, 2))).nodes == ("y",)
    planner.release(first)
    assert planner.free_gpus() == {"x": 4, "y": 4}
    assert planner.pods_running() == {"x": 1, "y": 2}
    # x comes first and is as tight as y: first fit would take it; y runs more pods
    assert placed(planner.place(GroupRequest("e", 1, 2))).nodes == ("y",)


def test_a_shape_mix_weighs_losses_by_share_instead_of_size_first():
    # n0 has 4 free, n1 has 6: a 1-GPU pod costs n0 its 4-GPU slot, or n1 one of its two 3-GPU slots
    nodes = [gpu_node("n0", "nv0", "r0", used=4), gpu_node("n1", "nv1", "r0", used=2)]
    three, four = GroupShape(1, 3), GroupShape(1, 4)
    pod = [GroupRequest("g", 1, 1)]
    assert placed(plan(nodes, pod, shapes_in_use=[three, four]).results["g"]).nodes == ("n1",)
    mostly_threes = {three: 0.9, four: 0.1}
    assert placed(plan(nodes, pod, shapes_in_use=mostly_threes).results["g"]).nodes == ("n0",)


def test_a_two_node_group_prefers_one_nvlink_domain():
    nodes = two_racks(
        used={"n0": 8, "n3": 8, "n5": 8, "n6": 8}
    )  # free nodes: n1, n2, n4, n7 (no pair shares NVLink)
    nodes[7] = gpu_node("n7", "nv3", "r1")
    request = GroupRequest("g", 2, 8, required_level="rack", preferred_level="nvlink")
    result = placed(plan(nodes, [request]).results["g"])
    assert result.level == "rack"  # no NVLink domain has two free nodes
    assert not result.preferred_met
    assert len({name for name in result.nodes}) == 2

    nodes = two_racks(used={"n0": 8, "n1": 8, "n2": 8, "n3": 8, "n4": 8})  # nv3 (n6, n7) is whole
    result = placed(plan(nodes, [request]).results["g"])
    assert sorted(result.nodes) == ["n6", "n7"]
    assert result.level == "nvlink"
    assert result.preferred_met
    assert result.domains["nvlink"] == "nv3"


def test_the_required_level_is_never_given_up():
    nodes = two_racks(used={"n0": 8, "n1": 8, "n2": 8, "n4": 8, "n5": 8, "n6": 8})  # one free node per rack
    result = refused(
        plan(nodes, [GroupRequest("ns/m/group-0", 2, 8, "H100-SXM", "rack")]).results["ns/m/group-0"]
    )
    assert result.level == "rack"
    assert result.short_gpus == 8
    assert result.reason == (
        "needs 16 GPUs (2 pods × 8) of H100-SXM within one rack; the best rack has 8 free (short 8)"
    )
    # the same group without a required level spans the racks
    assert placed(plan(nodes, [GroupRequest("g", 2, 8)]).results["g"]).level == "zone"


def test_the_reason_counts_only_gpus_usable_in_whole_pods():
    nodes = two_racks(used={"n0": 4, "n1": 8, "n2": 8, "n3": 8, "n4": 8, "n5": 8, "n6": 8, "n7": 8})
    nodes[3] = gpu_node("n3", "nv1", "r0", used=4)
    result = refused(plan(nodes, [GroupRequest("g", 4, 4, "H100-SXM", "rack")]).results["g"])
    assert result.reason.endswith("the best rack has 8 free (short 8)")
    result = refused(plan(nodes, [GroupRequest("g", 2, 8, "H100-SXM", "rack")]).results["g"])
    assert result.reason.endswith("the best rack has 8 free but only 0 usable in pods of 8 (short 16)")


def test_a_one_pod_group_that_fits_no_node_says_so():
    result = refused(
        plan(two_racks(used={f"n{i}": 2 for i in range(8)}), [GroupRequest("g", 1, 8)]).results["g"]
    )
    assert result.level == "node"
    assert result.short_gpus == 2
    assert result.reason == "needs 8 GPUs on one node; the best node has 6 free (short 2)"
    result = refused(plan(two_racks(), [GroupRequest("g", 1, 16)]).results["g"])
    assert "no node has more than 8 GPUs" in result.reason


def test_the_gpu_product_must_match_and_a_group_never_mixes_products():
    nodes = [
        gpu_node("h0", "nv0", "r0", product="H100-SXM", used=4),
        gpu_node("a0", "nv1", "r0", product="A100", used=4),
    ]
    result = refused(plan(nodes, [GroupRequest("g", 1, 8, "H100-SXM")]).results["g"])
    assert "of H100-SXM" in result.reason
    result = refused(plan(nodes, [GroupRequest("g", 1, 4, "B200")]).results["g"])
    assert result.reason.startswith("no ready, schedulable node has GPUs of B200")
    # 2 pods × 4 fit only if the pods may mix products: they may not
    refused(plan(nodes, [GroupRequest("g", 2, 4, required_level="rack")]).results["g"])
    assert placed(plan(nodes, [GroupRequest("g", 1, 4, "A100")]).results["g"]).nodes == ("a0",)


def test_unready_and_unschedulable_nodes_are_never_used():
    nodes = [
        gpu_node("down", "nv0", "r0", ready=False),
        gpu_node("cordoned", "nv0", "r0", schedulable=False),
        gpu_node("busy", "nv1", "r0", used=6),
    ]
    results = plan(nodes, [GroupRequest("a", 1, 2), GroupRequest("b", 1, 2)]).results
    assert placed(results["a"]).nodes == ("busy",)
    refused(results["b"])


def test_groups_of_one_call_see_each_other_and_the_largest_goes_first():
    nodes = [gpu_node("n0", "nv0", "r0"), gpu_node("n1", "nv0", "r0")]
    outcome = plan(nodes, [GroupRequest("small", 1, 4), GroupRequest("big", 2, 8), GroupRequest("mid", 1, 4)])
    placed(outcome.results["big"])
    refused(outcome.results["small"])
    refused(outcome.results["mid"])
    assert list(outcome.results) == ["small", "big", "mid"]  # the caller's order
    assert outcome.free_gpus_after == {"n0": 0, "n1": 0}


def test_spread_uses_the_emptiest_domains_best_fit_packs():
    nodes = two_racks(used={"n0": 2})
    groups = [GroupRequest(f"g{i}", 1, 2, preferred_level="rack", strategy="spread") for i in range(2)]
    results = plan(nodes, groups).results
    racks = {placed(result).domains["rack"] for result in results.values()}
    assert racks == {"r0", "r1"}
    assert placed(results["g0"]).domains["rack"] == "r1"  # r1 is the emptier rack

    groups = [GroupRequest(f"g{i}", 1, 2) for i in range(2)]
    results = plan(nodes, groups).results
    assert {placed(result).nodes for result in results.values()} == {("n0",)}


def test_spread_puts_multi_node_groups_in_different_racks_best_fit_in_one():
    def racks_used(strategy):
        groups = [GroupRequest(f"g{i}", 2, 8, preferred_level="rack", strategy=strategy) for i in range(2)]
        return [placed(result).domains["rack"] for result in plan(two_racks(), groups).results.values()]

    assert sorted(racks_used("spread")) == ["r0", "r1"]
    assert len(set(racks_used("best-fit"))) == 1


def test_nodes_without_topology_labels_are_domains_of_their_own():
    nodes = [gpu_node("bare0", None, None, zone=None), gpu_node("bare1", None, None, zone=None)]
    refused(plan(nodes, [GroupRequest("g", 2, 8, required_level="nvlink")]).results["g"])
    result = placed(plan(nodes, [GroupRequest("g", 2, 8)]).results["g"])
    assert result.level == "cluster"
    assert result.domains == {}
    result = placed(plan(nodes, [GroupRequest("g", 1, 8, required_level="rack")]).results["g"])
    assert result.domains == {"nvlink": None, "rack": None, "zone": None}


def test_the_same_inner_label_in_two_racks_is_two_domains():
    nodes = [gpu_node("a", "nv0", "r0"), gpu_node("b", "nv0", "r1")]
    refused(plan(nodes, [GroupRequest("g", 2, 8, required_level="nvlink")]).results["g"])


def test_a_group_required_on_one_node_never_spans_nodes():
    nodes = [gpu_node("a", "nv0", "r0", used=4), gpu_node("b", "nv0", "r0", used=4)]
    result = refused(plan(nodes, [GroupRequest("g", 2, 4, required_level="node")]).results["g"])
    assert result.level == "node"
    assert (
        placed(plan(nodes, [GroupRequest("g", 2, 4, required_level="nvlink")]).results["g"]).level == "nvlink"
    )


def test_custom_levels():
    levels = [TopologyLevel("switch", "example.com/switch")]
    nodes = [Node(f"n{i}", {"example.com/switch": f"s{i % 2}"}, 4, 0, "L4") for i in range(4)]
    result = placed(plan(nodes, [GroupRequest("g", 2, 4, required_level="switch")], levels).results["g"])
    assert result.domains["switch"] in {"s0", "s1"}
    assert len(set(result.nodes)) == 2


def test_bad_requests_name_what_is_wrong():
    nodes = two_racks()
    with pytest.raises(ValueError, match=r"group 'g'.required_level: unknown topology level 'row'"):
        plan(nodes, [GroupRequest("g", 1, 1, required_level="row")])
    with pytest.raises(ValueError, match=r"group 'g'.strategy: 'worst-fit' is not one of"):
        plan(nodes, [GroupRequest("g", 1, 1, strategy="worst-fit")])
    with pytest.raises(ValueError, match=r"pods and gpus_per_pod must be >= 1"):
        plan(nodes, [GroupRequest("g", 0, 1)])
    with pytest.raises(ValueError, match=r"repeated: g"):
        plan(nodes, [GroupRequest("g", 1, 1), GroupRequest("g", 1, 2)])
    with pytest.raises(ValueError, match=r"node 'n0' is listed twice"):
        plan(nodes + nodes[:1], [])


def test_release_gives_back_exactly_what_place_took():
    planner = Planner(two_racks(used={"n3": 5}))
    before = planner.free_gpus()
    assignments = [planner.place(GroupRequest(f"g{i}", 2, 4)) for i in range(3)]
    assert planner.free_gpus() != before
    for assignment in assignments:
        planner.release(placed(assignment))
    assert planner.free_gpus() == before


def test_stranded_gpus_are_free_gpus_no_shape_can_use():
    nodes = two_racks(used={"n0": 5, "n1": 8, "n2": 8, "n3": 8, "n4": 8, "n5": 8, "n6": 8})
    # free: n0 has 3, n7 has 8 (its NVLink partner n6 is full)
    assert stranded_gpus(nodes, [GroupShape(1, 4)]) == 3
    assert stranded_gpus(nodes, [GroupShape(1, 2)]) == 1
    assert stranded_gpus(nodes, [GroupShape(1, 1)]) == 0
    assert stranded_gpus(nodes, [GroupShape(2, 8, required_level="nvlink")]) == 11
    assert stranded_gpus(nodes, [GroupShape(2, 8, required_level="rack")]) == 11
    assert stranded_gpus(nodes, [GroupShape(2, 8, required_level="nvlink"), GroupShape(1, 8)]) == 3
    assert stranded_gpus(nodes, [GroupShape(1, 4, gpu_product="A100")]) == 11


def test_expected_stranded_gpus_weighs_each_shape():
    nodes = two_racks(used={"n0": 5, "n1": 8, "n2": 8, "n3": 8, "n4": 8, "n5": 8, "n6": 8})
    mix = {GroupShape(1, 1): 1.0, GroupShape(1, 8): 1.0}
    # 11 free: all usable by 1-GPU groups, 8 of them by 8-GPU groups
    assert expected_stranded_gpus(nodes, mix) == pytest.approx((0 + 3) / 2)


def test_scale_down_frees_whole_domains_not_the_newest_group():
    nodes = [
        gpu_node("n0", "nv0", "r0", used=8),
        gpu_node("n1", "nv0", "r0", used=8),
        gpu_node("n2", "nv1", "r0", used=8),
        gpu_node("n3", "nv1", "r0", used=0),
    ]
    groups = [
        Assignment("old-a", ("n0",), 4, "H100-SXM", "node"),
        Assignment("old-b", ("n0",), 4, "H100-SXM", "node"),
        Assignment("middle", ("n2",), 8, "H100-SXM", "node"),  # removing it empties nv1
        Assignment("new", ("n1",), 8, "H100-SXM", "node"),
    ]
    assert choose_scale_down(groups, nodes, 1) == ["middle"]
    assert choose_scale_down(groups, nodes, 2) == ["middle", "new"]
    # a group on a node that went away goes first
    nodes[0] = gpu_node("n0", "nv0", "r0", used=8, ready=False)
    assert choose_scale_down(groups, nodes, 1) == ["old-b"]
