"""Where an autoscaler's misses fall, minute by minute: a diagnostic beside `bench/autoscaler_frontier.py`.

Runs one or two policies, each at one point of its grid, on the bench's tuning trace (seed 11). For every
minute with a missed first token, and for every minute within two minutes of a burst, it prints the groups
asked for (the most in that minute), the groups serving (the fewest), the requests that arrived and those that
missed the TTFT SLO: the requests that arrived less those whose first token came within the SLO, in that minute.
So a request served in the minute after it arrived shows as a miss in one minute and a negative one in the
next; summed over a burst the count is exact. A cut-off counts in the minute its group's drain ended. Two
policies print side by side, so that a reader can see which minutes make the difference.

Run: ``.venv/bin/python bench/autoscaler_timeline.py POLICY TARGET RESERVE [POLICY TARGET RESERVE]``, with the
policy names of `autoscaler_frontier.py` (tokenyard, tokenyard_floor, tokenyard_oracle, hpa_rps,
knative_concurrency, keda_queue). The README's account of HPA's lead at 99.9%:
``.venv/bin/python bench/autoscaler_timeline.py hpa_rps 0.6 14 tokenyard_floor 0.5 14`` (about 20 s).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import autoscaler_frontier as frontier  # noqa: E402
import bench_autoscaler as bench  # noqa: E402

NEAR_BURST_MIN = 2


@dataclass(frozen=True)
class Minute:
    minute: int
    most_active: int
    fewest_ready: int
    arrived: float
    missed: float


def by_minute(samples: Sequence[bench.TimelineSample]) -> list[Minute]:
    """The decisions' samples folded into minutes (the increments of the cumulative counts)."""
    minutes: dict[int, Minute] = {}
    requests = met = 0.0
    for sample in samples:
        arrived, newly_met = sample.requests - requests, sample.met_slo - met
        requests, met = sample.requests, sample.met_slo
        key = int(sample.t // 60)
        seen = minutes.get(key)
        busiest = max(sample.active, sample.desired)
        if seen is None:
            minutes[key] = Minute(key, busiest, sample.ready, arrived, arrived - newly_met)
        else:
            minutes[key] = Minute(
                key,
                max(seen.most_active, busiest),
                min(seen.fewest_ready, sample.ready),
                seen.arrived + arrived,
                seen.missed + arrived - newly_met,
            )
    return [minutes[key] for key in sorted(minutes)]


def worth_showing(minute: Minute, bursts: Sequence[bench.Burst]) -> bool:
    near = any(
        burst.start_s / 60 - NEAR_BURST_MIN
        <= minute.minute
        <= (burst.start_s + burst.duration_s) / 60 + NEAR_BURST_MIN
        for burst in bursts
    )
    return near or minute.missed >= 0.5


def main(argv: Sequence[str]) -> None:
    if len(argv) not in (3, 6):
        raise SystemExit(__doc__)
    points = [(argv[i], float(argv[i + 1]), int(argv[i + 2])) for i in range(0, len(argv), 3)]
    for name, _, _ in points:
        if name not in frontier.TUNED_TARGET:
            raise SystemExit(f"unknown policy {name!r}; known: {', '.join(frontier.TUNED_TARGET)}")
    trace = bench.make_trace(11, 9.0 * bench.per_group_rps())  # the bench's tuning trace
    tables = []
    for name, target, reserve in points:
        samples: list[bench.TimelineSample] = []
        result = bench.run(frontier.make_policy(name, target, reserve), trace, samples)
        print(
            f"{name} {target:g} / {reserve}: {result['slo_attainment']:.2%} at {result['gpu_hours']:.1f} GPU-hours,"
            f" {result['cut_off_requests']:.0f} cut off"
        )
        tables.append({m.minute: m for m in by_minute(samples)})
    print(
        "bursts (start minute, minutes): "
        + ", ".join(f"{b.start_s / 60:.1f} for {b.duration_s / 60:.1f}" for b in trace.bursts)
    )
    print("minute  " + "  |  ".join("asked serving arrived missed" for _ in tables))
    for key in sorted(set().union(*tables)):
        rows = [table.get(key) for table in tables]
        if not any(row is not None and worth_showing(row, trace.bursts) for row in rows):
            continue
        cells = [
            f"{row.most_active:5d} {row.fewest_ready:7d} {row.arrived:7.0f} {row.missed:6.1f}"
            if row
            else " " * 28
            for row in rows
        ]
        print(f"{key:6d}  " + "  |  ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
