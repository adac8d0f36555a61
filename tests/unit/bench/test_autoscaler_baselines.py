"""bench/bench_autoscaler.py: the HPA/KEDA and Knative KPA emulations against the systems' documentation.

Each test drives ``HpaPolicy`` or ``KnativePolicy`` through ``observe()`` / ``decide()`` with chosen metric
values and times and checks the replica count the documented algorithm gives. The comment above each test
names the page section or source file it was worked from. Six departures these tests found (a stabilised
scale-down that could raise the count past the scale-up limit, the window's edges, the scale-up limit's start
count, unready pods in a Pods metric, the KPA's panic exit and floor) were corrected in the emulation.

Sources (read at the time of writing):
- Kubernetes docs, "Horizontal Pod Autoscaling"
  (https://kubernetes.io/docs/concepts/workloads/autoscaling/horizontal-pod-autoscale/): sections "How does a
  HorizontalPodAutoscaler work?", "Algorithm details", "Stabilization window", "Scaling policies",
  "Default Behavior".
- kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator.go (GetExternalPerPodMetricReplicas,
  calcPlainMetricReplicas) and horizontal.go (stabilizeRecommendationWithBehaviors,
  convertDesiredReplicasWithBehaviorRate, calculateScaleUpLimitWithScalingRules, getReplicasChangePerPeriod).
- KEDA docs, "ScaledObject specification" (https://keda.sh/docs/2.17/reference/scaledobject-spec/), section
  "triggers": metricType defaults to AverageValue; the scaler pages (e.g. https://keda.sh/docs/2.8/scalers/cpu/)
  define AverageValue as the target for the metric's average across the relevant pods.
- Knative docs, "Additional autoscaling configuration for Knative Pod Autoscaler"
  (https://knative.dev/docs/serving/autoscaling/kpa-specific/): sections "Modes", "Stable window",
  "Panic window", "Panic mode threshold", "Max scale up rate", "Max scale down rate".
- knative/serving pkg/autoscaler/scaling/autoscaler.go (Scale), pkg/autoscaler/config/config.go (defaults:
  stable window 60 s, panic window 10 %, panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2,
  tick interval 2 s) and pkg/autoscaler/metrics/collector.go (scrape tick 1 s).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "bench_autoscaler.py"
_spec = importlib.util.spec_from_file_location("bench_autoscaler", _PATH)
ba = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ba  # its dataclasses (postponed annotations) look the module up by name
_spec.loader.exec_module(ba)


# ---------------------------------------------------------------------------------------------- helpers
def _hpa(target: float, per_ready_group: bool = False):
    return ba.HpaPolicy("hpa_test", "m", target, per_ready_group=per_ready_group)


def _hpa_step(policy, now: float, value: float, current: int, ready: int | None = None) -> int:
    """One HPA sync: the metric as read at `now`, then the decision."""
    ready = current if ready is None else ready
    policy.observe(now, {"m": value})
    return policy.decide(now, current, ready, current - ready)


def _feed(policy, start: int, stop: int, value: float) -> None:
    """Knative's scraper: one concurrency sample a second for t in [start, stop)."""
    for t in range(start, stop):
        policy.observe(float(t), {"concurrency": float(value)})


def _kpa(policy, now: float, ready: int, current: int | None = None) -> int:
    current = ready if current is None else current
    return policy.decide(float(now), current, ready, current - ready)


# ---------------------------------------------------------------------------------------------- cadence
# K8s HPA docs, "How does a HorizontalPodAutoscaler work?": the controller runs every 15 s by default
# (--horizontal-pod-autoscaler-sync-period). knative/serving pkg/autoscaler/config/config.go: TickInterval
# defaults to 2 s; pkg/autoscaler/metrics/collector.go: pods are scraped every second.
def test_decision_and_sampling_cadence_are_the_documented_defaults():
    assert _hpa(1.0).decide_every_s == 15.0
    assert ba.KnativePolicy(10).decide_every_s == 2.0
    assert ba.KnativePolicy(10).sample_every_s == 1.0


