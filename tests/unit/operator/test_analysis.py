"""The rollout analysis core: verdicts, the statistics' invariants, and false-alarm rates by simulation."""

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.operator.analysis import (
    AnalysisDecision,
    AnalysisSettings,
    Margin,
    MeanSample,
    MetricInput,
    PairedCounts,
    ProportionCounts,
    _proportion_alternatives,
    _upper_bound_factor,
    binomial_mixture_log_lr,
    compare_means,
    compare_paired,
    compare_proportions,
    dispersion_factors,
    evaluate,
    gaussian_alternatives_log_lr,
    overdispersion,
    relative_volatility,
)

ALPHA = 0.05
SETTINGS = AnalysisSettings(alpha=ALPHA, min_requests=200)


def binomial(rng: random.Random, n: int, p: float) -> int:
    """Failures among n Bernoulli(p) requests, by skipping geometric gaps between failures (exact)."""
    log_q = math.log1p(-p)
    count, position = 0, 0
    while True:
        position += int(math.log(1.0 - rng.random()) / log_q) + 1
        if position > n:
            return count
        count += 1


# --- verdicts --------------------------------------------------------------------------------------------


def test_clearly_worse_canary_fails_with_a_readable_reason():
    verdict = compare_proportions("errors", ProportionCounts(1000, 41), ProportionCounts(9000, 90), SETTINGS)
    assert verdict.decision is AnalysisDecision.FAIL
    assert verdict.statistic >= verdict.threshold == pytest.approx(math.log(20))
    assert "4.10%" in verdict.reason and "1.00%" in verdict.reason and "log(1/α)=3.00" in verdict.reason


def test_equal_canary_is_pending_while_the_window_runs_and_passes_when_it_ends():
    canary, stable = ProportionCounts(1000, 10), ProportionCounts(9000, 90)
    assert compare_proportions("errors", canary, stable, SETTINGS).decision is AnalysisDecision.PENDING
    final = compare_proportions("errors", canary, stable, SETTINGS, final=True)
    assert final.decision is AnalysisDecision.PASS
    assert final.statistic < final.threshold


def test_canary_well_within_a_relative_margin_passes_early():
    settings = AnalysisSettings(alpha=ALPHA, margin=Margin(relative=1.5), min_requests=200)
    verdict = compare_proportions(
        "errors", ProportionCounts(20000, 200), ProportionCounts(80000, 800), settings
    )
    assert verdict.decision is AnalysisDecision.PASS
    assert "within the margin" in verdict.reason


def test_absolute_margin_tolerates_a_small_degradation():
    canary, stable = ProportionCounts(20000, 400), ProportionCounts(80000, 800)  # 2.0% vs 1.0%
    assert compare_proportions("errors", canary, stable, SETTINGS).decision is AnalysisDecision.FAIL
    tolerant = AnalysisSettings(alpha=ALPHA, margin=Margin(absolute=0.02), min_requests=200)
    assert compare_proportions("errors", canary, stable, tolerant).decision is not AnalysisDecision.FAIL


@pytest.mark.parametrize(
    "canary, stable",
    [
        (ProportionCounts(None, None), ProportionCounts(1000, 10)),
        (ProportionCounts(1000, float("nan")), ProportionCounts(1000, 10)),
        (ProportionCounts(1000, 10), ProportionCounts(float("inf"), 10)),
        (ProportionCounts(1000, -1), ProportionCounts(1000, 10)),
        (ProportionCounts(1000, 1001), ProportionCounts(1000, 10)),  # more failures than requests
    ],
)
def test_missing_or_broken_counts_are_inconclusive_at_once(canary, stable):
    for final in (False, True):
        verdict = compare_proportions("errors", canary, stable, SETTINGS, final=final)
        assert verdict.decision is AnalysisDecision.INCONCLUSIVE
        assert verdict.reason.startswith("errors: ")


@pytest.mark.parametrize("canary_requests", [0, 50, 199])
def test_too_little_data_waits_then_is_inconclusive(canary_requests):
    canary, stable = ProportionCounts(canary_requests, 0), ProportionCounts(10_000, 100)
    assert compare_proportions("errors", canary, stable, SETTINGS).decision is AnalysisDecision.PENDING
    final = compare_proportions("errors", canary, stable, SETTINGS, final=True)
    assert final.decision is AnalysisDecision.INCONCLUSIVE
    assert "fewer than the 200 needed" in final.reason


