"""Topology-aware gang placement of replica groups: a pure planner (plain data in, plain decision out).

A group is ``pods`` pods of ``gpus_per_pod`` GPUs each, placed whole or not at all. Nodes carry topology
labels read through ``TopologyLevel``s, innermost first (NVLink domain, rack, zone, see
``tokenyard.core.labels.DEFAULT_TOPOLOGY_LEVELS``). Two pseudo-levels frame the configured ones: ``"node"``
(one node, inside everything) and ``"cluster"`` (anywhere).

* ``required_level``: every pod of the group inside one domain of that level, or the group is not placed.
* ``preferred_level``: the level the search starts at; it moves outwards (towards the required level) only
  when no domain of the preferred level can hold the group. Without one, a group of several pods is first
  tried on one node. A group of one pod fits inside one domain of every level by definition.
* ``strategy``: ``"best-fit"`` (default) keeps large blocks free (see placement_search.py for the rule);
  ``"spread"`` puts each group in the emptiest domain and nodes, for availability.

"Large blocks" are measured in the shapes in use (``GroupShape``: pods, GPUs per pod, product, required
level): the planner protects the capacity to host them. Pass every shape the cluster runs, ideally with
its share of the groups (a mapping shape -> share), so that best fit minimises the expected stranded GPUs
for that mix (``expected_stranded_gpus``). ``stranded_gpus`` is the strict count the operator exports:
free GPUs that no pod of any shape in use could use. ``choose_scale_down`` picks the groups whose removal
frees whole domains (racks, NVLink domains, nodes) rather than the newest.

Groups placed in one call see the ones placed before them; nothing is ever double-booked. The caller's
``gpu_used`` must already count every GPU of pods that are bound or pinned to a node.

Reading order: this module (types and API), placement_search.py (the choices), placement_index.py (the
free-capacity index that keeps a decision under a few milliseconds at 1,000 nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tokenyard.core import labels
from tokenyard.operator.placement_index import NODE_POSITION, Domain, ProductIndex
from tokenyard.operator.placement_search import BEST_FIT, SPREAD, STRATEGIES, ShapeView, search

NODE_LEVEL = "node"
CLUSTER_LEVEL = "cluster"

__all__ = [
    "BEST_FIT",
    "CLUSTER_LEVEL",
    "DEFAULT_LEVELS",
    "NODE_LEVEL",
    "SPREAD",
    "Assignment",
    "GroupRequest",
    "GroupShape",
    "Node",
    "PlacementPlan",
    "Planner",
    "TopologyLevel",
    "Unplaceable",
    "choose_scale_down",
    "expected_stranded_gpus",
    "plan",
    "stranded_gpus",
]


@dataclass(frozen=True)
class TopologyLevel:
    """One level of the GPU topology: its name (used in requests) and the node label that holds it."""

    name: str
    label: str


DEFAULT_LEVELS: tuple[TopologyLevel, ...] = tuple(
    TopologyLevel(name, label) for name, label in labels.DEFAULT_TOPOLOGY_LEVELS
)


@dataclass(frozen=True)
class Node:
    """What the planner needs to know of a node; the adapter decides `schedulable` (cordoned, or tainted
    in a way the groups do not tolerate, means False)."""

    name: str
    labels: Mapping[str, str]
    gpu_allocatable: int
    gpu_used: int = 0
    gpu_product: str = ""
    ready: bool = True
    schedulable: bool = True
    # GPU pods running on the node (bound or pinned), when the caller knows: best fit prefers to add a pod
    # to a node that already runs many, whose GPUs are all free again later anyway (0: unknown)
    gpu_pods: int = 0

    @property
    def gpu_free(self) -> int:
        return max(0, self.gpu_allocatable - self.gpu_used)

    @property
    def eligible(self) -> bool:
        return self.ready and self.schedulable and self.gpu_allocatable > 0


@dataclass(frozen=True)
class GroupShape:
    """The shape of a group, as far as capacity is concerned: what "useful free GPUs" are measured in."""

    pods: int
    gpus_per_pod: int
    gpu_product: str | None = None
    required_level: str | None = None

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True)
class GroupRequest:
    """One replica group to place. `key` names it in results and errors (e.g. "ns/name/group-3")."""

    key: str
    pods: int
    gpus_per_pod: int
    gpu_product: str | None = None
    required_level: str | None = None
    preferred_level: str | None = None
    strategy: str = BEST_FIT

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def shape(self) -> GroupShape:
        return GroupShape(self.pods, self.gpus_per_pod, self.gpu_product, self.required_level)


@dataclass(frozen=True)
class Assignment:
    """Where a group goes: `nodes[rank]` is the node of pod `rank`."""

    group_key: str
    nodes: tuple[str, ...]
    gpus_per_pod: int
    gpu_product: str
    # the innermost level that contains the whole group: "node", a configured level's name, or "cluster"
    level: str
    # the group's domain at every configured level that contains it whole (None: the node has no label)
    domains: Mapping[str, str | None] = field(default_factory=dict)
    preferred_met: bool = True

    @property
    def gpus(self) -> int:
        return len(self.nodes) * self.gpus_per_pod


@dataclass(frozen=True)
class Unplaceable:
    """Why a group cannot be placed now: the level that could not hold it and how many GPUs it lacks."""

    group_key: str
    reason: str
    level: str
    short_gpus: int


@dataclass(frozen=True)
class PlacementPlan:
    """The outcome of one `plan` call, in the order the groups were given."""

    results: Mapping[str, Assignment | Unplaceable]
    free_gpus_after: Mapping[str, int]  # per eligible node, once every assignment is counted

    @property
    def assignments(self) -> list[Assignment]:
        return [result for result in self.results.values() if isinstance(result, Assignment)]

    @property
    def unplaceable(self) -> list[Unplaceable]:
        return [result for result in self.results.values() if isinstance(result, Unplaceable)]


class Planner:
    """The free GPUs of a cluster, indexed by topology domain, and the decisions made against them.

    `plan` and the other module functions build one per call; a caller that places and releases many
    groups against the same nodes (the benchmark, an operator between node updates) keeps one.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        levels: Sequence[TopologyLevel] = DEFAULT_LEVELS,
        shapes_in_use: Iterable[GroupShape] | Mapping[GroupShape, float] = (),
    ) -> None:
        self.levels = tuple(levels)
        self._position_by_level = self._level_positions(self.levels)
        self._indexes: dict[str, ProductIndex] = {}
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                raise ValueError(f"node {node.name!r} is listed twice")
            seen.add(node.name)
            if node.gpu_allocatable < 0 or node.gpu_used < 0 or node.gpu_pods < 0:
                raise ValueError(f"node {node.name!r}: GPU and pod counts must be >= 0")
            if not node.eligible:
                continue
            index = self._indexes.get(node.gpu_product)
            if index is None:
                index = self._indexes[node.gpu_product] = ProductIndex(node.gpu_product, len(self.levels))
            index.add_node(
                node.name,
                node.gpu_allocatable,
                node.gpu_free,
                [node.labels.get(level.label) or None for level in self.levels],
                node.gpu_pods,
            )
        self.shapes_in_use: list[ShapeView] = []
        self.set_shapes_in_use(shapes_in_use)

    @staticmethod
    def _level_positions(levels: Sequence[TopologyLevel]) -> dict[str, int]:
        positions = {NODE_LEVEL: NODE_POSITION}
        for position, level in enumerate(levels):
            if level.name in positions or level.name == CLUSTER_LEVEL:
                raise ValueError(f"topology level name {level.name!r} is reserved or used twice")
            positions[level.name] = position
        positions[CLUSTER_LEVEL] = len(levels)
        return positions

    def _position(self, level: str | None, what: str, default: int) -> int:
        if level is None:
            return default
        position = self._position_by_level.get(level)
        if position is None:
            known = ", ".join(self._position_by_level)
            raise ValueError(f"{what}: unknown topology level {level!r} (known: {known})")
        return position

    def _level_name(self, position: int) -> str:
        if position == NODE_POSITION:
            return NODE_LEVEL
        if position >= len(self.levels):
            return CLUSTER_LEVEL
        return self.levels[position].name

    def _shape_view(self, shape: GroupShape, what: str) -> ShapeView:
        if shape.pods < 1 or shape.gpus_per_pod < 1:
            raise ValueError(
                f"{what}: pods and gpus_per_pod must be >= 1, got {shape.pods} and {shape.gpus_per_pod}"
            )
        position = self._position(shape.required_level, f"{what}.required_level", len(self.levels))
        return ShapeView(shape.pods, shape.gpus_per_pod, position, shape.gpu_product)

    def set_shapes_in_use(self, shapes: Iterable[GroupShape] | Mapping[GroupShape, float]) -> None:
        """The group shapes whose capacity best fit protects (duplicates ignored).

        Given as a mapping shape -> share of the groups (arrivals or running groups), best fit minimises
        the rise in expected stranded GPUs for that mix first; in any case it then protects the largest
        shapes first."""
        shares = dict(shapes) if isinstance(shapes, Mapping) else dict.fromkeys(shapes, 0.0)
        if any(share < 0 for share in shares.values()):
            raise ValueError("shapes_in_use: a shape's share must be >= 0")
        total = sum(shares.values())
        views = {
            replace(
                self._shape_view(shape, f"shape {shape}"),
                weight=round(1_000_000 * share / total) if total > 0 else 0,
            )
            for shape, share in shares.items()
        }
        self.shapes_in_use = sorted(views, key=lambda view: (-view.gpus, -view.gpus_per_pod, view.position))

    # --- placing and releasing -----------------------------------------------------------------------

    def check(self, request: GroupRequest) -> tuple[int, int]:
        """Validate a request against the configured levels; return the level positions its search
        starts and ends at. Raises ValueError naming the group and the field."""
        what = f"group {request.key!r}"
        if request.strategy not in STRATEGIES:
            raise ValueError(f"{what}.strategy: {request.strategy!r} is not one of {', '.join(STRATEGIES)}")
        end = self._shape_view(request.shape, what).position
        start = self._position(request.preferred_level, f"{what}.preferred_level", NODE_POSITION)
        if request.pods == 1 and request.strategy == BEST_FIT:
            # one pod fits inside one domain of every level: the best node anywhere is the answer, and its
            # score already prefers tight enclosing domains
            start = NODE_POSITION
        return min(start, end), end

    def place(self, request: GroupRequest) -> Assignment | Unplaceable:
        """Place one group whole (and count its GPUs as used) or say why it cannot be placed."""
        start, end = self.check(request)
        best_choice = None
        best_index = None
        for product in self._products_for(request.gpu_product):
            index = self._indexes[product]
            shapes = [shape if shape.applies_to(product) else _INERT_SHAPE for shape in self.shapes_in_use]
            choice = search(index, request.pods, request.gpus_per_pod, start, end, request.strategy, shapes)
            if choice is not None and (best_choice is None or choice.rank_key < best_choice.rank_key):
                best_choice, best_index = choice, index
        if best_choice is None or best_index is None:
            return self._unplaceable(request, end)
        for node_id in best_choice.node_ids:
            best_index.take(node_id, request.gpus_per_pod)
        return self._assignment(request, best_index, best_choice.node_ids)

    def release(self, assignment: Assignment) -> None:
        """Give a placed group's GPUs back (nodes that are no longer eligible are skipped)."""
        index = self._indexes.get(assignment.gpu_product)
        for name in assignment.nodes:
            node_id = index.node_id_by_name.get(name) if index is not None else None
            if node_id is not None:
                index.give(node_id, assignment.gpus_per_pod)

    def free_gpus(self) -> dict[str, int]:
        """Free GPUs per eligible node."""
        return {node.name: node.free for index in self._indexes.values() for node in index.nodes}

    def pods_running(self) -> dict[str, int]:
        """GPU pods per eligible node as the planner counts them: the nodes' `gpu_pods` plus the pods it
        placed minus the pods it released (within what the node's used GPUs allow)."""
        return {node.name: node.residents for index in self._indexes.values() for node in index.nodes}

    def verify_index(self) -> None:
        """Self-check for tests: the index's aggregates agree with its nodes (AssertionError if not)."""
        for index in self._indexes.values():
            index.verify()

    def _products_for(self, product: str | None) -> list[str]:
        if product is None:
            return sorted(self._indexes)
        return [product] if product in self._indexes else []

    def _assignment(self, request: GroupRequest, index: ProductIndex, node_ids: list[int]) -> Assignment:
        nodes = [index.nodes[node_id] for node_id in node_ids]
        domains: dict[str, str | None] = {}
        innermost = NODE_POSITION if len(set(node_ids)) == 1 else None
        for position, level in enumerate(self.levels):
            shared = {id(node.ancestors[position]) for node in nodes}
            if len(shared) == 1:
                domains[level.name] = nodes[0].ancestors[position].value
                if innermost is None:
                    innermost = position
        if innermost is None:
            innermost = len(self.levels)
        preferred = self._position(request.preferred_level, "preferred_level", innermost)
        return Assignment(
            group_key=request.key,
            nodes=tuple(node.name for node in nodes),
            gpus_per_pod=request.gpus_per_pod,
            gpu_product=index.product,
            level=self._level_name(innermost),
            domains=domains,
            preferred_met=innermost <= preferred,
        )

    def _unplaceable(self, request: GroupRequest, end: int) -> Unplaceable:
        product_words = f" of {request.gpu_product}" if request.gpu_product else ""
        products = self._products_for(request.gpu_product)
        if not products:
            known = ", ".join(sorted(p or "(unlabelled)" for p in self._indexes)) or "none"
            return Unplaceable(
                request.key,
                f"no ready, schedulable node has GPUs{product_words} (products available: {known})",
                self._level_name(end),
                request.gpus,
            )
        per_pod = request.gpus_per_pod
        if request.pods == 1 or end == NODE_POSITION:
            # the group must fit on one node
            need = request.gpus
            best_free = max(_max_free(self._indexes[p]) for p in products)
            largest = max(self._indexes[p].max_allocatable for p in products)
            short = need - best_free  # GPUs the best node would need to free up
            pods_words = f" ({request.pods} pods × {per_pod})" if request.pods > 1 else ""
            reason = f"needs {need} GPUs{pods_words}{product_words} on one node; the best node has {best_free} free"
            if largest < need:
                reason += f" and no node has more than {largest} GPUs"
            return Unplaceable(request.key, f"{reason} (short {short})", NODE_LEVEL, short)
        level = self._level_name(end)
        best: tuple[int, int] = (0, 0)  # (usable GPUs, free GPUs) of the best domain
        for product in products:
            for domain in self._indexes[product].domains_by_position[end]:
                usable = min(domain.pod_slots(per_pod), request.pods) * per_pod
                best = max(best, (usable, domain.free))
        usable, free = best
        short = request.gpus - usable
        where = "in the cluster" if level == CLUSTER_LEVEL else f"within one {level}"
        best_words = "the cluster" if level == CLUSTER_LEVEL else f"the best {level}"
        if usable == free or free == 0:
            has = f"has {free} free"
        else:
            has = f"has {free} free but only {usable} usable in pods of {per_pod}"
        reason = (
            f"needs {request.gpus} GPUs ({request.pods} pods × {per_pod}){product_words} {where}; "
            f"{best_words} {has} (short {short})"
        )
        return Unplaceable(request.key, reason, level, short)

    # --- capacity measures ---------------------------------------------------------------------------

    def _usable_on_node(self, shape: ShapeView, index: ProductIndex, node_id: int) -> int:
        node = index.nodes[node_id]
        pods_here = node.free // shape.gpus_per_pod
        if pods_here == 0:
            return 0
        if shape.pods > 1:
            if shape.position == NODE_POSITION:
                room = pods_here
            else:
                room = node.ancestors[shape.position].pod_slots(shape.gpus_per_pod)
            if room < shape.pods:
                return 0
        return pods_here * shape.gpus_per_pod

    def stranded_gpus(self, shapes: Iterable[GroupShape]) -> int:
        """Free GPUs that no pod of any of `shapes` could use, counting a node's GPUs usable for a shape
        only when its domain at the shape's required level has room for the whole group."""
        views = [self._shape_view(shape, f"shape {shape}") for shape in shapes]
        stranded = 0
        for product, index in self._indexes.items():
            applicable = [view for view in views if view.applies_to(product)]
            for node_id, node in enumerate(index.nodes):
                usable = max((self._usable_on_node(view, index, node_id) for view in applicable), default=0)
                stranded += node.free - usable
        return stranded

    def copies_hostable(self, shape: GroupShape) -> int:
        """How many groups of `shape` the free GPUs could host at once (each product and domain apart)."""
        view = self._shape_view(shape, f"shape {shape}")
        copies = 0
        for product, index in self._indexes.items():
            if not view.applies_to(product):
                continue
            if view.position == NODE_POSITION:
                copies += sum(view.copies_in(node.free // view.gpus_per_pod) for node in index.nodes)
            else:
                copies += sum(
                    view.copies_in(domain.pod_slots(view.gpus_per_pod))
                    for domain in index.domains_by_position[view.position]
                )
        return copies

    def expected_stranded_gpus(self, shape_mix: Mapping[GroupShape, float]) -> float:
        """The free GPUs an arriving group drawn from `shape_mix` (shape -> weight) could not use, on
        average: for each shape, the free GPUs minus those its hostable copies would occupy. This is the
        fragmentation measure of Weng et al. (USENIX ATC 2023) for whole-GPU gangs."""
        total_weight = sum(shape_mix.values())
        if total_weight <= 0:
            raise ValueError("shape_mix: the weights must add up to more than 0")
        free = sum(index.root.free for index in self._indexes.values())
        expected = 0.0
        for shape, weight in shape_mix.items():
            expected += weight * (free - self.copies_hostable(shape) * shape.gpus)
        return expected / total_weight

    # --- scale-down ----------------------------------------------------------------------------------

    def choose_scale_down(self, placed: Sequence[Assignment], count: int) -> list[str]:
        """The keys of `count` groups to remove so that what is freed is most useful, and release them.

        Groups on a node that is no longer ready or schedulable go first (they are broken anyway); then
        the group whose removal empties the most whole domains, outermost first (a rack, then an NVLink
        domain, then a node), then the one that adds the most capacity for the largest shapes in use;
        among equals, the one listed last (callers list oldest first, so the newest goes)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        remaining = list(placed)
        chosen: list[str] = []
        while remaining and len(chosen) < count:
            gains = [(self._removal_gain(group), position) for position, group in enumerate(remaining)]
            _, position = max(gains)
            group = remaining.pop(position)
            self.release(group)
            chosen.append(group.group_key)
        return chosen

    def _removal_gain(self, group: Assignment) -> tuple:
        index = self._indexes.get(group.gpu_product)
        node_ids = [index.node_id_by_name.get(name) for name in group.nodes] if index is not None else [None]
        if any(node_id is None for node_id in node_ids):
            return (1,)  # on a node the planner cannot use: remove it first
        domains: dict[int, Domain] = {}
        for node_id in node_ids:
            for domain in index.nodes[node_id].ancestors[:-1]:
                domains[id(domain)] = domain
        shapes = [shape for shape in self.shapes_in_use if shape.applies_to(index.product)]
        before_capacity = [self._capacity_near(shape, index, node_ids) for shape in shapes]
        for node_id in node_ids:
            index.give(node_id, group.gpus_per_pod)
        try:
            emptied_nodes = len(
                {
                    node_id
                    for node_id in node_ids
                    if index.nodes[node_id].free == index.nodes[node_id].allocatable
                }
            )
            emptied_by_level = [0] * len(self.levels)
            for domain in domains.values():
                if domain.is_empty():
                    emptied_by_level[domain.position] += 1
            after_capacity = [self._capacity_near(shape, index, node_ids) for shape in shapes]
        finally:
            for node_id in node_ids:
                index.take(node_id, group.gpus_per_pod)
        capacity_gain = [
            after - before for before, after in zip(before_capacity, after_capacity, strict=True)
        ]
        return (0, *reversed(emptied_by_level), emptied_nodes, *capacity_gain, group.gpus)

    @staticmethod
    def _capacity_near(shape: ShapeView, index: ProductIndex, node_ids: list[int]) -> int:
        """Copies of `shape` hostable in the domains (of its level) that contain these nodes."""
        if shape.pods == 1 or shape.position == NODE_POSITION:
            return sum(
                shape.copies_in(index.nodes[node_id].free // shape.gpus_per_pod) for node_id in set(node_ids)
            )
        domains = {
            id(index.nodes[node_id].ancestors[shape.position]): index.nodes[node_id].ancestors[shape.position]
            for node_id in node_ids
        }
        return sum(shape.copies_in(domain.pod_slots(shape.gpus_per_pod)) for domain in domains.values())


# a shape that never loses capacity: stands in for shapes of another GPU product so that score tuples of
# every product's index have the same length and compare position by position
_INERT_SHAPE = ShapeView(pods=1, gpus_per_pod=1 << 30, position=NODE_POSITION, product=None)


def _max_free(index: ProductIndex) -> int:
    for free in range(index.max_allocatable, -1, -1):
        if index.nodes_by_free[free]:
            return free
    return 0


# --- the module API: one Planner per call ----------------------------------------------------------------


def plan(
    nodes: Iterable[Node],
    groups: Sequence[GroupRequest],
    levels: Sequence[TopologyLevel] = DEFAULT_LEVELS,
    *,
    shapes_in_use: Iterable[GroupShape] | Mapping[GroupShape, float] | None = None,
    largest_first: bool = True,
) -> PlacementPlan:
    """Place `groups` on `nodes`, each whole or not at all, each seeing the ones placed before it.

    Larger groups are placed first (`largest_first`), as in first-fit-decreasing bin packing: small groups
    fit in the gaps the large ones leave, the reverse is not true. `shapes_in_use` are the shapes whose
    capacity best fit protects (default: the shapes of `groups`); an operator passes every shape it runs.
    """
    keys = [group.key for group in groups]
    duplicates = sorted({key for key in keys if keys.count(key) > 1})
    if duplicates:
        raise ValueError(f"group keys must be unique; repeated: {', '.join(duplicates)}")
    shapes = shapes_in_use if shapes_in_use is not None else [group.shape for group in groups]
    planner = Planner(nodes, levels)
    for group in groups:
        planner.check(group)
    planner.set_shapes_in_use(shapes)
    order = sorted(groups, key=lambda group: -group.gpus) if largest_first else list(groups)
    placed = {group.key: planner.place(group) for group in order}
    return PlacementPlan(results={key: placed[key] for key in keys}, free_gpus_after=planner.free_gpus())


def stranded_gpus(
    nodes: Iterable[Node],
    group_shapes: Iterable[GroupShape],
    levels: Sequence[TopologyLevel] = DEFAULT_LEVELS,
) -> int:
    """Free GPUs on eligible nodes that cannot host a pod of any of `group_shapes` (see Planner)."""
    return Planner(nodes, levels).stranded_gpus(group_shapes)


def expected_stranded_gpus(
    nodes: Iterable[Node],
    shape_mix: Mapping[GroupShape, float],
    levels: Sequence[TopologyLevel] = DEFAULT_LEVELS,
) -> float:
    """Free GPUs an arriving group drawn from `shape_mix` could not use, on average (see Planner)."""
    return Planner(nodes, levels).expected_stranded_gpus(shape_mix)


def choose_scale_down(
    placed_groups: Sequence[Assignment],
    nodes: Iterable[Node],
    count: int,
    levels: Sequence[TopologyLevel] = DEFAULT_LEVELS,
    *,
    shapes_in_use: Iterable[GroupShape] | Mapping[GroupShape, float] | None = None,
) -> list[str]:
    """Keys of the `count` groups whose removal frees the most useful capacity (see Planner), in the
    order to remove them. `placed_groups` oldest first; the nodes' `gpu_used` counts their GPUs."""
    if shapes_in_use is None:
        shapes_in_use = [
            GroupShape(len(group.nodes), group.gpus_per_pod, group.gpu_product or None)
            for group in placed_groups
        ]
    return Planner(nodes, levels, shapes_in_use).choose_scale_down(placed_groups, count)
