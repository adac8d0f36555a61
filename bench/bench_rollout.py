"""Rollout analysis benchmark: tokenyard's sequential test against fixed-threshold rules.

Thousands of simulated canary analyses, seeded. Requests fail with the stable revision's error ratio or the
canary's; the counts are read every 30 s of traffic (``REQUESTS_PER_LOOK`` requests, ``CANARY_SHARE`` of them
to the canary) for up to ``LOOKS`` looks (an hour). Rules:

* ``tokenyard``: ``tokenyard.operator.analysis.compare_proportions`` on the cumulative counts of both
  revisions at every look, with what the operator reads beside them (``canary.PrometheusAnalysis``): each
  revision's counts per 30 s interval of the window, and the stable revision's per interval over the hour
  before the rollout (``HISTORY_SECONDS``), from which the test learns how clumped failures are; rollback on
  FAIL.
* ``argo_failure_limit``: Argo Rollouts' AnalysisRun: each measurement reads the canary's error ratio
  over its query window; a measurement fails above a fixed threshold; the analysis fails once the failed
  measurements exceed ``failureLimit`` (Argo docs, "Analysis & Progressive Delivery": failureLimit).
* ``flagger_threshold``: Flagger's canary analysis: every interval checks the canary's error ratio over the
  metric's window against a maximum; the canary is rolled back when the failed checks reach ``threshold``
  (Flagger docs, "Deployment Strategies", "Canary Release"; "Metrics Analysis").

Every rule sees the very same simulated rollouts. Populations:

* A/A (canary == stable, 1% errors); A/A on a day when both revisions fail 1.5% of requests
  ("baseline shifted": the fixed thresholds were chosen for 1%);
* bad canaries at 1.25x, 1.5x, 2x, 3x and 5x the stable error ratio (tokenyard's mixture prior puts its weight
  on 1.5x-2x; 1.25x, 3x and 5x are effects it was not built on);
* bursty errors: each revision's error ratio follows a two-state Markov chain per 30 s look (a burst
  multiplies it by ``BURST_FACTOR`` for ``BURST_MEAN_LOOKS`` looks on average, ``BURST_SHARE`` of the time;
  the long-run mean stays the nominal ratio), so failures come in clumps, not as independent draws:
  ``aa_bursty`` (each revision its own bursts: a canary pod's bad minute), ``aa_bursty_shared`` (one burst
  process for both: a flaky upstream), ``2x_bursty`` (a 2x canary with its own bursts).

Figures: the false-rollback rate of each A/A population (rolled back within the hour, with its standard
error), and the median number of canary requests served before a bad canary is rolled back ("never" when
fewer than half are caught), with the share caught.

The threshold rules appear:

* at their **documented examples**: Argo's "Background Analysis" example (AnalysisTemplate ``success-rate``:
  interval 5m, ``successCondition: result[0] >= 0.95``, failureLimit 3, an ``irate`` query, which reads the
  last two scrapes: modelled as the last 30 s look; the Rollout's steps raise the weight by 20% every 10
  minutes to 80%, and ``startingStep: 2`` starts the analysis at the second weight: measurements at minutes 10,
  15, ..., 40) and Flagger's canary analysis example (interval 1m, threshold 10, maxWeight 50, stepWeight 2:
  "will run for 25 minutes"; ``request-success-rate`` with ``thresholdRange.min: 99`` over a 1m window).
  The documented error thresholds (5% and 1%) are written for their services; each row is also shown with
  the threshold at twice this service's usual error ratio (2%). The canary's share stays 20% throughout
  (the documented weights ramp from 2% to 80%: a simplification, the same for every rule).
* ``tuned_at_same_false_rollback_rate``, the peer: looking every 30 s for the hour, with one setting from a
  grid (threshold on the canary's error ratio or on canary minus stable, failed checks, query window) for
  both the 1.5x and 2x canaries (the smallest worst slowdown against the fastest setting for each), whose
  false-rollback rate is at most tokenyard's on the usual day *and* on the day the baseline shifted. A rule
  runs with one setting; nobody knows before a rollout whether its canary will be 1.5x or 2x worse, nor
  today's baseline. tokenyard, too, has one setting, knows no baseline, and holds its false-rollback rate
  on both days.
* ``oracle_for_1_5x_known_baseline`` / ``oracle_for_2x_known_baseline``: the fastest setting for one bad
  canary, with the baseline known (only the usual day's A/A rollouts constrain it). A bound, not a peer.

Every tuning favours the threshold rules: it is done on the same rollouts it is measured on.

* ``sprt_known_baseline``, a reference row: Wald's SPRT of the canary alone, told the usual day's error
  ratio, for a canary at exactly 2x (the best a sequential test can do at 2x when the baseline is known).
  It rolls back most A/A rollouts on the day the baseline moves.

tokenyard's false-rollback rate is also printed against α (0.01, 0.02, 0.05, 0.1) for every A/A population,
with the requests it needs at 2x: its statistic does not depend on α (only the bound log(1/α) does), so one
pass over the rollouts gives every α.

Run: ``make bench-rollout`` (or ``BENCH_QUICK=1 python bench/bench_rollout.py`` for a shorter run).
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from results_io import write_results
from tokenyard.operator.analysis import (
    AnalysisDecision,
    AnalysisSettings,
    ProportionCounts,
    compare_proportions,
)
from tokenyard.operator.canary import HISTORY_SECONDS

QUICK = os.environ.get("BENCH_QUICK") == "1"
SEED = 20261202
ROLLOUTS = 1000 if QUICK else 4000  # per population with a bad canary
# A/A populations are larger: the false-rollback rate is compared with α, so its standard error
# (sqrt(r(1 − r)/n), reported beside it) must be small: about 0.0023 at r = 0.045 with 8000.
AA_ROLLOUTS = 2000 if QUICK else 8000
# The bursty A/A populations are smaller (the run's time goes to A/A rollouts, which run the whole hour): a
# standard error of about 0.0034 at r = 0.05 with 4000.
BURSTY_AA_ROLLOUTS = 1000 if QUICK else 4000
TUNE_ROLLOUTS = 1000
TUNE_WINDOWS_LOOKS = (1, 2, 4, 10)  # metric query windows of 30 s, 1 m, 2 m, 5 m
LOOK_SECONDS = 30
LOOKS = 120  # one hour of 30 s looks
HISTORY_LOOKS = round(HISTORY_SECONDS / LOOK_SECONDS)  # the stable revision's hour before the rollout
REQUESTS_PER_LOOK = 600  # 20 requests/s over 30 s
CANARY_SHARE = 0.2
BASE_ERROR_RATIO = 0.01
ALPHA = 0.05
ALPHAS = (0.01, 0.02, 0.05, 0.10)  # the false-rollback rate against α
# Bursts: a two-state Markov chain per look; in a burst the error ratio is BURST_FACTOR times the calm one.
BURST_FACTOR = 5.0
BURST_MEAN_LOOKS = 2.0  # a burst lasts a minute on average
BURST_SHARE = 0.1  # a tenth of the time in bursts
BURST_LEAVE = 1.0 / BURST_MEAN_LOOKS
BURST_ENTER = (
    BURST_SHARE * BURST_LEAVE / (1.0 - BURST_SHARE)
)  # so that the stationary burst share is BURST_SHARE
# The calm ratio is scaled down so that the long-run mean error ratio is the nominal one.
BURST_CALM_SCALE = 1.0 / (1.0 - BURST_SHARE + BURST_SHARE * BURST_FACTOR)


@dataclass(frozen=True)
class Population:
    p_stable: float
    p_canary: float
    # "": independent failures; "independent": each revision its own burst process; "shared": one for both.
    bursts: str = ""

    @property
    def a_a(self) -> bool:
        return self.p_stable == self.p_canary


# "aa_shifted" is an A/A rollout on a day when the error ratio of both revisions is 1.5× the usual (load, a
# flaky upstream): the thresholds were set for 1%.
POPULATIONS = {
    "aa": Population(BASE_ERROR_RATIO, BASE_ERROR_RATIO),
    "1_25x": Population(BASE_ERROR_RATIO, 1.25 * BASE_ERROR_RATIO),
    "1_5x": Population(BASE_ERROR_RATIO, 1.5 * BASE_ERROR_RATIO),
    "2x": Population(BASE_ERROR_RATIO, 2.0 * BASE_ERROR_RATIO),
    "3x": Population(BASE_ERROR_RATIO, 3.0 * BASE_ERROR_RATIO),
    "5x": Population(BASE_ERROR_RATIO, 5.0 * BASE_ERROR_RATIO),
    "aa_shifted": Population(1.5 * BASE_ERROR_RATIO, 1.5 * BASE_ERROR_RATIO),
    "aa_bursty": Population(BASE_ERROR_RATIO, BASE_ERROR_RATIO, "independent"),
    "aa_bursty_shared": Population(BASE_ERROR_RATIO, BASE_ERROR_RATIO, "shared"),
    "2x_bursty": Population(BASE_ERROR_RATIO, 2.0 * BASE_ERROR_RATIO, "independent"),
}
A_A_KEYS = tuple(k for k, p in POPULATIONS.items() if p.a_a)
EFFECT_KEYS = tuple(k for k, p in POPULATIONS.items() if not p.a_a)

CANARY_PER_LOOK = round(REQUESTS_PER_LOOK * CANARY_SHARE)
STABLE_PER_LOOK = REQUESTS_PER_LOOK - CANARY_PER_LOOK
FLAGGER_WINDOW_LOOKS = 2  # Flagger metric interval 1 m, analysis interval 30 s


def binomial(rng: random.Random, n: int, p: float) -> int:
    """Failures among n Bernoulli(p) requests, drawn exactly by skipping geometric gaps (O(n·p) work)."""
    if p <= 0.0:
        return 0
    log_q = math.log1p(-p)
    count, position = 0, 0
    while True:
        position += int(math.log(1.0 - rng.random()) / log_q) + 1
        if position > n:
            return count
        count += 1


@dataclass
class Rollout:
    canary_failures: list[int]  # per look
    stable_failures: list[int]
    # (requests, failures) per look of the stable revision over the hour before the rollout, when it served
    # every request: what the operator reads to learn how clumped this service's failures are
    stable_history: tuple[tuple[int, int], ...] = ()


def burst_states(rng: random.Random, looks: int) -> list[bool]:
    """A two-state Markov chain per look (True: in a burst), started from its stationary distribution."""
    states, bursting = [], rng.random() < BURST_SHARE
    for _ in range(looks):
        states.append(bursting)
        bursting = (rng.random() >= BURST_LEAVE) if bursting else (rng.random() < BURST_ENTER)
    return states


def modulated(p: float, states: list[bool]) -> list[float]:
    """The error ratio per look under bursts, with the long-run mean ``p``."""
    calm = p * BURST_CALM_SCALE
    return [calm * BURST_FACTOR if bursting else calm for bursting in states]


def simulate(population_seed: int, population: Population, rollouts: int) -> list[Rollout]:
    rng = random.Random(population_seed)
    out = []
    for _ in range(rollouts):
        if population.bursts:
            # the stable revision's burst process runs on from the hour before the rollout into it
            stable_states = burst_states(rng, HISTORY_LOOKS + LOOKS)
            history_states, stable_states = stable_states[:HISTORY_LOOKS], stable_states[HISTORY_LOOKS:]
            canary_states = stable_states if population.bursts == "shared" else burst_states(rng, LOOKS)
            p_canary = modulated(population.p_canary, canary_states)
            p_stable = modulated(population.p_stable, stable_states)
            p_history = modulated(population.p_stable, history_states)
        else:
            p_canary, p_stable = [population.p_canary] * LOOKS, [population.p_stable] * LOOKS
            p_history = [population.p_stable] * HISTORY_LOOKS
        out.append(
            Rollout(
                [binomial(rng, CANARY_PER_LOOK, p) for p in p_canary],
                [binomial(rng, STABLE_PER_LOOK, p) for p in p_stable],
                tuple((REQUESTS_PER_LOOK, binomial(rng, REQUESTS_PER_LOOK, p)) for p in p_history),
            )
        )
    return out


# --- the rules: each returns the look (1-based) at which it rolls back, or None ----------------------


def operator_view(rollout: Rollout, looks: int) -> tuple[ProportionCounts, ProportionCounts]:
    """(canary, stable) after ``looks`` looks as the operator reads them: the totals of the window and its counts
    per interval (the stable revision's hour before comes from ``rollout.stable_history``)."""
    canary = rollout.canary_failures[:looks]
    stable = rollout.stable_failures[:looks]
    return (
        ProportionCounts(looks * CANARY_PER_LOOK, sum(canary), tuple((CANARY_PER_LOOK, f) for f in canary)),
        ProportionCounts(looks * STABLE_PER_LOOK, sum(stable), tuple((STABLE_PER_LOOK, f) for f in stable)),
    )


def tokenyard_rollback_looks(
    rollout: Rollout, settings: AnalysisSettings, alphas: Sequence[float]
) -> dict[float, int | None]:
    """The look at which tokenyard rolls back, for each α. The statistic does not depend on α, only the bound
    log(1/α) does: a look fails at α when it fails at the largest α and its statistic reaches log(1/α)."""
    loosest = settings.with_alpha(max(alphas))
    found: dict[float, int | None] = dict.fromkeys(alphas)
    for look in range(LOOKS):
        n = look + 1
        canary, stable = operator_view(rollout, n)
        verdict = compare_proportions("errors", canary, stable, loosest, history=rollout.stable_history)
        if verdict.decision is AnalysisDecision.FAIL:
            for alpha in alphas:
                if found[alpha] is None and verdict.statistic >= math.log(1.0 / alpha):
                    found[alpha] = n
            if all(v is not None for v in found.values()):
                break
    return found


def tokenyard_rollback_look(rollout: Rollout, settings: AnalysisSettings) -> int | None:
    return tokenyard_rollback_looks(rollout, settings, (settings.alpha,))[settings.alpha]


def known_baseline_rollback_look(rollout: Rollout, p0: float, ratio: float) -> int | None:
    """A reference, not a peer: Wald's SPRT of the canary alone, told the stable error ratio ``p0``, for a
    canary at ``ratio``× it (H0: p = p0 against p = ratio·p0, exact Bernoulli likelihood ratio, rollback
    at log(1/α)). At the alternative it tests, no test with its error rates needs fewer requests on
    average (Wald and Wolfowitz): it prices not knowing the baseline. It cannot hold its false-rollback
    rate on the day the baseline moves."""
    up, down = math.log(ratio), math.log1p(-ratio * p0) - math.log1p(-p0)
    failures = 0
    for look in range(LOOKS):
        failures += rollout.canary_failures[look]
        n = (look + 1) * CANARY_PER_LOOK
        if failures * up + (n - failures) * down >= math.log(1.0 / ALPHA):
            return look + 1
    return None


def failing_looks(
    rollout: Rollout,
    max_error_ratio: float,
    window_looks: int,
    versus_stable: bool = False,
    checks: range | None = None,
) -> list[int]:
    """The looks whose canary error ratio over the last ``window_looks`` intervals exceeds the maximum
    (``versus_stable``: exceeds the stable revision's error ratio over the same window by more than it).
    ``checks``: the looks (1-based) at which the rule measures; every look when None."""
    looks, canary, stable = [], 0, 0
    last = LOOKS if checks is None else min(LOOKS, checks[-1])
    for look in range(last):
        canary += rollout.canary_failures[look]
        stable += rollout.stable_failures[look]
        if look >= window_looks:
            canary -= rollout.canary_failures[look - window_looks]
            stable -= rollout.stable_failures[look - window_looks]
        intervals = min(look + 1, window_looks)
        ratio = canary / (intervals * CANARY_PER_LOOK)
        if versus_stable:
            ratio -= stable / (intervals * STABLE_PER_LOOK)
        if ratio > max_error_ratio and (checks is None or look + 1 in checks):
            looks.append(look + 1)
    return looks


def threshold_rollback_look(failures: list[int], failures_to_roll_back: int) -> int | None:
    return failures[failures_to_roll_back - 1] if len(failures) >= failures_to_roll_back else None


@dataclass
class ThresholdRule:
    name: str
    window_looks: int
    # Argo aborts when failed measurements exceed failureLimit (so failureLimit+1 failures); Flagger rolls
    # back when failed checks reach threshold.
    failures_for_parameter: int  # failures_to_roll_back = parameter + this offset
    parameter_name: str
    documented_parameter: int
    versus_stable: bool = False  # the threshold applies to canary minus stable (a query over both revisions)
    # The documented example: its checks (1-based looks) and its error-ratio threshold.
    documented_checks: range = range(1, LOOKS + 1)
    documented_max_error_ratio: float = 2 * BASE_ERROR_RATIO
    documented_as: str = ""


def minutes(m: float) -> int:
    return round(m * 60 / LOOK_SECONDS)


# Argo Rollouts docs, "Analysis & Progressive Delivery", "Background Analysis": measurements every 5m from the
# second step (startingStep: 2, weight 40% at minute 10) until the steps end (80% held to minute 40);
# success-rate >= 0.95; failureLimit 3; the irate query reads the last scrapes: a window of one look.
ARGO = ThresholdRule(
    "argo_failure_limit",
    1,
    1,
    "failureLimit",
    3,
    documented_checks=range(minutes(10), minutes(40) + 1, minutes(5)),
    documented_max_error_ratio=0.05,
    documented_as="success-rate>=95%, every 5m, min 10-40",
)
# Flagger docs, "Deployment Strategies": interval 1m, threshold 10, maxWeight 50, stepWeight 2 ("will run for
# 25 minutes"); "Metrics Analysis": request-success-rate thresholdRange.min 99 over interval 1m.
FLAGGER = ThresholdRule(
    "flagger_threshold",
    FLAGGER_WINDOW_LOOKS,
    0,
    "threshold",
    10,
    documented_checks=range(minutes(1), minutes(25) + 1, minutes(1)),
    documented_max_error_ratio=0.01,
    documented_as="success-rate>=99% over 1m, every 1m, 25 min",
)


# --- figures -------------------------------------------------------------------------------------------


def summarise(looks_by_population: dict[str, list[int | None]]) -> dict:
    """False-rollback rate per A/A population and canary requests to detection per bad canary."""

    def rolled_back(key: str) -> float:
        looks = looks_by_population[key]
        return sum(x is not None for x in looks) / len(looks)

    def standard_error(key: str) -> float:
        rate = rolled_back(key)
        return round(math.sqrt(rate * (1 - rate) / len(looks_by_population[key])), 4)

    figures: dict = {}
    for key in A_A_KEYS:
        figures[false_rollback_key(key)] = round(rolled_back(key), 4)
        figures[f"{false_rollback_key(key)}_se"] = standard_error(key)
    for key in EFFECT_KEYS:
        looks = looks_by_population[key]
        caught = sorted(x for x in looks if x is not None)
        median = None
        if len(caught) * 2 >= len(looks):
            # the median over all rollouts, the undetected ones counted as never
            ordered = caught + [math.inf] * (len(looks) - len(caught))
            median_look = statistics.median_low(ordered)
            median = None if math.isinf(median_look) else median_look * CANARY_PER_LOOK
        figures[f"detect_requests_{key}"] = median
        figures[f"detect_rate_{key}"] = round(len(caught) / len(looks), 4)
    return figures


def false_rollback_key(key: str) -> str:
    """The figure's name for an A/A population: false_rollback_rate, ..._baseline_shifted, ..._bursty, ..."""
    if key == "aa":
        return "false_rollback_rate"
    return "false_rollback_rate_" + key.removeprefix("aa_").replace("shifted", "baseline_shifted")


def threshold_figures(
    populations: dict[str, list[Rollout]],
    rule: ThresholdRule,
    max_error_ratio: float,
    failures: int,
    checks: range | None = None,
) -> dict:
    looks = {
        key: [
            threshold_rollback_look(
                failing_looks(r, max_error_ratio, rule.window_looks, rule.versus_stable, checks), failures
            )
            for r in rollouts
        ]
        for key, rollouts in populations.items()
    }
    figures = summarise(looks)
    figures["max_error_ratio"] = max_error_ratio
    figures[rule.parameter_name] = failures - rule.failures_for_parameter
    figures["window_s"] = rule.window_looks * LOOK_SECONDS
    figures["versus_stable"] = rule.versus_stable
    if checks is not None:
        figures["check_every_s"] = checks.step * LOOK_SECONDS
        figures["checks_from_s"] = checks.start * LOOK_SECONDS
        figures["checks_until_s"] = checks[-1] * LOOK_SECONDS
    return figures


@dataclass(frozen=True)
class Candidate:
    versus_stable: bool
    window_looks: int
    max_error_ratio: float
    failures: int  # failed checks to roll back
    median_look_1_5x: float
    median_look_2x: float
    false_rollback_rate: float


def candidates(
    populations: dict[str, list[Rollout]], target: float, a_a_days: tuple[str, ...]
) -> list[Candidate]:
    """Every grid setting with the fewest failed checks that keep each A/A day in ``a_a_days`` at or
    below the target false-rollback rate (the fewest checks are the fastest for that threshold)."""
    absolute = [round(BASE_ERROR_RATIO * k / 4, 5) for k in range(4, 17)]  # 1× … 4× the baseline
    difference = [round(BASE_ERROR_RATIO * k / 4, 5) for k in range(0, 13)]  # 0 … 3× the baseline above
    keys = {*a_a_days, "1_5x", "2x"}
    subset = {key: populations[key][:TUNE_ROLLOUTS] for key in keys}
    found = []
    for versus_stable, thresholds in ((False, absolute), (True, difference)):
        for window in TUNE_WINDOWS_LOOKS:
            for th in thresholds:
                failing = {
                    key: [failing_looks(r, th, window, versus_stable) for r in rs]
                    for key, rs in subset.items()
                }

                def rate(key: str, m: int, failing=failing) -> float:
                    return sum(len(f) >= m for f in failing[key]) / len(failing[key])

                def median_look(key: str, m: int, failing=failing) -> float:
                    return statistics.median_low(
                        [f[m - 1] if len(f) >= m else math.inf for f in failing[key]]
                    )

                m = next(
                    (m for m in range(1, LOOKS + 1) if all(rate(day, m) <= target for day in a_a_days)), None
                )
                if m is not None:
                    worst = max(rate(day, m) for day in a_a_days)
                    found.append(
                        Candidate(
                            versus_stable, window, th, m, median_look("1_5x", m), median_look("2x", m), worst
                        )
                    )
    if not found:
        raise RuntimeError(f"no threshold setting reaches a false-rollback rate of {target}")
    return found


def fastest_for(found: list[Candidate], objective: str) -> Candidate:
    other = "2x" if objective == "1_5x" else "1_5x"
    return min(
        found,
        key=lambda c: (
            getattr(c, f"median_look_{objective}"),
            getattr(c, f"median_look_{other}"),
            -c.false_rollback_rate,
        ),
    )


def one_setting_for_both(found: list[Candidate]) -> Candidate:
    """The setting whose worse slowdown against the fastest setting for each bad canary is smallest."""
    best_1_5x = fastest_for(found, "1_5x").median_look_1_5x
    best_2x = fastest_for(found, "2x").median_look_2x

    def slowdowns(c: Candidate) -> tuple:
        pair = (c.median_look_1_5x / best_1_5x, c.median_look_2x / best_2x)
        return (max(pair), sum(pair), -c.false_rollback_rate)

    return min(found, key=slowdowns)


def tune(populations: dict[str, list[Rollout]], tokenyard: dict) -> dict[str, Candidate]:
    """The threshold settings compared with tokenyard, all at its false-rollback rate or below.

    The grid spans the error-ratio threshold, whether it applies to the canary alone or to the canary
    minus the stable revision, the number of failed checks and the length of the metric's query window
    (the PromQL range, a knob both tools expose). Both rules count failed checks the same way, so one grid
    serves both. It is searched on the first TUNE_ROLLOUTS rollouts of each population, then measured on
    all of them.

    * ``tuned``: one setting for both bad canaries, chosen knowing neither which bad canary comes nor the
      day's baseline: its false-rollback rate must stay at tokenyard's on the usual day and on the day the
      baseline shifted (tokenyard's holds on both).
    * ``oracle_for_1_5x`` / ``oracle_for_2x``: the fastest setting for one bad canary, knowing the
      baseline (only the usual day's A/A rollouts constrain it).
    """
    fair = candidates(
        populations,
        max(tokenyard["false_rollback_rate"], tokenyard["false_rollback_rate_baseline_shifted"]),
        ("aa", "aa_shifted"),
    )
    known_baseline = candidates(populations, tokenyard["false_rollback_rate"], ("aa",))
    return {
        "tuned": one_setting_for_both(fair),
        "oracle_for_1_5x": fastest_for(known_baseline, "1_5x"),
        "oracle_for_2x": fastest_for(known_baseline, "2x"),
    }


ROW_NAMES = {"tuned": "tuned", "oracle_for_1_5x": "oracle 1.5x", "oracle_for_2x": "oracle 2x"}


def fmt(value) -> str:
    if value is None:
        return "never"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def describe(f: dict, settings: AnalysisSettings) -> str:
    if "alternative_ratio" in f:
        return f"canary alone, told {f['baseline_error_ratio']:.2%}, point {f['alternative_ratio']:g}×"
    if "max_error_ratio" in f:
        parameter = "failureLimit" if "failureLimit" in f else "threshold"
        error = "err-stable" if f["versus_stable"] else "err"
        when = (
            f", every {f['check_every_s'] // 60:g}m {f['checks_from_s'] // 60:g}-{f['checks_until_s'] // 60:g}m"
            if "check_every_s" in f
            else ""
        )
        return f"{error}>{f['max_error_ratio']:.2%} over {f['window_s']}s{when}, {parameter}={f[parameter]}"
    effects = "/".join(f"{1 + e:g}×" for e in settings.effects_of_interest)
    return f"mSPRT α={f.get('alpha', ALPHA):g}, min {settings.min_requests} req, mix {effects}"


def print_tables(rows: list[tuple[str, dict]], settings: AnalysisSettings) -> None:
    header = f"{'rule':36} {'setting':58}" + "".join(f" {k:>17}" for k in A_A_KEYS)
    print("false-rollback rate (A/A rollouts rolled back within the hour) ± standard error")
    print(header)
    print("-" * len(header))
    for name, f in rows:
        cells = "".join(
            f" {f[false_rollback_key(k)]:>8.4f} ± {f[false_rollback_key(k) + '_se']:.4f}" for k in A_A_KEYS
        )
        print(f"{name:36} {describe(f, settings):58}{cells}")
    print()
    header = f"{'rule':36}" + "".join(f" {k:>15}" for k in EFFECT_KEYS)
    print("median canary requests before the rollback (share of bad canaries caught)")
    print(header)
    print("-" * len(header))
    for name, f in rows:
        cells = "".join(
            f" {fmt(f[f'detect_requests_{k}']):>7} ({f[f'detect_rate_{k}']:>5.3f})" for k in EFFECT_KEYS
        )
        print(f"{name:36}{cells}")
    print(
        "requests: the canary gets 20% of 20 requests/s; 'never': fewer than half caught within the analysis."
    )


def rollouts_of(population: Population) -> int:
    if not population.a_a:
        return ROLLOUTS
    return BURSTY_AA_ROLLOUTS if population.bursts else AA_ROLLOUTS


def main() -> int:
    started = time.perf_counter()
    populations = {
        key: simulate(SEED + i, population, rollouts_of(population))
        for i, (key, population) in enumerate(POPULATIONS.items())
    }
    settings = AnalysisSettings(alpha=ALPHA, min_requests=200)  # the defaults otherwise

    # One pass gives tokenyard's rollback look at every α (see tokenyard_rollback_looks).
    looks_by_alpha = {
        key: [tokenyard_rollback_looks(r, settings, ALPHAS) for r in rs] for key, rs in populations.items()
    }
    by_alpha = {
        alpha: summarise({key: [found[alpha] for found in runs] for key, runs in looks_by_alpha.items()})
        | {"alpha": alpha}
        for alpha in ALPHAS
    }
    tokenyard = by_alpha[ALPHA]
    rows = [(f"tokenyard (mSPRT, α={ALPHA:.2f})", tokenyard)]
    results: dict = {
        "alpha": ALPHA,
        "tokenyard": dict(tokenyard, by_alpha={str(a): f for a, f in by_alpha.items()}),
    }
    tuned_settings = tune(populations, tokenyard)
    for rule in (ARGO, FLAGGER):
        failures = rule.documented_parameter + rule.failures_for_parameter
        documented = threshold_figures(
            populations, rule, rule.documented_max_error_ratio, failures, rule.documented_checks
        )
        doubled = threshold_figures(populations, rule, 2 * BASE_ERROR_RATIO, failures, rule.documented_checks)
        results[rule.name] = {"documented_example": documented, "documented_example_threshold_2x": doubled}
        rows.append((f"{rule.name} documented", documented))
        rows.append((f"{rule.name} documented, 2x usual", doubled))
        for kind, c in tuned_settings.items():
            setting = replace(rule, window_looks=c.window_looks, versus_stable=c.versus_stable)
            tuned = threshold_figures(populations, setting, c.max_error_ratio, c.failures)
            key = "tuned_at_same_false_rollback_rate" if kind == "tuned" else f"{kind}_known_baseline"
            results[rule.name][key] = tuned
            rows.append((f"{rule.name} {ROW_NAMES[kind]}", tuned))
    known = summarise(
        {
            key: [known_baseline_rollback_look(r, BASE_ERROR_RATIO, 2.0) for r in rs]
            for key, rs in populations.items()
        }
    )
    known.update(baseline_error_ratio=BASE_ERROR_RATIO, alternative_ratio=2.0)
    results["sprt_known_baseline"] = known
    rows.append(("reference: SPRT, known baseline", known))

    print(
        f"rollout analysis: {AA_ROLLOUTS} rollouts per A/A population ({BURSTY_AA_ROLLOUTS} bursty) and "
        f"{ROLLOUTS} per bad canary, {LOOKS} "
        f"looks of {REQUESTS_PER_LOOK} requests ({CANARY_PER_LOOK} to the canary), baseline error ratio "
        f"{BASE_ERROR_RATIO:.1%}; bursts x{BURST_FACTOR:g} for {BURST_MEAN_LOOKS * LOOK_SECONDS:.0f} s on "
        f"average, {BURST_SHARE:.0%} of the time; seed {SEED}\n"
    )
    print_tables(rows, settings)
    print("\ntokenyard's false-rollback rate against α (± standard error), and requests to catch 1.25x / 2x:")
    print(f"{'α':>6}" + "".join(f" {k:>19}" for k in A_A_KEYS) + f" {'1.25x req':>10} {'2x req':>8}")
    for alpha, f in by_alpha.items():
        cells = "".join(
            f" {f[false_rollback_key(k)]:>8.4f} ± {f[false_rollback_key(k) + '_se']:.4f}" + " " * 2
            for k in A_A_KEYS
        )
        flag = " ".join(
            k for k in A_A_KEYS if f[false_rollback_key(k)] - 2 * f[false_rollback_key(k) + "_se"] > alpha
        )
        print(
            f"{alpha:>6.2f}{cells} {fmt(f['detect_requests_1_25x']):>10} {fmt(f['detect_requests_2x']):>8}"
            + (f"  ABOVE α (by 2 s.e.): {flag}" if flag else "")
        )
    print(f"elapsed {time.perf_counter() - started:.1f} s", file=sys.stderr)
    final = {"bench": "rollout", "results": results}
    print(json.dumps(final))
    write_results("rollout", final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
