"""bench/autoscaler_timeline.py: decisions folded into minutes."""

import autoscaler_timeline as timeline
import bench_autoscaler as bench


def sample(t, active, ready, desired, requests, met):
    return bench.TimelineSample(t, active, ready, desired, requests, met)


def test_decisions_fold_into_minutes_of_increments():
    samples = [
        sample(0, 2, 2, 2, 10, 10),
        sample(30, 2, 2, 4, 30, 25),  # asked for 4: the minute's most is what was asked, not yet active
        sample(60, 4, 2, 4, 50, 40),
        sample(90, 4, 3, 3, 60, 55),
    ]
    first, second = timeline.by_minute(samples)
    assert (first.minute, first.most_active, first.fewest_ready) == (0, 4, 2)
    assert (first.arrived, first.missed) == (30, 5)  # 10 + 20 arrived, 10 + 15 met
    assert (second.minute, second.most_active, second.fewest_ready) == (1, 4, 2)
    assert (second.arrived, second.missed) == (30, 0)  # 20 + 10 arrived, 15 + 15 met


def test_only_minutes_near_a_burst_or_with_a_miss_are_shown():
    burst = bench.Burst(start_s=600.0, duration_s=120.0, extra_rps=1.0)
    quiet = timeline.Minute(20, 3, 3, 100, 0.0)
    assert not timeline.worth_showing(quiet, [burst])
    assert timeline.worth_showing(timeline.Minute(20, 3, 3, 100, 2.0), [burst])
    assert timeline.worth_showing(timeline.Minute(8, 3, 3, 100, 0.0), [burst])  # two minutes before it
    assert timeline.worth_showing(timeline.Minute(14, 3, 3, 100, 0.0), [burst])  # two minutes after its end
