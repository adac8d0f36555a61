"""bench/autoscaler_frontier.py: the Pareto frontier of (SLO attainment, GPU-hours) and the cost of a level."""

import autoscaler_frontier as af
import pytest


def test_the_frontier_keeps_only_points_nothing_else_beats_on_both():
    points = [
        (0.990, 86.8),
        (0.9911, 88.1),  # more attainment for more cost: kept
        (0.985, 90.0),  # beaten by 0.990 at 86.8
        (0.9994, 91.4),
        (0.9993, 93.0),  # beaten by 0.9994 at 91.4
        (0.9994, 95.0),  # the same attainment, dearer
        (0.9996, 96.8),
    ]
    assert af.frontier(points) == [(0.990, 86.8), (0.9911, 88.1), (0.9994, 91.4), (0.9996, 96.8)]


def test_the_cost_of_a_level_is_linear_between_the_frontier_points_around_it():
    front = [(0.98, 80.0), (0.99, 84.0), (0.999, 93.0)]
    assert af.cost_at(front, 0.99) == pytest.approx(84.0)
    assert af.cost_at(front, 0.995) == pytest.approx(84.0 + 9.0 * 0.005 / 0.009)
    # Below every point the cheapest one serves; above every point nothing does.
    assert af.cost_at(front, 0.95) == pytest.approx(80.0)
    assert af.cost_at(front, 0.9995) is None
    assert af.cost_at([], 0.99) is None


def test_each_policy_is_probed_at_its_tuned_target_and_the_two_beside_it(monkeypatch):
    assert af.targets_near("tokenyard") == (0.7, 1.0, 1.4)
    monkeypatch.setitem(af.TUNED_TARGET, "tokenyard", 1.4)
    assert af.targets_near("tokenyard") == (1.0, 1.4)  # 1.4 is the top of tokenyard's axis
    assert af.targets_near("hpa_rps") == (0.4, 0.6, 0.9)


def test_a_drain_that_is_not_a_number_of_seconds_is_refused_naming_the_variable():
    assert af.bench._drain_timeout_s("120") == 120.0
    for raw in ("x", "-1", "nan"):
        with pytest.raises(SystemExit, match="BENCH_DRAIN_S"):
            af.bench._drain_timeout_s(raw)


def test_the_floor_probe_puts_tokenyards_minreplicas_on_the_reserve_axis_with_no_spare():
    floor = af.make_policy("tokenyard_floor", 0.5, 14)
    assert (floor.policy.config.min_groups, floor.policy.config.spare_groups) == (14, 0)
    spare = af.make_policy("tokenyard", 0.5, 14)
    assert (spare.policy.config.min_groups, spare.policy.config.spare_groups) == (af.bench.MIN_GROUPS, 14)
    assert af.targets_near("tokenyard_floor") == (0.35, 0.5, 0.7)


def test_the_rate_probe_adds_a_first_token_rate_signal_on_hpas_axis_beside_a_full_cache_token_load():
    probe = af.make_policy("tokenyard_rate", 0.6, 15)
    signals = {signal.kind.value: signal.target for signal in probe.policy.config.signals}
    assert signals["PromQL"] == pytest.approx(0.6 * af.bench.per_group_rps())
    assert signals["TokenLoad"] == pytest.approx(af.bench.KV_CAPACITY_TOKENS)
    assert (probe.policy.config.min_groups, probe.policy.config.spare_groups) == (15, 0)
    assert af.targets_near("tokenyard_rate") == (0.4, 0.6, 0.9)