# ---------------------------------------------------------------------------------------------- HPA / KEDA
# KEDA ScaledObject spec, "triggers": metricType defaults to AverageValue, i.e. the HPA receives an External
# metric with an AverageValue target. replica_calculator.go GetExternalPerPodMetricReplicas: usage ratio =
# total / (target x status replicas); outside the tolerance the proposal is ceil(total / target).
# K8s HPA docs, "Algorithm details": desiredReplicas = ceil[currentReplicas * (currentMetricValue /
# desiredMetricValue)], which for an average target is the same ceil(total / target).
def test_external_average_value_proposes_ceil_of_total_over_target():
    # 4 replicas, target 10 per replica, 70 in total: ratio 70 / 40 = 1.75 -> ceil(70 / 10) = 7 (within the
    # default scale-up limit of 4 + max(4, 100% of 4) = 8).
    assert _hpa_step(_hpa(10.0), 0.0, 70.0, current=4) == 7
    # 4 replicas, 97 in total: ceil(9.7) = 10, but the scale-up policies allow at most 8 this period.
    assert _hpa_step(_hpa(10.0), 0.0, 97.0, current=4) == 8


# replica_calculator.go GetExternalPerPodMetricReplicas compares the total with target x *status* replicas
# (every pod of the target, ready or not), not with the ready ones.
def test_external_average_value_ratio_counts_replicas_not_yet_ready():
    # 4 replicas of which 2 are ready, 42 in total: 42 / (10 x 4) = 1.05 is inside the tolerance, so no change
    # (dividing by the 2 ready replicas would give 2.1 and a scale-up to 5).
    assert _hpa_step(_hpa(10.0), 0.0, 42.0, current=4, ready=2) == 4


# K8s HPA docs, "Algorithm details": no scaling while the ratio is within the tolerance, 0.1 by default
# (--horizontal-pod-autoscaler-tolerance); replica_calculator.go: |1 - ratio| <= tolerance keeps the count.
@pytest.mark.parametrize(
    ("total", "expected"),
    [
        (43.0, 4),  # ratio 1.075: inside the dead band
        (37.0, 4),  # ratio 0.925: inside the dead band
        (45.0, 5),  # ratio 1.125: outside, ceil(4.5) = 5
    ],
)
def test_tolerance_dead_band_of_ten_percent(total, expected):
    assert _hpa_step(_hpa(10.0), 0.0, total, current=4) == expected


# K8s HPA docs, "Default Behavior": scale-up with no stabilization and the policies "4 pods per 15 s" and
# "100 % per 15 s" with selectPolicy Max (the larger change wins); horizontal.go
# calculateScaleUpLimitWithScalingRules. Clamped to maxReplicas.
def test_default_scale_up_is_the_larger_of_four_pods_or_double_per_period():
    assert _hpa_step(_hpa(1.0), 0.0, 100.0, current=2) == 6  # +4 beats x2
    assert _hpa_step(_hpa(1.0), 0.0, 100.0, current=10) == 20  # x2 beats +4
    # Closed loop at the 15 s sync period: 1 -> 5 -> 10 -> 20 -> maxReplicas (24).
    policy, current, seen = _hpa(1.0), 1, []
    for step in range(4):
        current = _hpa_step(policy, 15.0 * step, 100.0, current=current)
        seen.append(current)
    assert seen == [5, 10, 20, ba.MAX_GROUPS]


def _hpa_steady_then_drop(policy) -> None:
    """Ten replicas held at the target (100 % of 10) from t=0 to t=285, one sync every 15 s."""
    for t in range(0, 300, 15):
        assert _hpa_step(policy, float(t), 10.0, current=10) == 10


# K8s HPA docs, "Stabilization window" and "Default Behavior": for scale-down the highest recommendation of
# the last 300 s is used; the default scale-down policy removes up to 100 % per 15 s (to minReplicas).
def test_scale_down_waits_for_the_300_s_stabilization_window_then_drops_at_once():
    policy = _hpa(1.0)
    _hpa_steady_then_drop(policy)  # last recommendation of 10 at t=285
    # From t=300 the metric asks for 2. While the t=285 recommendation is less than 300 s old, it holds.
    for t in range(300, 585, 15):
        assert _hpa_step(policy, float(t), 2.0, current=10) == 10, t
    _hpa_step(policy, 585.0, 2.0, current=10)  # the boundary case: see the next test
    # By t=600 every recommendation of 10 is more than 300 s old: straight down to 2 (100 % per 15 s).
    assert _hpa_step(policy, 600.0, 2.0, current=10) == 2


