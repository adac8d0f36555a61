"""Rollout analysis benchmark: tokenyard's sequential test against fixed-threshold rules.

Thousands of simulated canary analyses, seeded. Each request fails independently (Bernoulli) with the
stable revision's error ratio or the canary's; the analysis looks at the counts every 30 s of traffic
(``REQUESTS_PER_LOOK`` requests, ``CANARY_SHARE`` of them to the canary) for up to ``LOOKS`` looks. Rules:

* ``tokenyard``: ``tokenyard.operator.analysis.compare_proportions`` on the cumulative counts of both
  revisions at every look; rollback on FAIL.
* ``argo_failure_limit``: Argo Rollouts' AnalysisRun style: each interval measures the canary's error
  ratio over that interval; a measurement fails above a fixed threshold; the analysis fails once the failed
  measurements exceed ``failureLimit`` (Argo docs, "Analysis": failureLimit).
* ``flagger_threshold``: Flagger's style: every interval checks the canary's error ratio over the metric
  window (a 1 m query, checked every 30 s, so consecutive windows overlap) against a maximum; the canary
  is rolled back when the failed checks reach ``threshold`` (Flagger docs, "Canary analysis": threshold).

Every rule sees the very same simulated rollouts. Populations: A/A (canary == stable, 1% errors), a
canary with 1.5× and 2× the error ratio, and an A/A rollout on a day when both revisions fail 1.5% of
requests ("baseline shifted": the fixed thresholds were chosen for 1%). Figures: the false-rollback rate
(A/A rollouts rolled back within the hour), and the median number of canary requests served before a bad
canary is rolled back (None when fewer than half are caught within the hour), with the share caught.

The threshold rules are measured at a typical setting (threshold twice the usual error ratio, Argo
failureLimit 3, Flagger threshold 5), and at settings from a grid (threshold on the canary's error ratio
or on canary minus stable, failed checks, query window) whose false-rollback rate is at most tokenyard's,
so that detection is compared at the same false-rollback rate. All rules look every 30 s.

* ``tuned_at_same_false_rollback_rate``, the peer: one setting for both bad canaries (the smallest worst
  slowdown against the fastest setting for each), whose false-rollback rate is at most tokenyard's on the
  usual day *and* on the day the baseline shifted. A rule runs with one setting; nobody knows before a
  rollout whether its canary will be 1.5× or 2× worse, nor today's baseline. tokenyard, too, has one
  setting, knows no baseline, and holds its false-rollback rate on both days.
* ``oracle_for_1_5x_known_baseline`` / ``oracle_for_2x_known_baseline``: the fastest setting for one bad
  canary, with the baseline known (only the usual day's A/A rollouts constrain it). A bound, not a peer:
  a fixed threshold that knows the baseline judges the canary alone (a one-sample test, about 1.3× the
  information per request of any comparison with the stable revision at a 20% canary share), and pays
  for it on the day the baseline moves (the last column).

Every tuning favours the threshold rules: it is done on the same rollouts it is measured on.

* ``sprt_known_baseline``, a reference row: Wald's SPRT of the canary alone, told the usual day's error
  ratio, for a canary at exactly 2× (the best a sequential test can do at 2× when the baseline is known).
  What it needs beyond the oracle threshold for 2× is nothing; what tokenyard needs beyond it is the price
  of judging the canary against the stable revision measured at the same time (with a 20% canary share,
  1 + 0.2/0.8 = 1.25× the requests for the same information) and of a prior that also covers 1.5×.
  It rolls back most A/A rollouts on the day the baseline moves.

The false-rollback rates come with their standard errors (``*_se``); the A/A populations are larger
than the others for that reason.

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
from dataclasses import dataclass, replace

from tokenyard.operator.analysis import (
    AnalysisDecision,
    AnalysisSettings,
    ProportionCounts,
    compare_proportions,
)

QUICK = os.environ.get("BENCH_QUICK") == "1"
SEED = 20261202
ROLLOUTS = 1000 if QUICK else 4000  # per population with a bad canary
# A/A populations are larger: the false-rollback rate is compared with α, so its standard error
# (sqrt(r(1 − r)/n), reported beside it) must be small: about 0.0023 at r = 0.045 with 8000.
AA_ROLLOUTS = 2000 if QUICK else 8000
TUNE_ROLLOUTS = 1000
TUNE_WINDOWS_LOOKS = (1, 2, 4, 10)  # metric query windows of 30 s, 1 m, 2 m, 5 m
LOOK_SECONDS = 30
LOOKS = 120  # one hour of 30 s looks
REQUESTS_PER_LOOK = 600  # 20 requests/s over 30 s
CANARY_SHARE = 0.2
BASE_ERROR_RATIO = 0.01
ALPHA = 0.05
# (stable error ratio, canary error ratio) per population. "aa_shifted" is an A/A rollout on a day when the
# error ratio of both revisions is 1.5× the usual (load, a flaky upstream): the thresholds were set for 1%.
POPULATIONS = {
    "aa": (BASE_ERROR_RATIO, BASE_ERROR_RATIO),
    "1_5x": (BASE_ERROR_RATIO, 1.5 * BASE_ERROR_RATIO),
    "2x": (BASE_ERROR_RATIO, 2.0 * BASE_ERROR_RATIO),
    "aa_shifted": (1.5 * BASE_ERROR_RATIO, 1.5 * BASE_ERROR_RATIO),
}

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


def simulate(population_seed: int, p_stable: float, p_canary: float, rollouts: int) -> list[Rollout]:
    rng = random.Random(population_seed)
    return [
        Rollout(
            [binomial(rng, CANARY_PER_LOOK, p_canary) for _ in range(LOOKS)],
            [binomial(rng, STABLE_PER_LOOK, p_stable) for _ in range(LOOKS)],
        )
        for _ in range(rollouts)
    ]


# --- the rules: each returns the look (1-based) at which it rolls back, or None ----------------------


def tokenyard_rollback_look(rollout: Rollout, settings: AnalysisSettings) -> int | None:
    f_c = f_s = 0
    for look in range(LOOKS):
        f_c += rollout.canary_failures[look]
        f_s += rollout.stable_failures[look]
        n = look + 1
        verdict = compare_proportions(
            "errors",
            ProportionCounts(n * CANARY_PER_LOOK, f_c),
            ProportionCounts(n * STABLE_PER_LOOK, f_s),
            settings,
        )
        if verdict.decision is AnalysisDecision.FAIL:
            return n
    return None


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
    rollout: Rollout, max_error_ratio: float, window_looks: int, versus_stable: bool = False
) -> list[int]:
    """The looks whose canary error ratio over the last ``window_looks`` intervals exceeds the maximum
    (``versus_stable``: exceeds the stable revision's error ratio over the same window by more than it)."""
    looks, canary, stable = [], 0, 0
    for look in range(LOOKS):
        canary += rollout.canary_failures[look]
        stable += rollout.stable_failures[look]
        if look >= window_looks:
            canary -= rollout.canary_failures[look - window_looks]
            stable -= rollout.stable_failures[look - window_looks]
        intervals = min(look + 1, window_looks)
        ratio = canary / (intervals * CANARY_PER_LOOK)
        if versus_stable:
            ratio -= stable / (intervals * STABLE_PER_LOOK)
        if ratio > max_error_ratio:
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
    typical_parameter: int
    versus_stable: bool = False  # the threshold applies to canary minus stable (a query over both revisions)


ARGO = ThresholdRule("argo_failure_limit", 1, 1, "failureLimit", 3)
FLAGGER = ThresholdRule("flagger_threshold", FLAGGER_WINDOW_LOOKS, 0, "threshold", 5)


# --- figures -------------------------------------------------------------------------------------------


def summarise(looks_by_population: dict[str, list[int | None]]) -> dict:
    """False-rollback rate (A/A) and canary requests to detection (1.5×, 2×)."""

    def rolled_back(key: str) -> float:
        looks = looks_by_population[key]
        return sum(x is not None for x in looks) / len(looks)

    def standard_error(key: str) -> float:
        rate = rolled_back(key)
        return round(math.sqrt(rate * (1 - rate) / len(looks_by_population[key])), 4)

    figures: dict = {
        "false_rollback_rate": round(rolled_back("aa"), 4),
        "false_rollback_rate_se": standard_error("aa"),
        "false_rollback_rate_baseline_shifted": round(rolled_back("aa_shifted"), 4),
        "false_rollback_rate_baseline_shifted_se": standard_error("aa_shifted"),
    }
    for key in ("1_5x", "2x"):
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


def threshold_figures(
    populations: dict[str, list[Rollout]], rule: ThresholdRule, max_error_ratio: float, failures: int
) -> dict:
    looks = {
        key: [
            threshold_rollback_look(
                failing_looks(r, max_error_ratio, rule.window_looks, rule.versus_stable), failures
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


def main() -> int:
    started = time.perf_counter()
    populations = {
        key: simulate(SEED + i, *rates, AA_ROLLOUTS if key.startswith("aa") else ROLLOUTS)
        for i, (key, rates) in enumerate(POPULATIONS.items())
    }
    settings = AnalysisSettings(alpha=ALPHA, min_requests=200)  # the defaults otherwise

    tokenyard = summarise(
        {key: [tokenyard_rollback_look(r, settings) for r in rs] for key, rs in populations.items()}
    )
    typical_threshold = 2 * BASE_ERROR_RATIO
    rows = [(f"tokenyard (mSPRT, α={ALPHA:.2f})", tokenyard)]
    results: dict = {"alpha": ALPHA, "tokenyard": tokenyard}
    tuned_settings = tune(populations, tokenyard)
    for rule in (ARGO, FLAGGER):
        typical = threshold_figures(
            populations, rule, typical_threshold, rule.typical_parameter + rule.failures_for_parameter
        )
        results[rule.name] = typical
        rows.append((f"{rule.name} typical", typical))
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
        f"rollout analysis: {AA_ROLLOUTS} A/A and {ROLLOUTS} bad-canary rollouts per population, {LOOKS} looks of {REQUESTS_PER_LOOK} requests "
        f"({CANARY_PER_LOOK} to the canary), baseline error ratio {BASE_ERROR_RATIO:.1%}, seed {SEED}"
    )
    header = (
        f"{'rule':32} {'setting':44} {'false rb':>9} {'1.5x req':>9} {'caught':>7} {'2x req':>8} "
        f"{'caught':>7} {'false rb, base 1.5%':>20}"
    )
    print(header)
    print("-" * len(header))
    for name, f in rows:
        if "alternative_ratio" in f:
            setting = f"canary alone, told {f['baseline_error_ratio']:.2%}, point {f['alternative_ratio']:g}×"
        elif "max_error_ratio" in f:
            parameter = "failureLimit" if "failureLimit" in f else "threshold"
            error = "err-stable" if f["versus_stable"] else "err"
            setting = f"{error}>{f['max_error_ratio']:.2%} over {f['window_s']}s, {parameter}={f[parameter]}"
        else:
            effects = "/".join(f"{1 + e:g}×" for e in settings.effects_of_interest)
            setting = f"margin ×1, min {settings.min_requests} req, mix {effects}"
        print(
            f"{name:32} {setting:44} {fmt(f['false_rollback_rate']):>9} {fmt(f['detect_requests_1_5x']):>9} "
            f"{fmt(f['detect_rate_1_5x']):>7} {fmt(f['detect_requests_2x']):>8} {fmt(f['detect_rate_2x']):>7} "
            f"{fmt(f['false_rollback_rate_baseline_shifted']):>20}"
        )
    print(
        "req = median canary requests served before the rollback (the canary gets 20% of 20 requests/s);\n"
        "caught = share of bad canaries rolled back within the hour; false rb = A/A rollouts rolled back."
    )
    print(
        f"tokenyard false rb {tokenyard['false_rollback_rate']:.4f} ± {tokenyard['false_rollback_rate_se']:.4f} "
        f"(base 1.5%: {tokenyard['false_rollback_rate_baseline_shifted']:.4f} ± "
        f"{tokenyard['false_rollback_rate_baseline_shifted_se']:.4f}) against α = {ALPHA}"
    )
    print(f"elapsed {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(json.dumps({"bench": "rollout", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
