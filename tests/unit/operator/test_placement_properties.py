"""Invariants of the placement planner on random clusters and requests (hypothesis).

The checks recompute everything from the plain inputs (labels, counts) without the planner's index, so a
bug in the index cannot hide itself.
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.core import labels
from tokenyard.operator.placement import (
    DEFAULT_LEVELS,
    Assignment,
    GroupRequest,
    Node,
    Planner,
    Unplaceable,
    plan,
)

LEVEL_NAMES = [level.name for level in DEFAULT_LEVELS]
PRODUCTS = ["H100-SXM", "A100"]


@st.composite
def clusters(draw):
    count = draw(st.integers(min_value=1, max_value=12))
    nodes = []
    for i in range(count):
        allocatable = draw(st.sampled_from([4, 8]))
        rack = draw(st.integers(0, 2))
        node_labels = {
            labels.NODE_ZONE: f"z{rack // 2}",
            labels.NODE_RACK: f"r{rack}",
            # the NVLink label repeats across racks on purpose: domains are named by their whole path
            labels.NODE_NVLINK_DOMAIN: f"nv{draw(st.integers(0, 1))}",
        }
        for key in list(node_labels):
            if draw(st.integers(0, 9)) == 0:  # now and then a node misses a label
                del node_labels[key]
        nodes.append(
            Node(
                name=f"n{i}",
                labels=node_labels,
                gpu_allocatable=allocatable,
                gpu_used=draw(st.integers(0, allocatable)),
                gpu_product=draw(st.sampled_from(PRODUCTS)),
                ready=draw(st.integers(0, 7)) != 0,
                schedulable=draw(st.integers(0, 7)) != 0,
                gpu_pods=draw(st.integers(0, 3)),
            )
        )
    return nodes


levels_or_none = st.sampled_from([None, "node", *LEVEL_NAMES, "cluster"])

requests = st.builds(
    GroupRequest,
    key=st.just(""),
    pods=st.integers(1, 3),
    gpus_per_pod=st.sampled_from([1, 2, 4, 8]),
    gpu_product=st.sampled_from([None, *PRODUCTS]),
    required_level=levels_or_none,
    preferred_level=levels_or_none,
    strategy=st.sampled_from(["best-fit", "spread"]),
)


def keyed(groups):
    return [
        GroupRequest(
            f"g{i}",
            group.pods,
            group.gpus_per_pod,
            group.gpu_product,
            group.required_level,
            group.preferred_level,
            group.strategy,
        )
        for i, group in enumerate(groups)
    ]


def domain_of(node: Node, level: str):
    """The node's domain at `level`, from its labels alone: the path of values from the outermost level
    inwards, an unlabelled level making the node a domain of its own."""
    if level == "node":
        return node.name
    if level == "cluster":
        return ()
    path = []
    for candidate in reversed(DEFAULT_LEVELS):
        value = node.labels.get(candidate.label)
        path.append(value if value is not None else ("alone", node.name))
        if candidate.name == level:
            return tuple(path)
    raise AssertionError(level)


def fits(group: GroupRequest, nodes: list[Node], free: dict[str, int]) -> bool:
    """Brute force: could the group go anywhere, given the free GPUs?"""
    level = group.required_level or "cluster"
    slots: Counter = Counter()
    for node in nodes:
        if node.name not in free or (group.gpu_product and node.gpu_product != group.gpu_product):
            continue
        slots[(node.gpu_product, domain_of(node, level))] += free[node.name] // group.gpus_per_pod
    return any(count >= group.pods for count in slots.values())


@settings(max_examples=200, deadline=None)
@given(nodes=clusters(), groups=st.lists(requests, min_size=1, max_size=6), largest_first=st.booleans())
def test_every_plan_is_valid(nodes, groups, largest_first):
    groups = keyed(groups)
    outcome = plan(nodes, groups, largest_first=largest_first)
    by_name = {node.name: node for node in nodes}
    assert list(outcome.results) == [group.key for group in groups]

    taken: Counter = Counter()
    for group in groups:
        result = outcome.results[group.key]
        assert result.group_key == group.key
        if isinstance(result, Unplaceable):
            assert result.short_gpus > 0
            assert result.reason
            continue
        assert isinstance(result, Assignment)
        # all or nothing: one node per pod rank
        assert len(result.nodes) == group.pods
        assert result.gpus_per_pod == group.gpus_per_pod
        chosen = [by_name[name] for name in result.nodes]
        for node in chosen:
            taken[node.name] += group.gpus_per_pod
            # never an unready or unschedulable node, never another GPU product; one product per group
            assert node.ready and node.schedulable
            assert node.gpu_product == result.gpu_product
            if group.gpu_product is not None:
                assert node.gpu_product == group.gpu_product
        # the required level is never violated
        if group.required_level is not None:
            assert len({domain_of(node, group.required_level) for node in chosen}) == 1
        # the reported domains are true
        for level, value in result.domains.items():
            label = next(candidate.label for candidate in DEFAULT_LEVELS if candidate.name == level)
            assert {node.labels.get(label) for node in chosen} == {value}
            assert len({domain_of(node, level) for node in chosen}) == 1

    # no GPU double-booked, and the reported free GPUs are what is left
    for name, gpus in taken.items():
        assert by_name[name].gpu_used + gpus <= by_name[name].gpu_allocatable
    eligible = {node.name: node for node in nodes if node.ready and node.schedulable}
    assert outcome.free_gpus_after == {name: node.gpu_free - taken[name] for name, node in eligible.items()}

    # a group is refused only when it does not fit even now (capacity only shrinks during a plan)
    for group in groups:
        if isinstance(outcome.results[group.key], Unplaceable):
            assert not fits(group, nodes, outcome.free_gpus_after), group


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), groups=st.lists(requests, min_size=1, max_size=8), data=st.data())
def test_placing_and_releasing_in_any_order_returns_to_the_start(nodes, groups, data):
    planner = Planner(nodes)
    start = planner.free_gpus()
    pods_at_start = planner.pods_running()
    placed = []
    for group in keyed(groups):
        result = planner.place(group)
        if isinstance(result, Assignment):
            placed.append(result)
        assert all(free >= 0 for free in planner.free_gpus().values())
        planner.verify_index()
    for assignment in data.draw(st.permutations(placed)):
        planner.release(assignment)
        planner.verify_index()
    assert planner.free_gpus() == start
    assert planner.pods_running() == pods_at_start


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), groups=st.lists(requests, min_size=1, max_size=6), count=st.integers(0, 6))
def test_scale_down_names_placed_groups_once(nodes, groups, count):
    planner = Planner(nodes)
    placed = [result for result in map(planner.place, keyed(groups)) if isinstance(result, Assignment)]
    chosen = planner.choose_scale_down(placed, count)
    assert len(chosen) == min(count, len(placed))
    assert len(set(chosen)) == len(chosen)
    assert set(chosen) <= {group.group_key for group in placed}