def test_too_little_data_never_fails_even_when_every_request_failed():
    verdict = compare_proportions("errors", ProportionCounts(100, 100), ProportionCounts(1000, 0), SETTINGS)
    assert verdict.decision is AnalysisDecision.PENDING


def test_a_handful_of_canary_failures_waits_for_enough_expected_events():
    # 20 of 200 canary requests failed, none of 800 stable ones: 4 expected at the margin, too few to
    # trust the normal approximation; with 300 canary requests (6 expected) the canary fails
    few = compare_proportions("errors", ProportionCounts(200, 20), ProportionCounts(800, 0), SETTINGS)
    assert few.decision is AnalysisDecision.PENDING
    assert "fewer than the 5 a rollback needs" in few.reason
    at_end = compare_proportions(
        "errors", ProportionCounts(200, 20), ProportionCounts(800, 0), SETTINGS, final=True
    )
    assert at_end.decision is AnalysisDecision.INCONCLUSIVE
    enough = compare_proportions("errors", ProportionCounts(300, 30), ProportionCounts(1200, 0), SETTINGS)
    assert enough.decision is AnalysisDecision.FAIL


def test_slower_latency_mean_fails_and_equal_passes_at_the_end():
    stable = MeanSample(count=5000, mean=0.020, variance=0.005**2)
    slower = MeanSample(count=1000, mean=0.025, variance=0.006**2)
    assert compare_means("itl", slower, stable, SETTINGS).decision is AnalysisDecision.FAIL
    same = MeanSample(count=1000, mean=0.0201, variance=0.005**2)
    assert compare_means("itl", same, stable, SETTINGS, final=True).decision is AnalysisDecision.PASS
    assert (
        compare_means("itl", MeanSample(1000, None, 1e-6), stable, SETTINGS).decision
        is AnalysisDecision.INCONCLUSIVE
    )


def test_identical_constant_latencies_do_not_divide_by_zero():
    sample = MeanSample(count=1000, mean=0.02, variance=0.0)
    assert compare_means("itl", sample, sample, SETTINGS, final=True).decision is AnalysisDecision.PASS


def test_shadow_errors_on_discordant_pairs():
    worse = PairedCounts(pairs=2000, canary_only_failures=40, stable_only_failures=8)
    assert compare_paired("shadow", worse, SETTINGS).decision is AnalysisDecision.FAIL
    even = PairedCounts(pairs=2000, canary_only_failures=12, stable_only_failures=11)
    assert compare_paired("shadow", even, SETTINGS).decision is AnalysisDecision.PENDING
    assert compare_paired("shadow", even, SETTINGS, final=True).decision is AnalysisDecision.PASS


def test_shadow_output_disagreement_beyond_tolerance_fails():
    counts = PairedCounts(2000, 5, 5, both_succeeded=1990, outputs_differ=200)  # 10% differ
    verdict = compare_paired("shadow", counts, SETTINGS, tolerated_disagreement=0.02)
    assert verdict.decision is AnalysisDecision.FAIL
    assert "outputs differ 10.05%" in verdict.reason
    agreeing = PairedCounts(2000, 5, 5, both_succeeded=1990, outputs_differ=20)
    assert compare_paired("shadow", agreeing, SETTINGS, final=True).decision is AnalysisDecision.PASS


def test_shadow_inconsistent_counts_are_inconclusive():
    assert compare_paired("s", PairedCounts(10, 8, 8), SETTINGS).decision is AnalysisDecision.INCONCLUSIVE
    assert compare_paired("s", PairedCounts(None, 0, 0), SETTINGS).decision is AnalysisDecision.INCONCLUSIVE
    broken = PairedCounts(1000, 1, 1, both_succeeded=10, outputs_differ=11)
    assert compare_paired("s", broken, SETTINGS).decision is AnalysisDecision.INCONCLUSIVE


def test_evaluate_splits_alpha_and_combines():
    good = MetricInput("errors", ProportionCounts(1000, 10), ProportionCounts(9000, 90))
    bad = MetricInput("ttft_slo", ProportionCounts(1000, 80), ProportionCounts(9000, 90))
    missing = MetricInput("itl", MeanSample(1000, 0.02, 1e-6), None)
    result = evaluate([good, bad], SETTINGS, final=True)
    assert result.decision is AnalysisDecision.FAIL
    assert all(m.threshold == pytest.approx(math.log(2 / ALPHA)) for m in result.metrics)
    assert "ttft_slo" in result.reason and "errors" not in result.reason
    assert evaluate([good, missing], SETTINGS, final=True).decision is AnalysisDecision.INCONCLUSIVE
    assert evaluate([good], SETTINGS, final=True).decision is AnalysisDecision.PASS
    assert evaluate([good], SETTINGS, final=False).decision is AnalysisDecision.PENDING
    assert evaluate([], SETTINGS, final=True).decision is AnalysisDecision.INCONCLUSIVE
    json.dumps(evaluate([good, bad, missing], SETTINGS, final=True).to_dict())  # the status form


