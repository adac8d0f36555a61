"""bench/bench_rollout.py: the bursty error process, the documented Argo and Flagger examples, and the one-pass
α sweep of tokenyard's test.

Sources for the documented rows:
- Argo Rollouts docs, "Analysis & Progressive Delivery", "Background Analysis": the Rollout raises the canary
  weight by 20% every 10 minutes up to 80% (steps setWeight 20/40/60/80, pause 10m each) and starts the
  analysis at ``startingStep: 2``; the AnalysisTemplate ``success-rate`` measures every 5m with
  ``successCondition: result[0] >= 0.95`` and ``failureLimit: 3`` (the run fails when failed measurements
  exceed failureLimit).
- Flagger docs, "Deployment Strategies", "Canary Release": ``interval: 1m``, ``threshold: 10``,
  ``maxWeight: 50``, ``stepWeight: 2``: "The above analysis, if it succeeds, will run for 25 minutes", and the
  time to roll back a failing canary is "interval * threshold"; "Metrics Analysis": request-success-rate with
  ``thresholdRange.min: 99`` over ``interval: 1m``.
"""

import importlib.util
import random
import statistics
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "bench_rollout.py"
_spec = importlib.util.spec_from_file_location("bench_rollout", _PATH)
br = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = br
_spec.loader.exec_module(br)

from tokenyard.operator.analysis import (  # noqa: E402
    AnalysisDecision,
    AnalysisSettings,
    compare_proportions,
)


# ---------------------------------------------------------------------------------------------- bursts
def test_bursts_keep_their_share_length_and_the_mean_error_ratio():
    rng = random.Random(1)
    states = br.burst_states(rng, 200_000)
    assert statistics.fmean(states) == pytest.approx(br.BURST_SHARE, abs=0.01)
    runs, length = [], 0
    for bursting in states:
        if bursting:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    assert statistics.fmean(runs) == pytest.approx(br.BURST_MEAN_LOOKS, rel=0.05)
    ratios = br.modulated(0.01, states)
    assert statistics.fmean(ratios) == pytest.approx(0.01, rel=0.03)
    assert max(ratios) == pytest.approx(min(ratios) * br.BURST_FACTOR)


def _per_look_counts(population, rollouts=300):
    simulated = br.simulate(7, population, rollouts)
    canary = [c for r in simulated for c in r.canary_failures]
    stable = [c for r in simulated for c in r.stable_failures]
    return canary, stable


def test_bursty_failures_are_overdispersed_and_independent_ones_are_not():
    # Index of dispersion (variance / mean) of the failures per look: about 1 for Bernoulli draws at a small
    # ratio; with bursts 1 + Var(λ)/mean(λ) of the look's expected count λ: 1 + 0.1 x 0.9 x (4.29 - 0.86)² / 1.2
    # = 1.88 at 1% of 120 canary requests a look.
    calm, _ = _per_look_counts(br.POPULATIONS["aa"])
    bursty, _ = _per_look_counts(br.POPULATIONS["aa_bursty"])
    assert statistics.fmean(bursty) == pytest.approx(statistics.fmean(calm), rel=0.1)
    assert statistics.variance(calm) / statistics.fmean(calm) == pytest.approx(1.0, abs=0.15)
    assert statistics.variance(bursty) / statistics.fmean(bursty) == pytest.approx(1.88, abs=0.25)


def test_shared_bursts_hit_both_revisions_at_once():
    canary, stable = _per_look_counts(br.POPULATIONS["aa_bursty_shared"])
    assert statistics.correlation(canary, stable) > 0.3
    canary, stable = _per_look_counts(br.POPULATIONS["aa_bursty"])
    assert abs(statistics.correlation(canary, stable)) < 0.1


# ---------------------------------------------------------------------------------------------- documented
def _always_failing(ratio: float) -> "br.Rollout":
    failures = round(br.CANARY_PER_LOOK * ratio)
    return br.Rollout([failures] * br.LOOKS, [0] * br.LOOKS)


def test_argo_documented_example_measures_every_5_minutes_from_minute_10_to_40():
    checks = br.ARGO.documented_checks
    assert [look * br.LOOK_SECONDS / 60 for look in checks] == [10, 15, 20, 25, 30, 35, 40]
    assert br.ARGO.documented_max_error_ratio == 0.05  # successCondition: result[0] >= 0.95
    # A canary failing 6% of requests fails every measurement; with failureLimit 3 the fourth failure
    # (more than failureLimit) ends the run: at minute 25.
    rollout = _always_failing(0.06)
    failing = br.failing_looks(rollout, 0.05, br.ARGO.window_looks, checks=checks)
    failures = br.ARGO.documented_parameter + br.ARGO.failures_for_parameter
    assert br.threshold_rollback_look(failing, failures) * br.LOOK_SECONDS / 60 == 25
    # 4% errors pass the documented 95% success condition: never rolled back.
    assert br.failing_looks(_always_failing(0.04), 0.05, br.ARGO.window_looks, checks=checks) == []


def test_flagger_documented_example_rolls_back_after_interval_times_threshold_and_ends_at_25_minutes():
    checks = br.FLAGGER.documented_checks
    assert checks[-1] * br.LOOK_SECONDS / 60 == 25  # interval * (maxWeight / stepWeight)
    assert len(checks) == 25 and checks.step * br.LOOK_SECONDS == 60
    failures = br.FLAGGER.documented_parameter + br.FLAGGER.failures_for_parameter
    failing = br.failing_looks(_always_failing(0.02), 0.01, br.FLAGGER.window_looks, checks=checks)
    # Every check fails: rolled back after interval * threshold = 10 minutes.
    assert br.threshold_rollback_look(failing, failures) * br.LOOK_SECONDS / 60 == 10
    # A canary that goes bad only after the analysis promoted it is never caught by it.
    late = br.Rollout([0] * 52 + [10] * (br.LOOKS - 52), [0] * br.LOOKS)
    assert br.failing_looks(late, 0.01, br.FLAGGER.window_looks, checks=checks) == []


# ---------------------------------------------------------------------------------------------- α sweep
def _direct_rollback_look(rollout, settings):
    """tokenyard's rule run at one α, as the operator runs it."""
    for look in range(br.LOOKS):
        n = look + 1
        canary, stable = br.operator_view(rollout, n)
        verdict = compare_proportions("errors", canary, stable, settings, history=rollout.stable_history)
        if verdict.decision is AnalysisDecision.FAIL:
            return n
    return None


def test_one_pass_gives_the_rollback_look_of_every_alpha():
    settings = AnalysisSettings(alpha=0.05, min_requests=200)
    rollouts = br.simulate(3, br.POPULATIONS["1_5x"], 12) + br.simulate(4, br.POPULATIONS["aa_bursty"], 6)
    caught = 0
    for rollout in rollouts:
        found = br.tokenyard_rollback_looks(rollout, settings, br.ALPHAS)
        for alpha in br.ALPHAS:
            assert found[alpha] == _direct_rollback_look(rollout, settings.with_alpha(alpha))
        caught += found[0.01] is not None
    assert 0 < caught < len(rollouts)  # both outcomes were compared
