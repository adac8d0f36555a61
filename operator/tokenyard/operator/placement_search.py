"""How the planner chooses domains and nodes inside one product's index (see placement.py for the API).

Best fit, in one sentence: place a pod where it destroys the least capacity for the largest group shapes in
use, and among equally harmless places, the node already running the most pods (it frees up as a block later
anyway), then the tightest one, judged innermost level first (the node, then its NVLink domain, then its
rack...). The "capacity for a shape" of a domain is how many copies of that shape its free GPUs can host:
``pod_slots(g) // pods`` in each domain of the shape's required level. Placing a pod lowers it only in the
domains that contain the chosen node, so the loss is computed locally, from the index, in O(levels × shapes)
per candidate node. This is the idea behind fragmentation-gradient-descent scheduling (Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023): when
the caller knows the shape mix (each shape's share of the groups), the first criterion is the GPUs of the lost
copies weighted by share, which is exactly the rise in the expected stranded GPUs for that mix; then (or
alone, without a mix) the losses compared lexicographically, the largest shape first, because a large group is
the one that cannot go anywhere else.

The node search does not score every node: nodes sit in buckets by free GPUs, a lower bound of the score
is known per bucket, and buckets are visited best bound first until none can beat the best node found.
A group of several pods first picks its domain (only domains whose free total could hold it are even
looked at), then its nodes inside that domain, one pod at a time.

Spread is the opposite choice at every step: the domain and the node with the most free GPUs, the way
kube-scheduler's default least-allocated scoring spreads pods, but whole groups at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenyard.operator.placement_index import NODE_POSITION, Domain, IndexedNode, ProductIndex

BEST_FIT = "best-fit"
SPREAD = "spread"
STRATEGIES = (BEST_FIT, SPREAD)


@dataclass(frozen=True)
class ShapeView:
    """A group shape resolved against the configured levels: the unit of "useful capacity"."""

    pods: int
    gpus_per_pod: int
    position: int  # the level that must contain the group; len(levels) = anywhere in the cluster
    product: str | None
    # how much a lost copy of this shape weighs, per GPU, in parts per million of the shape mix; 0 when
    # the caller gave no mix (then only the lexicographic, largest-shape-first comparison counts)
    weight: int = 0

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    def applies_to(self, product: str) -> bool:
        return self.product is None or self.product == product

    def copies_in(self, domain_slots: int) -> int:
        return domain_slots // self.pods


@dataclass
class Choice:
    """A tentative placement inside one product's index (nothing is taken yet)."""

    node_ids: list[int]  # one per pod rank
    rank_key: tuple  # lower is better; comparable across the products' indexes of one request


class _SlotCache:
    """pod_slots per (domain, pod size) for the duration of one decision (the index does not change)."""

    def __init__(self) -> None:
        self._slots: dict[tuple[int, int], int] = {}

    def slots(self, domain: Domain, gpus_per_pod: int) -> int:
        key = (id(domain), gpus_per_pod)
        value = self._slots.get(key)
        if value is None:
            value = domain.pod_slots(gpus_per_pod)
            self._slots[key] = value
        return value


def _capacity_loss(shape: ShapeView, node: IndexedNode, take: int, cache: _SlotCache) -> int:
    """How many copies of `shape` the cluster can no longer host once `take` GPUs of `node` are used."""
    per_pod = shape.gpus_per_pod
    lost_slots = node.free // per_pod - (node.free - take) // per_pod
    if lost_slots == 0:
        return 0
    if shape.pods == 1:
        return lost_slots
    if shape.position == NODE_POSITION:
        slots = node.free // per_pod
    else:
        slots = cache.slots(node.ancestors[shape.position], per_pod)
    return shape.copies_in(slots) - shape.copies_in(slots - lost_slots)