# horizontal.go stabilizeRecommendationWithBehaviors keeps a recommendation only if its timestamp is After(now
# - 300 s): one exactly 300 s old no longer counts.
def test_scale_down_recommendation_exactly_300_s_old_no_longer_holds():
    policy = _hpa(1.0)
    _hpa_steady_then_drop(policy)
    for t in range(300, 585, 15):
        _hpa_step(policy, float(t), 2.0, current=10)
    assert _hpa_step(policy, 585.0, 2.0, current=10) == 2  # the t=285 recommendation is exactly 300 s old


# horizontal.go stabilizeRecommendationWithBehaviors: the stabilized count is the current count bounded above
# by the highest recommendation in the scale-down window (and below by the lowest in the scale-up window), so
# stabilization can hold a scale-down back but never raise the count; scale-up stays subject to the rate
# policies (convertDesiredReplicasWithBehaviorRate). K8s HPA docs, "Stabilization window".
def test_scale_down_stabilization_never_scales_up_past_the_rate_limit():
    policy = _hpa(1.0)
    assert _hpa_step(policy, 0.0, 20.0, current=2) == 6  # 20 recommended, +4 allowed
    assert _hpa_step(policy, 15.0, 1.0, current=6) == 6  # metric now asks for 1: hold at 6, never go up


# horizontal.go calculateScaleUpLimitWithScalingRules / getReplicasChangePerPeriod: the limit is computed from
# the replica count at the start of the period (current - added + removed in the last periodSeconds), i.e.
# max(start + 4, 2 x start). K8s HPA docs, "Scaling policies" (the policy holds over periodSeconds).
def test_scale_up_limit_counts_from_the_replicas_at_the_period_start():
    policy = _hpa(1.0)
    assert _hpa_step(policy, 0.0, 23.0, current=8) == 16  # x2 in this period
    assert _hpa_step(policy, 5.0, 23.0, current=16) == 16  # same period: already doubled from 8


# K8s HPA docs, "Algorithm details": for a per-pod average (Pods metric) the ratio is the pods' average over
# the target and desired = ceil(ratio x ready pods); replica_calculator.go calcPlainMetricReplicas.
def test_pods_metric_average_over_ready_pods():
    # 4 ready pods, 60 in total: average 15 against 10 -> ceil(1.5 x 4) = 6.
    assert _hpa_step(_hpa(10.0, per_ready_group=True), 0.0, 60.0, current=4) == 6
    assert _hpa_step(_hpa(10.0, per_ready_group=True), 0.0, 43.0, current=4) == 4  # 1.075: tolerance


# K8s HPA docs, "Algorithm details": if pods are not yet ready (or miss metrics) and the workload would scale
# up, they are counted as consuming 0 % of the target and the ratio is recomputed; if that reverses the
# direction or falls within the tolerance, nothing is scaled. replica_calculator.go calcPlainMetricReplicas.
def test_pods_metric_counts_unready_pods_as_zero_before_scaling_up():
    assert _hpa_step(_hpa(10.0, per_ready_group=True), 0.0, 30.0, current=4, ready=2) == 4


# ---------------------------------------------------------------------------------------------- Knative KPA
# Knative docs, kpa-specific "Stable window" (default 60 s) and autoscaler.go: desired = ceil(observed
# average concurrency / target per pod), averaged over the stable window.
def test_stable_mode_averages_the_last_60_s():
    policy = ba.KnativePolicy(10)
    _feed(policy, 0, 60, 100.0)
    _feed(policy, 60, 119, 20.0)
    # At t=118 the window holds t=59..118: one sample of 100 and 59 of 20 -> 21.33 -> ceil(2.13) = 3.
    assert _kpa(policy, 118, ready=2) == 3
    _feed(policy, 119, 120, 20.0)
    # At t=119 the window is t=60..119, all 20 -> 2.
    assert _kpa(policy, 119, ready=2) == 2


# Knative docs, kpa-specific "Panic window" (10 % of the stable window: 6 s) and "Panic mode threshold"
# (200 %: panic when the panic-window pod count is at least twice the ready pods); autoscaler.go: in panic
# the desired count is the larger of the stable and panic counts.
def test_panic_mode_uses_the_last_6_s():
    policy = ba.KnativePolicy(10)
    _feed(policy, 0, 54, 10.0)
    _feed(policy, 54, 55, 40.0)
    _feed(policy, 55, 60, 100.0)
    # Panic window t=54..59: (40 + 5 x 100) / 6 = 90 -> 9 pods, 9 / 2 ready >= 2 -> panic; stable average 18 -> 2.
    # (A 5 s window would give 10, a 7 s one 8.)
    assert _kpa(policy, 59, ready=2) == 9