def test_a_ttft_slo_share_reads_as_such():
    metric = MetricInput(
        "ttft_slo", ProportionCounts(1000, 90), ProportionCounts(9000, 450), label="share over the TTFT SLO"
    )
    result = evaluate([metric], SETTINGS, final=False)
    assert result.decision is AnalysisDecision.FAIL
    assert result.reason.startswith(
        "ttft_slo: canary share over the TTFT SLO 9.00% (90/1000) vs stable 5.00%"
    )


def test_per_metric_margin_overrides_the_default():
    metric = MetricInput(
        "errors", ProportionCounts(20000, 400), ProportionCounts(80000, 800), margin=Margin(3.0)
    )
    assert evaluate([metric], SETTINGS, final=True).decision is AnalysisDecision.PASS


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0},
        {"alpha": 1.5},
        {"min_requests": 0},
        {"effects_of_interest": (0.5, -1)},
        {"effects_of_interest": ()},
    ],
)
def test_bad_settings_are_rejected_with_the_field_name(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AnalysisSettings(**kwargs)


def test_bad_margins_are_rejected():
    with pytest.raises(ValueError, match="margin.relative"):
        Margin(relative=0)
    with pytest.raises(ValueError, match="margin.absolute"):
        Margin(absolute=-0.1)


# --- the statistics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("margin", "canary", "stable", "effect"),
    [
        # 2× the stable error ratio at a 20% canary share: the effect-1.0 alternative is the observed gap
        (Margin(), ProportionCounts(1000, 20), ProportionCounts(4000, 40), 1.0),
        # 1.5× a bound of 1.5·1% + 0.5% = 2%: the effect-0.5 alternative is 1% above the bound
        (Margin(relative=1.5, absolute=0.005), ProportionCounts(1000, 30), ProportionCounts(4000, 40), 0.5),
    ],
)
def test_proportion_alternatives_sit_at_the_ratios_they_name(margin, canary, stable, effect):
    """An effect e is the canary at (1+e)× the margin's bound of the stable rate, not (1+e)× the rate
    pooled over both revisions (which counts the canary's own extra failures: 2.2× at a 20% share)."""
    settings_ = AnalysisSettings(alpha=ALPHA, margin=margin, min_requests=200)
    thetas, weights = _proportion_alternatives(
        settings_, canary.events + stable.events, canary.requests, stable.requests, floor=1e-6
    )
    effects, _ = settings_.alternatives(1.0)
    theta = thetas[effects.index(effect)]
    observed = canary.events / canary.requests - (
        margin.relative * stable.events / stable.requests + margin.absolute
    )
    assert theta == pytest.approx(observed)
    assert len(thetas) == len(weights) and all(t > 0 for t in thetas)
    by_effect = [t for _, t in sorted(zip(effects, thetas, strict=True))]
    assert by_effect == sorted(by_effect)  # a larger effect, a larger gap


@given(
    a=st.floats(-1, 1),
    b=st.floats(-1, 1),
    variance=st.floats(1e-8, 1),
    alternatives=st.lists(st.floats(1e-4, 1), min_size=1, max_size=4),
)
def test_gaussian_mixture_grows_with_the_estimate(a, b, variance, alternatives):
    low, high = sorted((a, b))
    assert (
        gaussian_alternatives_log_lr(low, variance, alternatives)
        <= gaussian_alternatives_log_lr(high, variance, alternatives) + 1e-9
    )