def _capacity_loss_floor(shape: ShapeView, free: int, take: int) -> int:
    """A lower bound of _capacity_loss over every node with `free` free GPUs (exact when it depends on
    the node alone)."""
    per_pod = shape.gpus_per_pod
    lost_slots = free // per_pod - (free - take) // per_pod
    if shape.pods == 1:
        return lost_slots
    if shape.position == NODE_POSITION:
        return shape.copies_in(free // per_pod) - shape.copies_in((free - take) // per_pod)
    # floor(S/p) - floor((S-d)/p) >= floor(d/p) for any S >= d
    return lost_slots // shape.pods


def _weighted(shapes: Sequence[ShapeView], losses: Iterable[int]) -> int:
    """The GPUs of lost copies, weighted by the shape mix: the rise in expected stranded GPUs of Weng et
    al. when every shape's share is known (free GPUs drop by the same amount wherever the pod goes)."""
    return sum(shape.weight * shape.gpus * loss for shape, loss in zip(shapes, losses, strict=True))


def _fit_score(node: IndexedNode, take: int, shapes: Sequence[ShapeView], cache: _SlotCache) -> tuple:
    losses = [_capacity_loss(shape, node, take, cache) for shape in shapes]
    # among equally harmless nodes, the one running the most pods: a node's GPUs come back as a block only
    # when its last pod ends, and with lifetimes unknown (memoryless), a pod added to a node of n pods
    # delays that by 1/(n+1) of a lifetime: least on the busiest node ("fragment the fragmented")
    # then tightness after the losses, innermost first: the node, then each enclosing domain (not the root)
    tightness = [domain.free - take for domain in node.ancestors[:-1]]
    return (_weighted(shapes, losses), *losses, -node.residents, node.free - take, *tightness)


def _spread_score(node: IndexedNode, take: int) -> tuple:
    # most free first; ties go to the emptier enclosing domains, outermost first (spread zones, then racks)
    return (take - node.free, *(-domain.free for domain in reversed(node.ancestors[:-1])))


def best_node(
    index: ProductIndex,
    take: int,
    strategy: str,
    shapes: Sequence[ShapeView],
    candidates: Iterable[int] | None = None,
) -> tuple[int, tuple] | None:
    """The node (and its score, lower is better) to take `take` GPUs from, among `candidates` (node ids)
    or, when None, the whole index; None when no node has that many free."""
    if take > index.max_allocatable:
        return None
    nodes = index.nodes
    cache = _SlotCache()

    def score(node_id: int) -> tuple:
        node = nodes[node_id]
        if strategy == SPREAD:
            return (*_spread_score(node, take), node_id)
        return (*_fit_score(node, take, shapes, cache), node_id)

    if candidates is not None:
        scored = [score(node_id) for node_id in candidates if nodes[node_id].free >= take]
        if not scored:
            return None
        best = min(scored)
        return best[-1], best[:-1]

    buckets = index.nodes_by_free
    if strategy == SPREAD:
        for free in range(index.max_allocatable, take - 1, -1):
            if buckets[free]:
                best = min(score(node_id) for node_id in buckets[free])
                return best[-1], best[:-1]
        return None

    # Best fit over the whole cluster without scoring every node: visit the free-GPU buckets in the order
    # of a lower bound of their nodes' scores, and stop once no bucket left can beat the best node found.
    # (The index knows the most pods a node of each bucket runs, and an enclosing domain has at least the
    # node's own free GPUs: hence the last parts of the bound.)
    bounds = sorted(
        (
            (
                _weighted(shapes, [_capacity_loss_floor(shape, free, take) for shape in shapes]),
                *(_capacity_loss_floor(shape, free, take) for shape in shapes),
                -index.max_residents(free),
                *((free - take,) * (index.level_count + 1)),
                -1,
            ),
            free,
        )
        for free in range(take, index.max_allocatable + 1)
        if buckets[free]
    )
    best: tuple | None = None
    for bound, free in bounds:
        if best is not None and bound >= best:
            break
        bucket_best = _best_in_bucket(index, free, take, shapes, cache)
        if best is None or bucket_best < best:
            best = bucket_best
    if best is None:
        return None
    return best[-1], best[:-1]


def _best_in_bucket(
    index: ProductIndex, free: int, take: int, shapes: Sequence[ShapeView], cache: _SlotCache
) -> tuple:
    """The best-fit score (with the node id last) of the best node among those with exactly `free` free
    GPUs. The hot loop of the planner: only the parts of the score that differ between these nodes are
    computed per node (the loss of shapes that span nodes, and the enclosing domains' free GPUs)."""
    varying = [
        shape
        for shape in shapes
        if shape.pods > 1
        and shape.position != NODE_POSITION
        and free // shape.gpus_per_pod - (free - take) // shape.gpus_per_pod > 0
    ]
    nodes = index.nodes
    best_key: list | None = None
    for node_id in index.nodes_by_free[free]:
        ancestors = nodes[node_id].ancestors
        losses = [_capacity_loss(shape, nodes[node_id], take, cache) for shape in varying]
        key = [_weighted(varying, losses), *losses, -nodes[node_id].residents]
        key.extend([domain.free for domain in ancestors[:-1]])
        key.append(node_id)
        if best_key is None or key < best_key:
            best_key = key
    assert best_key is not None, "buckets are visited only when not empty"
    return _fit_score(nodes[best_key[-1]], take, shapes, cache) + (best_key[-1],)


def _domain_key(domain: Domain, pods: int, gpus_per_pod: int, strategy: str, cache: _SlotCache) -> tuple:
    ancestors = []
    parent = domain.parent
    while parent is not None and parent.parent is not None:  # not the root
        ancestors.append(parent.free)
        parent = parent.parent
    slots = cache.slots(domain, gpus_per_pod)
    if strategy == SPREAD:
        return (-domain.free, -slots, *(-free for free in reversed(ancestors)))
    # tightest first: fewest pod slots left, then fewest free GPUs left, then the fullest enclosing domains
    return (slots - pods, domain.free - pods * gpus_per_pod, *ancestors)


def search(
    index: ProductIndex,
    pods: int,
    gpus_per_pod: int,
    start: int,
    end: int,
    strategy: str,
    shapes: Sequence[ShapeView],
) -> Choice | None:
    """Find where a group of `pods` × `gpus_per_pod` GPUs goes in this index: inside one domain of the
    innermost level from `start` to `end` (positions; NODE_POSITION = one node) that can hold it.
    Returns None when no domain up to `end` can."""
    cache = _SlotCache()
    for position in range(start, end + 1):
        if position == NODE_POSITION:
            found = best_node(index, pods * gpus_per_pod, strategy, shapes)
            if found is not None:
                node_id, node_score = found
                return Choice([node_id] * pods, (position, node_score))
            continue
        need = pods * gpus_per_pod
        feasible = [
            domain
            for domain in index.domains_by_position[position]
            # the free total is a cheap necessary condition; a near-full cluster fails most domains on it
            if domain.free >= need and cache.slots(domain, gpus_per_pod) >= pods
        ]
        if not feasible:
            continue
        keyed = min(
            (_domain_key(domain, pods, gpus_per_pod, strategy, cache), n, domain)
            for n, domain in enumerate(feasible)
        )
        domain_key, _, domain = keyed
        return Choice(
            _pods_within(index, domain, pods, gpus_per_pod, strategy, shapes), (position, domain_key)
        )
    return None


def _pods_within(
    index: ProductIndex,
    domain: Domain,
    pods: int,
    gpus_per_pod: int,
    strategy: str,
    shapes: Sequence[ShapeView],
) -> list[int]:
    """Choose a node per pod inside `domain`, one pod at a time (each choice sees the ones before), then
    give the GPUs back: the caller commits the choice it prefers."""
    chosen: list[int] = []
    try:
        for _ in range(pods):
            found = best_node(index, gpus_per_pod, strategy, shapes, candidates=domain.node_ids)
            if found is None:  # cannot happen: the domain was checked to have enough pod slots
                raise AssertionError(f"domain ran out of pod slots after {len(chosen)} of {pods} pods")
            index.take(found[0], gpus_per_pod)
            chosen.append(found[0])
    finally:
        for node_id in chosen:
            index.give(node_id, gpus_per_pod)
    return chosen