# Knative docs, kpa-specific "Panic mode threshold": default 200 %; autoscaler.go: panic when
# ceil(panic average / target) / ready >= threshold / 100.
@pytest.mark.parametrize(("burst", "expected"), [(100.0, 10), (90.0, 2)])
def test_panic_threshold_is_twice_the_ready_pods(burst, expected):
    policy = ba.KnativePolicy(10)
    _feed(policy, 0, 54, 0.0)
    _feed(policy, 54, 60, burst)
    # 5 ready. burst 100: panic count 10 = 2 x 5 -> panic, 10 pods. burst 90: 9 < 10, stable mode: average
    # 9 -> 1 pod, floored by the scale-down rate at floor(5 / 2) = 2.
    assert _kpa(policy, 59, ready=5) == expected


# Knative docs, kpa-specific "Max scale down rate" (default 2.0); autoscaler.go: the desired count is at least
# floor(ready / max-scale-down-rate).
def test_scale_down_at_most_halves_the_ready_pods():
    policy = ba.KnativePolicy(10)
    _feed(policy, 0, 60, 0.0)
    assert _kpa(policy, 59, ready=10) == 5
    assert _kpa(policy, 59, ready=5) == 2


# Knative docs, kpa-specific "Max scale up rate" (default 1000.0); autoscaler.go: the desired count is at
# most ceil(rate x ready), with ready taken as 1 when no pod is ready.
@pytest.mark.parametrize("ready", [0, 1])
def test_scale_up_at_most_a_thousand_times_the_ready_pods(monkeypatch, ready):
    monkeypatch.setattr(ba, "MAX_GROUPS", 10**6)  # lift the bench's own bound so the rate limit shows
    policy = ba.KnativePolicy(1)
    _feed(policy, 0, 60, 5000.0)
    assert _kpa(policy, 59, ready=ready, current=max(ready, 1)) == 1000


def _kpa_burst_then_quiet(policy, until: int) -> dict[int, int]:
    """Two ready pods, target 10: a 6 s burst of 100 at t=54..59, zero otherwise; a decision every 2 s."""
    decided = {}
    for t in range(until + 1):
        policy.observe(float(t), {"concurrency": 100.0 if 54 <= t < 60 else 0.0})
        if t % 2 == 0:
            decided[t] = _kpa(policy, t, ready=2)
    return decided


# Knative docs, kpa-specific "Modes": in panic mode the revision does not scale down, and the autoscaler
# leaves panic once the stable window has passed with no reason to panic; autoscaler.go: the panic time is
# renewed at each decision over the threshold, and panic ends when it is more than a stable window old.
def test_no_scale_down_in_panic_until_a_stable_window_without_the_threshold():
    decided = _kpa_burst_then_quiet(ba.KnativePolicy(10), until=124)
    # Panic from t=56; the peak panic count is 9 at t=58 (panic window 53..58: 5 x 100 / 6 -> 9). The last
    # decision over the threshold is t=62 (window 57..62: 3 x 100 / 6 = 50 -> 5 >= 2 x 2).
    assert all(decided[t] == 9 for t in range(58, 121, 2)), decided
    # Out of panic by t=124 (62 s after the last over-threshold decision): stable average 0 -> 1 pod
    # (floor(2 / 2) = 1 by the scale-down rate, and the bench's minimum of 1).
    assert decided[124] == 1


# autoscaler.go: panic ends only when panicTime + stable window is *before* now, i.e. strictly more than 60 s
# after the last decision over the threshold.
def test_panic_still_holds_exactly_one_stable_window_after_the_last_threshold_crossing():
    decided = _kpa_burst_then_quiet(ba.KnativePolicy(10), until=122)
    assert decided[122] == 9


