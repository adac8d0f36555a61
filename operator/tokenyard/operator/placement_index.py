"""Free-GPU index of the placement planner: one domain tree per GPU product.

The planner asks three kinds of question many times per group: "which nodes have at least g free GPUs",
"how many pods of g GPUs fit in this domain" and "what does this domain have free". Scanning every node for
each is what makes naive planners slow at 1,000 nodes, so this index keeps, for every domain (an NVLink
domain, a rack, a zone, the whole cluster), its free GPUs and a histogram of its nodes by free GPUs, and
for the whole cluster a bucket of node ids per free-GPU count (and, per count, how many of those nodes
run how many pods, so that best fit knows the busiest node of a bucket without visiting it). Taking or
giving back GPUs on one node updates one node and its ancestors: O(levels).

A group runs on one GPU product (tensor parallelism across different GPU models is not a thing anyone
wants), so each product gets its own tree: an H100 group never looks at A100 nodes, and a rack that holds
both kinds appears in both trees with only its own kind of node.

Domain identity is the path of label values from the outermost level inwards, so that an NVLink domain
labelled "nv-0" in rack A is not the same domain as "nv-0" in rack B. A node without the label of some
level is a domain of its own at that level (and at every level inside it): a single node is inside one
rack whatever its labels say, so that is always true, and it never glues unrelated unlabelled nodes
together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Position of the pseudo-level "one node" below the configured levels (levels are 0..k-1 innermost first,
# the whole cluster is k).
NODE_POSITION = -1


@dataclass(eq=False)
class Domain:
    """One domain of one level in one product's tree, with the free capacity of its nodes."""

    position: int  # index into the configured levels (innermost 0); the cluster root is len(levels)
    value: str | None  # the label value; None for the root and for an unlabelled node's own domain
    parent: Domain | None
    node_ids: list[int] = field(default_factory=list)
    free: int = 0
    allocatable: int = 0
    # free_histogram[f] = how many of the domain's nodes have exactly f free GPUs
    free_histogram: list[int] = field(default_factory=list)

    def pod_slots(self, gpus_per_pod: int) -> int:
        """How many pods of `gpus_per_pod` GPUs the domain's free GPUs can host (pods never span nodes)."""
        histogram = self.free_histogram
        return sum(histogram[free] * (free // gpus_per_pod) for free in range(gpus_per_pod, len(histogram)))

    def is_empty(self) -> bool:
        """True when nothing runs on any of the domain's nodes."""
        return self.free == self.allocatable


@dataclass(eq=False)
class IndexedNode:
    name: str
    allocatable: int
    free: int
    # ancestors[i] is the node's domain at configured level i; ancestors[-1] is the cluster root
    ancestors: list[Domain]
    # pods running on the node as far as the index knows: the caller's count plus pods taken minus pods
    # given back (it can go below zero when a caller releases pods it did not count; see `residents`)
    pods: int = 0

    @property
    def residents(self) -> int:
        """The pods running on the node, kept within what its used GPUs allow (each pod has >= 1 GPU)."""
        return max(0, min(self.pods, self.allocatable - self.free))


class ProductIndex:
    """The free GPUs of all eligible nodes of one GPU product, by topology domain."""

    def __init__(self, product: str, level_count: int) -> None:
        self.product = product
        self.level_count = level_count
        self.nodes: list[IndexedNode] = []
        self.node_id_by_name: dict[str, int] = {}
        self.root = Domain(position=level_count, value=None, parent=None)
        self.domains_by_position: list[list[Domain]] = [[] for _ in range(level_count)] + [[self.root]]
        self._domain_by_path: dict[tuple, Domain] = {}
        self.max_allocatable = 0
        # nodes_by_free[f] = ids of the nodes with exactly f free GPUs
        self.nodes_by_free: list[set[int]] = [set()]
        # residents_by_free[f][r] = how many nodes with f free GPUs run r pods (`IndexedNode.residents`)
        self.residents_by_free: list[list[int]] = [[0]]

    # --- building -------------------------------------------------------------------------------------

    def add_node(
        self, name: str, allocatable: int, free: int, label_values: Sequence[str | None], pods: int = 0
    ) -> None:
        """Add one eligible node; `label_values[i]` is its label at configured level i (None if unset),
        `pods` the GPU pods running on it (0 when unknown)."""
        node_id = len(self.nodes)
        ancestors: list[Domain] = [self.root] * (self.level_count + 1)
        path: tuple = ()
        parent = self.root
        for position in range(self.level_count - 1, -1, -1):  # outermost first: a path names a domain
            value = label_values[position]
            path = path + ((value,) if value is not None else (("unlabelled", name),))
            domain = self._domain_by_path.get(path)
            if domain is None:
                domain = Domain(position=position, value=value, parent=parent)
                self._domain_by_path[path] = domain
                self.domains_by_position[position].append(domain)
            ancestors[position] = domain
            parent = domain
        node = IndexedNode(name=name, allocatable=allocatable, free=free, ancestors=ancestors, pods=pods)
        self.nodes.append(node)
        self.node_id_by_name[name] = node_id
        self._grow_to(allocatable)
        self.nodes_by_free[free].add(node_id)
        self._count_residents(node, 1)
        for domain in ancestors:
            # histograms only need to reach the largest node below them (pod_slots reads what is there)
            if len(domain.free_histogram) <= allocatable:
                domain.free_histogram.extend([0] * (allocatable + 1 - len(domain.free_histogram)))
            domain.node_ids.append(node_id)
            domain.free += free
            domain.allocatable += allocatable
            domain.free_histogram[free] += 1

    def _grow_to(self, allocatable: int) -> None:
        if allocatable > self.max_allocatable:
            self.max_allocatable = allocatable
            self.nodes_by_free.extend(set() for _ in range(allocatable + 1 - len(self.nodes_by_free)))
            for counts in self.residents_by_free:
                counts.extend([0] * (allocatable + 1 - len(counts)))
            self.residents_by_free.extend(
                [0] * (allocatable + 1) for _ in range(allocatable + 1 - len(self.residents_by_free))
            )

    def _count_residents(self, node: IndexedNode, delta: int) -> None:
        self.residents_by_free[node.free][node.residents] += delta

    def max_residents(self, free: int) -> int:
        """The most pods any node with `free` free GPUs runs (0 when there is no such node)."""
        counts = self.residents_by_free[free]
        for residents in range(len(counts) - 1, 0, -1):
            if counts[residents]:
                return residents
        return 0

    # --- changing ------------------------------------------------------------------------------------

    def take(self, node_id: int, gpus: int) -> None:
        """Start one pod of `gpus` GPUs on the node (the caller has checked that they are free)."""
        self._move(node_id, -gpus, 1)

    def give(self, node_id: int, gpus: int) -> None:
        """Stop one pod of `gpus` GPUs on the node: its GPUs are free again."""
        self._move(node_id, gpus, -1)

    def _move(self, node_id: int, delta: int, pods_delta: int) -> None:
        node = self.nodes[node_id]
        before = node.free
        after = before + delta
        if after < 0 or after > node.allocatable:
            raise ValueError(
                f"node {node.name}: cannot change free GPUs from {before} by {delta} "
                f"(allocatable {node.allocatable})"
            )
        self._count_residents(node, -1)
        node.pods += pods_delta
        node.free = after
        self.nodes_by_free[before].discard(node_id)
        self.nodes_by_free[after].add(node_id)
        for domain in node.ancestors:
            domain.free += delta
            histogram = domain.free_histogram
            histogram[before] -= 1
            histogram[after] += 1
        self._count_residents(node, 1)

    # --- self-check ----------------------------------------------------------------------------------

    def verify(self) -> None:
        """Recompute every aggregate from the nodes and raise AssertionError on any difference (for
        tests: an index that drifts would double-book GPUs without any other sign)."""
        for free, bucket in enumerate(self.nodes_by_free):
            for node_id in bucket:
                assert self.nodes[node_id].free == free, f"node {self.nodes[node_id].name} in bucket {free}"
        assert sum(len(bucket) for bucket in self.nodes_by_free) == len(self.nodes), "bucket sizes"
        for free, counts in enumerate(self.residents_by_free):
            for residents, count in enumerate(counts):
                assert count == sum(
                    1 for node in self.nodes if node.free == free and node.residents == residents
                ), "residents counts"
        for domains in self.domains_by_position:
            for domain in domains:
                members = [self.nodes[node_id] for node_id in domain.node_ids]
                assert domain.free == sum(node.free for node in members), "domain free GPUs"
                assert domain.allocatable == sum(node.allocatable for node in members), "domain allocatable"
                for free, count in enumerate(domain.free_histogram):
                    assert count == sum(1 for node in members if node.free == free), "domain histogram"