def test_gaussian_mixture_before_any_evidence_is_below_one_and_averages_its_alternatives():
    # one alternative θ: log Λ = θ(θ̂ − θ/2)/σ²
    assert gaussian_alternatives_log_lr(0.0, 1.0, [1.0]) == pytest.approx(-0.5)
    assert gaussian_alternatives_log_lr(2.0, 0.5, [1.0]) == pytest.approx(3.0)
    # two: the log of the mean of the two likelihood ratios
    both = gaussian_alternatives_log_lr(1.0, 1.0, [1.0, 2.0])
    assert both == pytest.approx(math.log((math.exp(0.5) + math.exp(0.0)) / 2))
    weighted = gaussian_alternatives_log_lr(1.0, 1.0, [1.0, 2.0], [3.0, 1.0])
    assert weighted == pytest.approx(math.log(0.75 * math.exp(0.5) + 0.25 * math.exp(0.0)))
    with pytest.raises(ValueError, match="variance"):
        gaussian_alternatives_log_lr(0.1, 0.0, [1.0])
    with pytest.raises(ValueError, match="weight"):
        gaussian_alternatives_log_lr(0.1, 1.0, [1.0], [1.0, 2.0])


@given(trials=st.integers(1, 5000), data=st.data(), p0=st.floats(0.01, 0.99))
def test_binomial_mixture_grows_with_the_successes(trials, data, p0):
    k = data.draw(st.integers(0, trials - 1))
    assert binomial_mixture_log_lr(k, trials, p0) <= binomial_mixture_log_lr(k + 1, trials, p0)
    assert binomial_mixture_log_lr(0, 0, p0) == 0.0


@settings(max_examples=200)
@given(
    n_c=st.integers(0, 100_000),
    n_s=st.integers(0, 100_000),
    data=st.data(),
    relative=st.floats(0.5, 3),
    absolute=st.floats(0, 0.1),
    final=st.booleans(),
)
def test_more_canary_failures_never_turn_a_fail_into_a_pass(n_c, n_s, data, relative, absolute, final):
    f_c = data.draw(st.integers(0, n_c))
    f_s = data.draw(st.integers(0, n_s))
    settings_ = AnalysisSettings(alpha=ALPHA, margin=Margin(relative, absolute), min_requests=100)
    stable = ProportionCounts(n_s, f_s)
    before = compare_proportions("e", ProportionCounts(n_c, f_c), stable, settings_, final=final)
    assert before.decision in set(AnalysisDecision)
    if f_c < n_c and before.decision is AnalysisDecision.FAIL:
        after = compare_proportions("e", ProportionCounts(n_c, f_c + 1), stable, settings_, final=final)
        assert after.decision is AnalysisDecision.FAIL
    json.dumps(before.to_dict())


# --- error rates, simulated (fixed seeds) ------------------------------------------------------------------

LOOKS, CANARY_PER_LOOK, STABLE_PER_LOOK = 60, 100, 400
RUNS = 400
# A/A at α = 0.05 over 400 runs: the standard error of the rate is about 0.011; the tolerance allows 2 of them.
TOLERANCE = 0.022


def rollback_rate(
    p_canary: float, p_stable: float, settings_: AnalysisSettings, seed: int, runs: int = RUNS
) -> float:
    rng = random.Random(seed)
    rolled_back = 0
    for _ in range(runs):
        f_c = f_s = 0
        for look in range(1, LOOKS + 1):
            f_c += binomial(rng, CANARY_PER_LOOK, p_canary)
            f_s += binomial(rng, STABLE_PER_LOOK, p_stable)
            canary = ProportionCounts(look * CANARY_PER_LOOK, f_c)
            stable = ProportionCounts(look * STABLE_PER_LOOK, f_s)
            if compare_proportions("e", canary, stable, settings_).decision is AnalysisDecision.FAIL:
                rolled_back += 1
                break
    return rolled_back / runs


def test_a_a_rollouts_stay_under_alpha_however_often_they_are_checked():
    assert rollback_rate(0.02, 0.02, SETTINGS, seed=1) <= ALPHA + TOLERANCE


def test_canary_exactly_at_the_margin_stays_under_alpha():
    at_margin = AnalysisSettings(alpha=ALPHA, margin=Margin(relative=1.5, absolute=0.005), min_requests=200)
    assert rollback_rate(0.02 * 1.5 + 0.005, 0.02, at_margin, seed=2) <= ALPHA + TOLERANCE


def test_a_clearly_worse_canary_is_detected():
    assert rollback_rate(0.06, 0.02, SETTINGS, seed=3, runs=100) >= 0.95