# autoscaler.go: in panic the floor is the highest count decided during this panic (maxPanicPods), not the
# replicas that already exist; the desired count can be lower than a deployment's replicas that are not
# ready yet.
def test_panic_floor_is_the_panic_peak_not_the_current_replicas():
    policy = ba.KnativePolicy(10)
    _feed(policy, 0, 54, 0.0)
    _feed(policy, 54, 60, 40.0)
    # Panic window 40 -> 4 pods = 2 x 2 ready -> panic; stable average 4 -> 1. Ten replicas exist, two ready.
    assert _kpa(policy, 59, ready=2, current=10) == 4


# ---------------------------------------------------------------------------------------------- floors
# The second knob each peer is tuned over (the bench's burst reserve for them): a floor of groups.
# K8s HPA: spec.minReplicas; horizontal.go reconcileAutoscaler sets desired = minReplicas when the current count
# is below it ("Current number of replicas below Spec.MinReplicas"), before reading any metric and without the
# scale-up policies; convertDesiredReplicasWithBehaviorRate bounds every other recommendation below by it.
# KEDA ScaledObject spec, "minReplicaCount": the minimum KEDA scales the target down to (it becomes the HPA's
# minReplicas). Knative docs, "Configuring scale bounds" (https://knative.dev/docs/serving/autoscaling/scale-bounds/),
# "min-scale": the minimum number of replicas of a revision; kpa/scaler.go applyBounds bounds the decider's count.
def test_hpa_below_its_floor_goes_straight_to_it_without_the_scale_up_limit_or_a_metric():
    policy = ba.HpaPolicy("hpa_test", "m", 1.0, per_ready_group=False, min_replicas=12)
    assert policy.decide(0.0, 2, 2, 0) == 12  # +4 or x2 would allow 6; no metric read yet
    assert "minReplicas 12" in policy.knob


def test_hpa_scale_down_stops_at_its_floor():
    policy = ba.HpaPolicy("hpa_test", "m", 1.0, per_ready_group=False, min_replicas=8)
    for t in range(0, 300, 15):
        assert _hpa_step(policy, float(t), 20.0, current=20) == 20
    for t in range(300, 585, 15):  # the metric asks for 2; the window holds 20 meanwhile
        assert _hpa_step(policy, float(t), 2.0, current=20) == 20, t
    # Past the window (the t=285 recommendation is 300 s old at t=585): down at once (100 % per 15 s), to the
    # floor of 8, not to the metric's 2.
    assert _hpa_step(policy, 585.0, 2.0, current=20) == 8
    assert _hpa_step(policy, 600.0, 0.0, current=8) == 8


def test_hpa_floor_leaves_a_scale_up_above_it_unchanged():
    floored = ba.HpaPolicy("hpa_test", "m", 10.0, per_ready_group=False, min_replicas=4)
    assert _hpa_step(floored, 0.0, 70.0, current=4) == _hpa_step(_hpa(10.0), 0.0, 70.0, current=4) == 7


@pytest.mark.parametrize("floor", [0, ba.MAX_GROUPS + 1])
def test_a_floor_outside_the_bench_bounds_is_refused(floor):
    with pytest.raises(ValueError, match="min_replicas"):
        ba.HpaPolicy("hpa_test", "m", 1.0, per_ready_group=False, min_replicas=floor)
    with pytest.raises(ValueError, match="min_scale"):
        ba.KnativePolicy(10, min_scale=floor)


def test_knative_min_scale_bounds_the_scale_down_rate_and_an_idle_revision():
    policy = ba.KnativePolicy(10, min_scale=6)
    _feed(policy, 0, 60, 0.0)
    assert _kpa(policy, 59, ready=10) == 6  # the scale-down rate alone gives 5
    assert _kpa(policy, 59, ready=6) == 6  # it would give 3
    assert ba.KnativePolicy(10, min_scale=6).decide(0.0, 2, 2, 0) == 6  # no sample yet
    assert "min-scale 6" in policy.knob


def test_knative_min_scale_leaves_panic_above_it_unchanged():
    decided = _kpa_burst_then_quiet(ba.KnativePolicy(10, min_scale=3), until=124)
    assert all(decided[t] == 9 for t in range(58, 121, 2)), decided  # the panic peak, as without a floor
    assert decided[124] == 3  # out of panic: the floor, where min-scale 1 gives 1


