"""Placement benchmark: the tokenyard planner against first fit, kube-scheduler-style spreading and an
offline bound, on one seeded stream of replica-group arrivals and departures (no cluster, planner alone).

Cluster: 1,000 nodes × 8 GPUs (one product). 2 nodes per NVLink domain (a GB200 NVL-style pair; 500
domains), 8 NVLink domains per rack (16 nodes, 62 racks and one half rack of 8 nodes), 16 racks per zone
(4 zones). Group sizes in GPUs and their share of arrivals: 1 (30 %), 2 (25 %), 4 (20 %), 8 (15 %) as one
pod each, and 16 (10 %) as 2 pods × 8 that must share a rack and would like to share an NVLink domain.
Arrivals are Poisson, lifetimes exponential, and the offered load is LOAD × the cluster's GPUs (default
0.95, a cluster sized with 5 % headroom: it runs near full and its demand peaks reach capacity, see
"Offered load" below), so a group that does not fit is refused (and dropped: the bench does not retry it).

Strategies, all fed the same stream:
* tokenyard: `Planner.place` (best fit, protecting the capacity of the shapes in use; among equally
  harmless nodes, the one already running the most pods, then the tightest), given the shapes as the
  operator gives them: a plain list of the shapes its deployments use, no shares.
* tokenyard_told_mix (extra, an oracle, not a target): the same planner told the arrival mix's shares, the
  very mix the stranded-GPU figure is then computed on.
* first_fit: each group on the first nodes, in topology order, that can hold it under the same rules.
* first_fit_unaligned (extra, not a target): the same first fit over a node order unrelated to the
  topology, as when nodes are listed by cloud-provider names. `first_fit` above walks the nodes in
  topology order (NVLink pairs, then racks), which makes it pack like a buddy allocator: the strongest
  first fit there is, and the one the targets are measured against.
* spread: what kube-scheduler's default profile does with these pods, one pod at a time: filter nodes
  with enough free GPUs, searching from a rotating start until `max(100, N × (50 − N/125) %)` feasible
  nodes are found (kube-scheduler's adaptive percentageOfNodesToScore, pkg/scheduler/schedule_one.go),
  score them by NodeResourcesFit's default LeastAllocated ((free − request) × 100 / allocatable), pick a
  top score at random. The second pod of a 16-GPU group has a required pod affinity to the first one's
  rack and prefers its NVLink domain. Generous to the scheduler: when the second pod does not fit, the
  first one's GPUs are given back at once (a real scheduler leaves it bound and holding them).
* lower_bound: an oracle that may move every running group at every arrival. Packing the running groups
  in decreasing size into aligned blocks (all sizes are powers of two, a 16-block is one NVLink domain of
  one rack) fits whenever their total fits, so it accepts a group whenever enough GPUs are free, and what
  it leaves free is one aligned run: for a shape of G GPUs exactly F mod G of F free GPUs are unusable.
  No placement with F free GPUs can do better (usable GPUs for a shape are a multiple of G), so
  `stranded_floor` = Σ share × (F mod G) is also reported per strategy on its own trajectory.

Stranded GPUs: the free GPUs an arriving group drawn from the arrival mix could not use, on average
(`expected_stranded_gpus`, the fragmentation measure of Weng et al., USENIX ATC 2023). The strict
"usable by no shape in use" count (`stranded_gpus`) is reported too, but with 1-GPU groups in the mix it
is 0 for every strategy. Both are sampled every SAMPLE_EVERY arrivals after the warm-up.

Refusals are counted by cause: `refused_short_of_gpus` when the whole cluster had fewer free GPUs than
the group needs (no placement could have taken it), `refused_fragmented` otherwise. BENCH_DEBUG=1 prints
them per group size.

Offered load and the count of accepted groups: at LOAD >= 1 the demand exceeds the GPUs for long
stretches and some groups must be refused whatever the placement. Which ones then depends on what is free
at each arrival: a placement that keeps room for 16-GPU groups places more of them, and the GPUs they
hold then refuse several small groups each. Such a placement accepts more GPUs but fewer groups, and the
repacking oracle, which never strands a GPU, accepts the fewest groups of all at 1.0 and 1.1 (38,272 at
1.1 against first fit's 38,812 on the default seed). A count that ranks the perfect packer last measures
which sizes were admitted, not placement; the count ranks placements where refusals come from
fragmentation and demand peaks, hence the default load of 0.95 (there the oracle accepts the most
groups). `by_load` repeats the count (and the GPUs, and the stranded GPUs) for tokenyard, first fit and the
oracle at OTHER_LOADS (default 1.0 and 1.1) on the same seed, so the overload figures stay in view. Accepted GPUs
have no such bias: the oracle accepts the most at every load.

Run: `make bench-placement` (BENCH_QUICK=1 for a shorter stream). Ratios within one run are the claim.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from results_io import write_results
from tokenyard.core import labels
from tokenyard.operator.placement import (
    Assignment,
    GroupRequest,
    GroupShape,
    Node,
    Planner,
)

SEED = 20261202
NODE_COUNT = 1000
GPUS_PER_NODE = 8
NODES_PER_NVLINK = 2
NVLINK_PER_RACK = 8
RACKS_PER_ZONE = 16
PRODUCT = "H100-SXM"

SIZE_SHARES = {1: 0.30, 2: 0.25, 4: 0.20, 8: 0.15, 16: 0.10}
LOAD = float(os.environ.get("LOAD", "0.95"))
# the same comparison at other offered loads: tokenyard, first fit and the oracle (see "Offered load" above)
OTHER_LOADS = [float(load) for load in os.environ.get("OTHER_LOADS", "1.0,1.1").split(",") if load]
QUICK = os.environ.get("BENCH_QUICK") == "1"
DEBUG = os.environ.get("BENCH_DEBUG") == "1"  # print every strategy's refusals by group size and cause
ARRIVALS = 12_000 if QUICK else 40_000
WARMUP = 6_000  # arrivals before the steady state: about 3 lifetimes of the ~2,000 groups running
SAMPLE_EVERY = 30 if QUICK else 50


def shape_of(size: int) -> GroupShape:
    if size <= GPUS_PER_NODE:
        return GroupShape(1, size)
    return GroupShape(size // GPUS_PER_NODE, GPUS_PER_NODE, required_level="rack")


def request_of(key: str, size: int) -> GroupRequest:
    if size <= GPUS_PER_NODE:
        return GroupRequest(key, 1, size)
    return GroupRequest(
        key, size // GPUS_PER_NODE, GPUS_PER_NODE, required_level="rack", preferred_level="nvlink"
    )


SHAPE_MIX = {shape_of(size): share for size, share in SIZE_SHARES.items()}
# What the operator really gives its planner (operator/apply_plan.py, `create_groups`): the shapes of the groups
# of every deployment it runs, as a plain list, without their shares of the arrivals (it cannot know those).
SHIPPED_SHAPES = list(SHAPE_MIX)


# --- the cluster ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """Node i's NVLink domain, rack and zone as small integers (what the baselines index by)."""

    nvlink: list[int]
    rack: list[int]
    zone: list[int]

    @classmethod
    def build(cls) -> Topology:
        nvlink = [i // NODES_PER_NVLINK for i in range(NODE_COUNT)]
        rack = [domain // NVLINK_PER_RACK for domain in nvlink]
        return cls(nvlink, rack, [r // RACKS_PER_ZONE for r in rack])

    def node_name(self, i: int) -> str:
        return f"gpu-{i:04d}"

    def nodes(self, free: list[int]) -> list[Node]:
        return [
            Node(
                name=self.node_name(i),
                labels={
                    labels.NODE_NVLINK_DOMAIN: f"nvl-{self.nvlink[i]}",
                    labels.NODE_RACK: f"rack-{self.rack[i]}",
                    labels.NODE_ZONE: f"zone-{self.zone[i]}",
                    labels.NODE_GPU_PRODUCT: PRODUCT,
                },
                gpu_allocatable=GPUS_PER_NODE,
                gpu_used=GPUS_PER_NODE - free[i],
                gpu_product=PRODUCT,
            )
            for i in range(NODE_COUNT)
        ]


# --- the workload --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    key: str
    size: int
    time: float
    lifetime: float


def arrivals(seed: int, load: float = LOAD) -> list[Arrival]:
    rng = random.Random(seed)
    mean_gpus = sum(size * share for size, share in SIZE_SHARES.items())
    mean_lifetime = 1.0
    rate = load * NODE_COUNT * GPUS_PER_NODE / (mean_gpus * mean_lifetime)  # Little's law
    sizes, shares = list(SIZE_SHARES), list(SIZE_SHARES.values())
    now = 0.0
    stream = []
    for n in range(ARRIVALS):
        now += rng.expovariate(rate)
        stream.append(
            Arrival(f"g{n}", rng.choices(sizes, shares)[0], now, rng.expovariate(1 / mean_lifetime))
        )
    return stream


# --- strategies: place(arrival) -> node indexes per pod or None; release(arrival, nodes) --------------


class Strategy:
    name = ""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.free = [GPUS_PER_NODE] * NODE_COUNT

    def place(self, arrival: Arrival) -> list[int] | None:
        raise NotImplementedError

    def release(self, arrival: Arrival, placed: list[int]) -> None:
        per_pod = arrival.size // len(placed)
        for node in placed:
            self.free[node] += per_pod


class Tokenyard(Strategy):
    """The planner as the operator runs it (the shipped shape list), or, as a labelled extra row, told the true
    arrival mix it is then scored on (`told_the_mix`: an oracle, not what a user gets)."""

    name = "tokenyard"

    def __init__(self, topology: Topology, told_the_mix: bool = False) -> None:
        super().__init__(topology)
        if told_the_mix:
            self.name = "tokenyard_told_mix"
        shapes = SHAPE_MIX if told_the_mix else SHIPPED_SHAPES
        self.planner = Planner(topology.nodes(self.free), shapes_in_use=shapes)
        self.index_of = {topology.node_name(i): i for i in range(NODE_COUNT)}
        self.assignments: dict[str, Assignment] = {}

    def place(self, arrival: Arrival) -> list[int] | None:
        result = self.planner.place(request_of(arrival.key, arrival.size))
        if not isinstance(result, Assignment):
            return None
        self.assignments[arrival.key] = result
        placed = [self.index_of[name] for name in result.nodes]
        for node in placed:
            self.free[node] -= result.gpus_per_pod
        return placed

    def release(self, arrival: Arrival, placed: list[int]) -> None:
        self.planner.release(self.assignments.pop(arrival.key))
        super().release(arrival, placed)


class FirstFit(Strategy):
    """Each group on the first nodes, in a fixed node order, that can hold it under the same rules."""

    name = "first_fit"

    def __init__(self, topology: Topology, order: list[int] | None = None, name: str = "first_fit") -> None:
        super().__init__(topology)
        self.order = order if order is not None else list(range(NODE_COUNT))
        self.name = name

    def place(self, arrival: Arrival) -> list[int] | None:
        free = self.free
        if arrival.size <= GPUS_PER_NODE:
            for node in self.order:
                if free[node] >= arrival.size:
                    free[node] -= arrival.size
                    return [node]
            return None
        pods = arrival.size // GPUS_PER_NODE
        # the first NVLink domain that holds the whole group, else the first rack (the required level)
        for domain_of in (self.topology.nvlink, self.topology.rack):
            whole_nodes: dict[int, list[int]] = {}
            for node in self.order:
                if free[node] >= GPUS_PER_NODE:
                    chosen = whole_nodes.setdefault(domain_of[node], [])
                    chosen.append(node)
                    if len(chosen) == pods:
                        for taken in chosen:
                            free[taken] -= GPUS_PER_NODE
                        return chosen
        return None


class KubeSchedulerSpread(Strategy):
    name = "spread"

    def __init__(self, topology: Topology, seed: int) -> None:
        super().__init__(topology)
        self.rng = random.Random(seed)
        self.next_start = 0
        percentage = max(5, 50 - NODE_COUNT // 125)
        self.feasible_to_find = max(100, NODE_COUNT * percentage // 100)

    def _schedule_pod(
        self, request: int, allowed: Callable[[int], bool], affinity: Callable[[int], int]
    ) -> int | None:
        free = self.free
        best_score, best, ties = -1, None, 0
        found = 0
        processed = 0
        for step in range(NODE_COUNT):
            node = (self.next_start + step) % NODE_COUNT
            processed += 1
            if free[node] < request or not allowed(node):
                continue
            found += 1
            score = (free[node] - request) * 100 // GPUS_PER_NODE + affinity(node)
            if score > best_score:
                best_score, best, ties = score, node, 1
            elif score == best_score:
                ties += 1
                if self.rng.randrange(ties) == 0:  # a top score at random, as the scheduler does
                    best = node
            if found >= self.feasible_to_find:
                break
        self.next_start = (self.next_start + processed) % NODE_COUNT
        return best

    def place(self, arrival: Arrival) -> list[int] | None:
        pods = max(1, arrival.size // GPUS_PER_NODE)
        per_pod = arrival.size // pods
        placed: list[int] = []
        for _ in range(pods):
            if placed:
                leader = placed[0]
                rack, nvlink = self.topology.rack[leader], self.topology.nvlink[leader]
                node = self._schedule_pod(
                    per_pod,
                    lambda n, rack=rack: self.topology.rack[n] == rack,
                    # InterPodAffinity scoring (default weight 2) for the preferred NVLink domain
                    lambda n, nvlink=nvlink: 200 if self.topology.nvlink[n] == nvlink else 0,
                )
            else:
                node = self._schedule_pod(per_pod, lambda n: True, lambda n: 0)
            if node is None:
                for chosen in placed:
                    self.free[chosen] += per_pod
                return None
            self.free[node] -= per_pod
            placed.append(node)
        return placed


class RepackingOracle(Strategy):
    name = "lower_bound"

    def __init__(self, topology: Topology) -> None:
        super().__init__(topology)
        self.free_total = NODE_COUNT * GPUS_PER_NODE

    def place(self, arrival: Arrival) -> list[int] | None:
        if self.free_total < arrival.size:
            return None
        self.free_total -= arrival.size
        return [-1]  # no node: the oracle re-packs everything

    def release(self, arrival: Arrival, placed: list[int]) -> None:
        self.free_total += arrival.size


# --- running -------------------------------------------------------------------------------------------


def stranded_floor(free_total: int) -> float:
    return sum(share * (free_total % size) for size, share in SIZE_SHARES.items())


@dataclass
class Outcome:
    name: str
    accepted: int = 0
    accepted_gpus: int = 0
    accepted_by_size: dict[int, int] = field(default_factory=lambda: dict.fromkeys(SIZE_SHARES, 0))
    # refusals by (size, cause): "short" = fewer free GPUs in the whole cluster than the group needs (no
    # placement could have taken it), "fragmented" = enough free GPUs, but not where the group's rules allow
    refused: dict[tuple[int, str], int] = field(default_factory=dict)
    place_ms: list[float] = field(default_factory=list)
    place_cpu_ms: list[float] = field(default_factory=list)
    stranded: list[float] = field(default_factory=list)
    stranded_any_shape: list[int] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)

    def refusals(self, cause: str) -> int:
        return sum(count for (_, refused_cause), count in self.refused.items() if refused_cause == cause)

    def figures(self, timed: bool, measured_stranded: bool) -> dict:
        def percentile(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

        return {
            "accepted": self.accepted,
            "acceptance_rate": round(self.accepted / ARRIVALS, 4),
            "accepted_gpus": self.accepted_gpus,
            "accepted_by_size": {str(size): count for size, count in self.accepted_by_size.items()},
            "refused_short_of_gpus": self.refusals("short"),
            "refused_fragmented": self.refusals("fragmented"),
            "utilization_mean": round(statistics.fmean(self.utilization), 4),
            "stranded_gpus_mean": round(
                statistics.fmean(self.stranded if measured_stranded else self.floor), 2
            ),
            "stranded_floor_gpus_mean": round(statistics.fmean(self.floor), 2),
            "stranded_any_shape_gpus_mean": (
                round(statistics.fmean(self.stranded_any_shape), 2) if measured_stranded else None
            ),
            "place_ms_p50": round(percentile(self.place_ms, 0.50), 3) if timed else None,
            "place_ms_p99": round(percentile(self.place_ms, 0.99), 3) if timed else None,
            "place_ms_max": round(max(self.place_ms), 3) if timed else None,
            "place_cpu_ms_p99": round(percentile(self.place_cpu_ms, 0.99), 3) if timed else None,
            "place_cpu_ms_max": round(max(self.place_cpu_ms), 3) if timed else None,
        }


def run(strategy: Strategy, stream: list[Arrival], sample: bool = True) -> Outcome:
    outcome = Outcome(strategy.name)
    departures: list[tuple[float, int, Arrival, list[int]]] = []
    capacity = NODE_COUNT * GPUS_PER_NODE
    in_use = 0
    oracle = isinstance(strategy, RepackingOracle)
    for n, arrival in enumerate(stream):
        while departures and departures[0][0] <= arrival.time:
            _, _, gone, placed = heapq.heappop(departures)
            strategy.release(gone, placed)
            in_use -= gone.size
        started, started_cpu = time.perf_counter(), time.thread_time()
        placed = strategy.place(arrival)
        outcome.place_ms.append((time.perf_counter() - started) * 1000)
        outcome.place_cpu_ms.append((time.thread_time() - started_cpu) * 1000)
        if placed is not None:
            outcome.accepted += 1
            outcome.accepted_gpus += arrival.size
            outcome.accepted_by_size[arrival.size] += 1
            in_use += arrival.size
            heapq.heappush(departures, (arrival.time + arrival.lifetime, n, arrival, placed))
        else:
            cause = "short" if capacity - in_use < arrival.size else "fragmented"
            outcome.refused[(arrival.size, cause)] = outcome.refused.get((arrival.size, cause), 0) + 1
        if sample and n >= WARMUP and n % SAMPLE_EVERY == 0:
            free_total = capacity - in_use
            outcome.utilization.append(in_use / capacity)
            outcome.floor.append(stranded_floor(free_total))
            if not oracle:
                snapshot = Planner(strategy.topology.nodes(strategy.free))
                outcome.stranded.append(snapshot.expected_stranded_gpus(SHAPE_MIX))
                outcome.stranded_any_shape.append(snapshot.stranded_gpus(SHAPE_MIX))
    return outcome


def index_build_ms(topology: Topology) -> float:
    nodes = topology.nodes([GPUS_PER_NODE] * NODE_COUNT)
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        Planner(nodes, shapes_in_use=SHIPPED_SHAPES)
        timings.append((time.perf_counter() - started) * 1000)
    return min(timings)


def main() -> None:
    topology = Topology.build()
    stream = arrivals(SEED)
    print(
        f"placement bench: {NODE_COUNT} nodes × {GPUS_PER_NODE} GPUs, {NODES_PER_NVLINK} nodes/NVLink domain, "
        f"{NVLINK_PER_RACK} domains/rack; {ARRIVALS} arrivals (warm-up {WARMUP}), offered load {LOAD:.2f}, "
        f"sizes {SIZE_SHARES}",
        file=sys.stderr,
    )
    strategies: list[Strategy] = [
        Tokenyard(topology),
        Tokenyard(topology, told_the_mix=True),
        FirstFit(topology),
        FirstFit(
            topology, random.Random(SEED + 2).sample(range(NODE_COUNT), NODE_COUNT), "first_fit_unaligned"
        ),
        KubeSchedulerSpread(topology, SEED + 1),
        RepackingOracle(topology),
    ]
    results = {}
    for strategy in strategies:
        started = time.perf_counter()
        outcome = run(strategy, stream)
        oracle = isinstance(strategy, RepackingOracle)
        results[strategy.name] = outcome.figures(timed=not oracle, measured_stranded=not oracle)
        print(f"  {strategy.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        if DEBUG:
            refusals = ", ".join(
                f"{size}:{cause} {n}" for (size, cause), n in sorted(outcome.refused.items())
            )
            print(f"    refused (size:cause count): {refusals or 'none'}", file=sys.stderr)
    by_load = accepted_by_load(topology)

    header = (
        f"{'strategy':<20} {'accepted':>9} {'rate':>6} {'GPUs':>8} {'util':>6} {'16-GPU':>7} "
        f"{'stranded':>9} {'floor':>6} {'p50 ms':>7} {'p99 ms':>7} {'p99 cpu':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, figures in results.items():
        p50 = "-" if figures["place_ms_p50"] is None else f"{figures['place_ms_p50']:.3f}"
        p99 = "-" if figures["place_ms_p99"] is None else f"{figures['place_ms_p99']:.3f}"
        cpu = "-" if figures["place_cpu_ms_p99"] is None else f"{figures['place_cpu_ms_p99']:.3f}"
        print(
            f"{name:<20} {figures['accepted']:>9} {figures['acceptance_rate']:>6.3f} {figures['accepted_gpus']:>8} "
            f"{figures['utilization_mean']:>6.3f} {figures['accepted_by_size']['16']:>7} "
            f"{figures['stranded_gpus_mean']:>9.2f} {figures['stranded_floor_gpus_mean']:>6.2f} {p50:>7} {p99:>7} {cpu:>7}"
        )
    print(
        f"stranded = mean free GPUs an arriving group could not use; floor = the least any placement could "
        f"strand with the same free GPUs; p99 cpu = the placing thread's CPU time (the wall-clock p99 "
        f"includes time the process was not running); planner index build for {NODE_COUNT} nodes: "
        f"{index_build_ms(topology):.1f} ms"
    )
    tokenyard, first_fit, spread = results["tokenyard"], results["first_fit"], results["spread"]
    print(
        "targets: more accepted than first fit and spread: "
        f"{tokenyard['accepted'] > max(first_fit['accepted'], spread['accepted'])}; fewer stranded: "
        f"{tokenyard['stranded_gpus_mean'] < min(first_fit['stranded_gpus_mean'], spread['stranded_gpus_mean'])}; "
        f"p99 under 10 ms: {tokenyard['place_ms_p99'] < 10}; more GPUs accepted: "
        f"{tokenyard['accepted_gpus'] > max(first_fit['accepted_gpus'], spread['accepted_gpus'])}"
    )
    if by_load:
        names = list(next(iter(by_load.values())))
        print(f"accepted groups (GPUs) at other offered loads, same seed: {', '.join(names)}")
        for load, figures in by_load.items():
            row = "  ".join(
                f"{figures[name]['accepted']:>6} ({figures[name]['accepted_gpus']})" for name in names
            )
            print(f"  load {load}: {row}")
    final = {"bench": "placement", "load": LOAD, "results": results, "by_load": by_load}
    print(json.dumps(final))
    write_results("placement", final)


def accepted_by_load(topology: Topology) -> dict[str, dict[str, dict]]:
    """Groups and GPUs accepted, and GPUs stranded, at the OTHER_LOADS (no timing): the check that a count of
    accepted groups ranks placements the same way at every load, or the evidence that it does not; the stranded
    GPUs draw each strategy's line against the offered load (bench/report.py)."""
    by_load: dict[str, dict[str, dict]] = {}
    for load in OTHER_LOADS:
        stream = arrivals(SEED, load)
        figures = {}
        for strategy in (Tokenyard(topology), FirstFit(topology), RepackingOracle(topology)):
            outcome = run(strategy, stream)
            oracle = isinstance(strategy, RepackingOracle)
            figures[strategy.name] = {
                "accepted": outcome.accepted,
                "accepted_gpus": outcome.accepted_gpus,
                "refused_fragmented": outcome.refusals("fragmented"),
                "stranded_gpus_mean": outcome.figures(timed=False, measured_stranded=not oracle)[
                    "stranded_gpus_mean"
                ],
            }
        by_load[f"{load:g}"] = figures
        print(f"  load {load:g}: done", file=sys.stderr)
    return by_load


if __name__ == "__main__":
    main()
