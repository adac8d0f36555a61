"""The cost of each SLO attainment, per autoscaling policy: a diagnostic beside `make bench-autoscaler`.

The benchmark tunes every policy on a 7 x 5 grid and keeps the cheapest point over the 99% floor, so each tuned
row lands at its own attainment (HPA's at 99.97%, tokenyard's at 99.1%) and "fewer GPU-hours at equal
attainment" compares points the grid happened to offer. This runs each policy at its three targets nearest the
one the bench tuned and on a fine reserve axis (every whole group from ``RESERVE_LOW`` to ``RESERVE_HIGH``:
tokenyard's ``spareGroups``, the peers' floors), on the bench's tuning trace, and prints every point, the
policy's Pareto frontier (no other point both cheaper and at least as good) and the GPU-hours its frontier needs
for 99%, 99.5% and 99.9% of first tokens within the SLO (linear between frontier points). Same simulation, same
PromQL feed for tokenyard, same cluster as the bench; only the grid is finer.

Run: ``.venv/bin/python bench/autoscaler_frontier.py`` (``FRONTIER_POLICIES=tokenyard,hpa_rps`` by default; also
``tokenyard_oracle``, ``tokenyard_floor`` (tokenyard with no spare and its ``minReplicas`` on the reserve axis,
the peers' way of holding a reserve), ``tokenyard_rate`` (the same floor, the token load held at a full cache
and a first-token-rate signal whose target, a share of a group's request rate, is the target axis: HPA's signal
beside tokenyard's), ``knative_concurrency``, ``keda_queue``; ``FRONTIER_WORKERS`` processes, default 2). About
16 s a point on one core here: 33 points a policy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_autoscaler as bench  # noqa: E402

RESERVE_LOW, RESERVE_HIGH = 6, 16
LEVELS = (0.99, 0.995, 0.999)
# The target the bench tuned each policy to (run of 2026-12-06, bench/results/autoscaler-2026-12-06.txt); the
# frontier takes it and its two neighbours on the bench's target axis.
TUNED_TARGET = {
    "tokenyard": 1.0,
    "tokenyard_oracle": 1.0,
    # not a bench row: the floor probe's best target (tuning trace, 2026-12-06: 0.35 and 0.5 against 0.7 and 1.0)
    "tokenyard_floor": 0.5,
    # not a bench row either: a request-rate target, on HPA's axis and at HPA's tuned point
    "tokenyard_rate": 0.6,
    "hpa_rps": 0.6,
    "knative_concurrency": 0.6,
    "keda_queue": 0.05,
}


def frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto frontier of (attainment, GPU-hours) points: those no other point beats on both (at least as
    high an attainment for fewer GPU-hours, or more attainment for as few), by rising attainment."""
    kept: list[tuple[float, float]] = []
    for attainment, cost in sorted(points, key=lambda p: (-p[0], p[1])):
        if not kept or cost < kept[-1][1]:
            kept.append((attainment, cost))
    return kept[::-1]


def cost_at(front: Sequence[tuple[float, float]], level: float) -> float | None:
    """GPU-hours the frontier needs to reach ``level``: linear between its two points around it, the cheapest
    point's cost below them all, None above them all."""
    for (a0, c0), (a1, c1) in zip(front, front[1:], strict=False):
        if a0 <= level <= a1:
            return c0 if a1 == a0 else c0 + (c1 - c0) * (level - a0) / (a1 - a0)
    if front and level <= front[0][0]:
        return front[0][1]
    if front and level == front[-1][0]:
        return front[-1][1]
    return None


def targets_near(policy: str) -> tuple[float, ...]:
    if policy == "tokenyard_rate":
        axis = bench.TARGETS["hpa_rps"]
    else:
        axis = bench.TARGETS["tokenyard" if policy.startswith("tokenyard") else policy]
    i = axis.index(TUNED_TARGET[policy])
    return axis[max(0, i - 1) : i + 2]


def make_policy(policy: str, target: float, reserve: int) -> bench.Autoscaler:
    reserve = max(bench.MIN_GROUPS, reserve)
    if policy == "tokenyard_floor":
        knob = f"token load target={target:g} x KV, minReplicas {reserve}"
        return bench.TokenyardPolicy(bench.tokenyard_spec(target, 0, min_groups=reserve), knob)
    if policy == "tokenyard_rate":
        knob = f"token load target=1 x KV, first tokens/s target={target:g} x a group's rate, minReplicas {reserve}"
        spec = bench.tokenyard_spec(1.0, 0, min_groups=reserve, request_rate_fraction=target)
        return bench.TokenyardPolicy(spec, knob)
    grid = bench.candidates()["tokenyard" if policy.startswith("tokenyard") else policy]
    options = {"feed": "oracle"} if policy == "tokenyard_oracle" else {}
    return grid.make(target, reserve, **options)


def run_point(policy: str, target: float, reserve: int) -> tuple[str, float, int, dict]:
    trace = bench.make_trace(11, 9.0 * bench.per_group_rps())  # the bench's tuning trace
    return policy, target, reserve, bench.run(make_policy(policy, target, reserve), trace)


def main() -> None:
    policies = os.environ.get("FRONTIER_POLICIES", "tokenyard,hpa_rps").split(",")
    for policy in policies:
        if policy not in TUNED_TARGET:
            raise SystemExit(
                f"FRONTIER_POLICIES: unknown policy {policy!r}; known: {', '.join(TUNED_TARGET)}"
            )
    jobs = [
        (policy, target, reserve)
        for policy in policies
        for target in targets_near(policy)
        for reserve in range(RESERVE_LOW, RESERVE_HIGH + 1)
    ]
    with ProcessPoolExecutor(int(os.environ.get("FRONTIER_WORKERS", "2"))) as pool:
        results = list(pool.map(run_point, *zip(*jobs, strict=True)))
    for policy in policies:
        mine = [(t, r, res) for p, t, r, res in results if p == policy]
        print(f"{policy} on the tuning trace (seed 11): target, reserve -> SLO met, GPU-hours, cut-offs")
        for target, reserve, res in mine:
            print(
                f"  {target:<6g} {reserve:>3}  {res['slo_attainment']:8.2%} {res['gpu_hours']:6.1f}"
                f"  {res['cut_off_requests']:6.1f}"
            )
        front = frontier([(res["slo_attainment"], res["gpu_hours"]) for _, _, res in mine])
        print("  frontier: " + ", ".join(f"{a:.2%} at {c:.1f}" for a, c in front))
        for level in LEVELS:
            cost = cost_at(front, level)
            shown = "not reached" if cost is None else f"{cost:.1f} GPU-hours"
            print(f"  to reach {level:.1%}: {shown}")


if __name__ == "__main__":
    main()