# ---------------------------------------------------------------------------------------------- the grids
# Every policy gets the same tuning effort: the same number of points on its target axis and the same reserve
# axis, in groups (tokenyard's spareGroups from 0; the peers' floors from the bench's minimum).
def test_every_policy_is_tuned_over_the_same_two_dimensional_grid():
    grids = ba.candidates()
    assert set(grids) == {"tokenyard", "hpa_rps", "keda_queue", "knative_concurrency"}
    sizes = {(len(g.targets), len(g.reserves)) for g in grids.values()}
    assert len(sizes) == 1
    assert grids["tokenyard"].reserves == ba.RESERVES
    for name in ("hpa_rps", "keda_queue", "knative_concurrency"):
        assert grids[name].reserves == tuple(max(ba.MIN_GROUPS, r) for r in ba.RESERVES)
    assert len(set(ba.RESERVES)) == len(ba.RESERVES) > 1


def test_grid_points_build_each_policy_with_both_knobs():
    grids = ba.candidates()
    i, j = len(grids["tokenyard"].targets) - 1, len(ba.RESERVES) - 1
    ours = grids["tokenyard"].maker(i, j)()
    assert ours.policy.config.spare_groups == ba.RESERVES[j]
    assert ours.reads_prometheus and not grids["tokenyard"].maker(i, j)(feed="oracle").reads_prometheus
    assert grids["hpa_rps"].maker(0, j)().min_replicas == max(ba.MIN_GROUPS, ba.RESERVES[j])
    keda = grids["keda_queue"].maker(0, j)()
    assert keda.metric == "waiting" and f"minReplicaCount {keda.min_replicas}" in keda.knob
    assert grids["knative_concurrency"].maker(0, j)().min_scale == max(ba.MIN_GROUPS, ba.RESERVES[j])


def _tried(at, attainment, gpu_hours):
    return ba.Tried({"slo_attainment": attainment, "gpu_hours": gpu_hours}, f"point {at}", None, at)


def test_tuning_keeps_the_cheapest_point_over_the_floor_and_names_the_edges_it_sits_on():
    grid = ba.Grid("t", "r", (0.1, 0.2, 0.3), (0, 5, 10), lambda t, r: None)
    tried = [_tried((1, 1), 0.995, 100.0), _tried((2, 2), 0.991, 90.0), _tried((0, 0), 0.98, 50.0)]
    assert ba.tune(tried).at == (2, 2)  # 0.98 misses the 99% floor however cheap
    assert ba.edges(grid, ba.tune(tried)) == ["t 0.3", "r 10"]
    assert ba.edges(grid, tried[0]) == []
    assert ba.edges(grid, _tried((1, 0), 0.99, 1.0)) == []  # no reserve is the knob's bound, not an edge
    # None meets the floor: the highest attainment.
    assert ba.tune([_tried((0, 0), 0.9, 10.0), _tried((1, 0), 0.95, 20.0)]).at == (1, 0)


# ---------------------------------------------------------------------------------------------- the warm-up
# The fleet starts at 2 groups for a load that needs more: what happens before WARMUP_S is counted apart, requests
# by when they arrived (one that waited through the warm-up and was served after it is still the warm-up's).
def test_the_warm_up_is_counted_apart_by_arrival():
    import random

    fleet = ba.Fleet(initial_groups=1, scored_from=10.0)
    rng = random.Random(1)
    rates = {ba.RAG: 50.0}  # far more than one group admits: a queue builds during the warm-up
    for t in range(10):
        fleet.tick(float(t), rates, rng)
    assert fleet.stats.requests == 0 and fleet.stats.gpu_seconds == 0
    warm_requests, warm_met = fleet.warmup_stats.requests, fleet.warmup_stats.met_slo
    assert warm_requests > 0 and warm_met < warm_requests
    for t in range(10, 20):
        fleet.tick(float(t), {ba.RAG: 0.0}, rng)  # nothing new arrives: only the warm-up's queue is served
    assert fleet.stats.requests == 0 and fleet.stats.met_slo == 0
    assert fleet.warmup_stats.requests == warm_requests
    assert fleet.stats.gpu_seconds == 10 * ba.GPUS_PER_GROUP * ba.DT  # GPU time counts from the warm-up's end


@pytest.mark.parametrize("seed", [11, 29, 35, 41, 3, 7])
def test_no_burst_starts_inside_the_warm_up(seed):
    assert 0 < ba.WARMUP_S < min(burst.start_s for burst in ba.make_trace(seed, 10.0).bursts)