def test_a_a_latency_means_stay_under_alpha():
    rng = random.Random(4)
    rolled_back = 0
    for _ in range(RUNS):
        sums = {"c": [0, 0.0, 0.0], "s": [0, 0.0, 0.0]}
        for _look in range(LOOKS):
            for key, n in (("c", CANARY_PER_LOOK), ("s", STABLE_PER_LOOK)):
                for _ in range(n // 10):  # per-look batches keep the test fast; the statistic sees them all
                    x = rng.lognormvariate(math.log(0.02), 0.5)
                    sums[key][0] += 1
                    sums[key][1] += x
                    sums[key][2] += x * x
            samples = {}
            for key, (n, s, ss) in sums.items():
                mean = s / n
                samples[key] = MeanSample(n, mean, max(ss / n - mean * mean, 0.0) * n / max(n - 1, 1))
            settings_ = AnalysisSettings(alpha=ALPHA, min_requests=50)
            if compare_means("itl", samples["c"], samples["s"], settings_).decision is AnalysisDecision.FAIL:
                rolled_back += 1
                break
    assert rolled_back / RUNS <= ALPHA + TOLERANCE


def test_a_a_shadow_pairs_stay_under_alpha_and_a_worse_shadow_is_caught():
    def rate(p_canary_only: float, p_stable_only: float, seed: int) -> float:
        rng = random.Random(seed)
        failed = 0
        for _ in range(RUNS):
            c = s = 0
            for look in range(1, LOOKS + 1):
                c += binomial(rng, 100, p_canary_only)
                s += binomial(rng, 100, p_stable_only)
                if (
                    compare_paired("shadow", PairedCounts(look * 100, c, s), SETTINGS).decision
                    is AnalysisDecision.FAIL
                ):
                    failed += 1
                    break
        return failed / RUNS

    assert rate(0.01, 0.01, seed=5) <= ALPHA + TOLERANCE
    assert rate(0.03, 0.01, seed=6) >= 0.9


# --- failures in clumps -----------------------------------------------------------------------------------


def independent_intervals(rng, count, requests, rate):
    return [(requests, binomial(rng, requests, rate)) for _ in range(count)]


def clumped_intervals(rng, count, requests, calm, burst, every):
    """A burst (rate ``burst``) of two intervals in every ``every``, calm otherwise."""
    return [(requests, binomial(rng, requests, burst if i % every in (0, 1) else calm)) for i in range(count)]


def test_independent_failures_are_not_overdispersed_and_clumped_ones_are():
    rng = random.Random(7)
    calm = [overdispersion(independent_intervals(rng, 60, 500, 0.01)) for _ in range(200)]
    # the estimate is floored at 1 and noisy around it; on average barely above
    assert min(calm) == 1.0 and statistics_mean(calm) < 1.4
    clumped = [overdispersion(clumped_intervals(rng, 60, 500, 0.005, 0.05, 10)) for _ in range(50)]
    assert statistics_mean(clumped) > 3.0


def statistics_mean(values):
    return sum(values) / len(values)


def test_too_few_intervals_or_no_failure_say_nothing_about_clumping():
    assert overdispersion([(100, 9), (100, 0), (100, 0)]) == 1.0  # three intervals: too few to tell
    assert overdispersion([(100, 0)] * 20) == 1.0
    assert overdispersion([]) == 1.0
    assert overdispersion([(100, 30), (100, 0), (100, 0), (100, 0), (100, 30), (100, 0)]) > 5.0


def test_the_history_gives_a_volatility_that_widens_each_revision_by_its_traffic():
    rng = random.Random(11)
    assert relative_volatility(independent_intervals(rng, 120, 600, 0.01)) < 0.2
    volatility = relative_volatility(clumped_intervals(rng, 120, 600, 0.005, 0.05, 10))
    assert volatility > 0.5
    # more requests per interval, the same relative wandering of the rate: a larger factor
    few, many = dispersion_factors(
        ProportionCounts(1200, 12, ((120, 1),) * 10),
        ProportionCounts(4800, 48, ((480, 5),) * 10),
        0.01,
        0.01,
        volatility,
    )
    assert 1.0 < few < many
    # the mean is over the intervals that had requests (a partial or empty one does not dilute it)
    same, _ = dispersion_factors(
        ProportionCounts(1250, 12, ((120, 1),) * 10 + ((50, 0),)),
        ProportionCounts(0, 0),
        0.01,
        0.01,
        volatility,
    )
    assert abs(same - few) / few < 0.06
    # a window shorter than one interval is one interval: the history still widens it
    short, _ = dispersion_factors(ProportionCounts(100, 1), ProportionCounts(400, 4), 0.01, 0.01, volatility)
    assert short > 1.0


def test_a_canary_burst_the_stable_pods_did_not_have_is_not_a_regression_when_failures_clump():
    """A/A, each revision with its own bad minutes: the binomial test reads the canary's burst as a worse
    canary; with the window's intervals and the stable revision's clumped history it does not."""
    rng = random.Random(3)
    history = tuple(clumped_intervals(rng, 120, 600, 0.005, 0.05, 10))
    canary_intervals = ((120, 1), (120, 0), (120, 6), (120, 7), (120, 1), (120, 0), (120, 1), (120, 0))
    stable_intervals = ((480, 2), (480, 3), (480, 2), (480, 3), (480, 2), (480, 3), (480, 2), (480, 2))
    canary = ProportionCounts(960, 16, canary_intervals)
    stable = ProportionCounts(3840, 19, stable_intervals)
    binomial_only = compare_proportions(
        "errors", replace_intervals(canary), replace_intervals(stable), SETTINGS
    )
    assert binomial_only.decision is AnalysisDecision.FAIL
    widened = compare_proportions("errors", canary, stable, SETTINGS, history=history)
    assert widened.decision is AnalysisDecision.PENDING, widened.reason


def replace_intervals(counts):
    return ProportionCounts(counts.requests, counts.events)


def test_a_regression_that_starts_half_way_through_the_window_is_caught_a_few_looks_later():
    """The canary's own intervals jump from 1% to 5%: they look overdispersed, which widens its variance (the
    known limit written in `dispersion_factors`): four bad intervals are not yet enough, ten are."""
    rng = random.Random(17)
    history = tuple(independent_intervals(rng, 120, 600, 0.01))
    calm, bad = independent_intervals(rng, 10, 200, 0.01), independent_intervals(rng, 10, 200, 0.05)
    stable_intervals = independent_intervals(rng, 20, 800, 0.01)

    def verdict(looks):
        canary_intervals, stable_part = tuple((calm + bad)[:looks]), tuple(stable_intervals[:looks])
        canary = ProportionCounts(200 * looks, sum(f for _, f in canary_intervals), canary_intervals)
        stable = ProportionCounts(800 * looks, sum(f for _, f in stable_part), stable_part)
        return compare_proportions("errors", canary, stable, SETTINGS, history=history)

    assert overdispersion(tuple(calm + bad[:4])) > 2.0
    assert verdict(14).decision is not AnalysisDecision.FAIL
    assert verdict(20).decision is AnalysisDecision.FAIL, verdict(20).reason


def test_the_reason_says_when_clumps_widened_the_variance():
    rng = random.Random(3)
    history = tuple(clumped_intervals(rng, 120, 600, 0.005, 0.05, 10))
    counts = ProportionCounts(960, 10, ((120, 1),) * 8)
    verdict = compare_proportions(
        "errors", counts, ProportionCounts(3840, 40, ((480, 5),) * 8), SETTINGS, history=history
    )
    assert "clumps: variance x" in verdict.reason, verdict.reason
    calm = compare_proportions("errors", ProportionCounts(960, 10), ProportionCounts(3840, 40), SETTINGS)
    assert "clumps" not in calm.reason


def test_a_steady_regression_is_still_caught_with_a_calm_history():
    rng = random.Random(5)
    history = tuple(independent_intervals(rng, 120, 600, 0.01))
    canary_intervals = tuple(independent_intervals(rng, 20, 120, 0.03))
    stable_intervals = tuple(independent_intervals(rng, 20, 480, 0.01))
    canary = ProportionCounts(2400, sum(f for _, f in canary_intervals), canary_intervals)
    stable = ProportionCounts(9600, sum(f for _, f in stable_intervals), stable_intervals)
    verdict = compare_proportions("errors", canary, stable, SETTINGS, history=history)
    assert verdict.decision is AnalysisDecision.FAIL, verdict.reason


def test_a_short_history_says_nothing_and_a_longer_one_needs_less_margin():
    rng = random.Random(13)
    clumped = clumped_intervals(rng, 120, 600, 0.005, 0.05, 10)
    assert (
        relative_volatility(clumped[:29]) == 0.0
    )  # under a quarter of an hour: the window's own intervals only
    assert relative_volatility(clumped[:60]) > 0.0
    factors = [_upper_bound_factor(k, 16) for k in (30, 120, 360, 1440)]
    assert factors == sorted(factors, reverse=True) and factors[-1] > 1.0
    assert 1.4 < _upper_bound_factor(120, 16) < 1.8  # an hour of 30 s intervals
