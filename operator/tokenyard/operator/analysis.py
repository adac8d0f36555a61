"""Rollout analysis: is the canary worse than the stable revision? (a pure core)

A canary is judged many times while it runs (every 30 s or so). A fixed threshold checked at every look is
a test repeated many times, and its false-alarm rate grows with the number of looks: a healthy release is
rolled back by chance sooner or later. This module uses tests whose error rate holds however often they are
evaluated, so the operator may look as often as it likes:

* Two revisions compared over the same time (error ratio, share of requests over a TTFT SLO, mean
  inter-token latency): a one-sided *mixture sequential probability ratio test* (mSPRT) on the normal
  approximation of the difference, after Johari, Pekelis & Walsh, "Always valid inference: continuous
  monitoring of A/B tests" (2017, Operations Research 2022). Each likelihood ratio of a fixed alternative
  is a nonnegative martingale under the null hypothesis, so any fixed mixture of them is too, and by
  Ville's inequality P(statistic ever ≥ 1/α) ≤ α, at any number of looks. The mixture is discrete and
  sized relative to the margin's bound: nine tenths of the weight on the canary at 1.5×, 1.75× and 2×
  what the margin allows (the degradations worth catching fast), a tenth on a ladder of smaller ones (so
  that a degradation down to a few percent is caught in the end). The mixing distribution decides which effects the test
  catches soonest; a few points where the effects that matter are cost log(k) in the threshold, where
  a wide continuous prior pays a penalty that grows with the sample. The guarantee is as good as the
  normal approximation of the counts (Johari et al. prove it asymptotically); ``min_requests`` and a
  floor of 5 bad requests expected of the canary before a rollback keep the counts where it holds, and
  the unit tests and ``bench/bench_rollout.py`` check the false-alarm rate by simulation.
* Shadow traffic (the very same requests sent to both): the pairs where exactly one revision failed
  (McNemar's discordant pairs) and, for greedy decoding, the pairs whose outputs differ. These are exact
  binomial sequential tests (a mixture of likelihood ratios over a fixed grid of alternatives), with no
  normal approximation at all.

The margin says how much worse the canary may be before it counts as worse: the null hypothesis of the
failure test is ``canary ≤ relative × stable + absolute``.

How verdicts are reached (the rule, in one place):

* ``FAIL``: the test of "the canary is worse than the margin allows" fires (statistic ≥ log(1/α)).
* ``PASS``: either the mirror test fires early ("the canary is within the margin", also at level α), or the
  analysis window has ended (``final=True``), both revisions have at least ``min_requests`` and the failure
  test has not fired. Either way the chance that a canary no worse than the margin is failed stays at most
  α (the false-rollback rate): PASS adds no way to fail, and the early PASS only shortens good rollouts
  (a canary truly worse than the margin passes early with probability at most α as well).
* ``PENDING``: the data are sound but nothing is decided yet and the window is still open: keep going.
* ``INCONCLUSIVE``: the analysis cannot judge: a metric is missing, negative or not a number, the counts
  contradict each other, or the window ended with too few requests (or too few bad requests expected to
  trust a statistic that says "worse"). The rollout pauses with the reason; it neither
  rolls back nor promotes.

Several metrics share α (Bonferroni): each is tested at α/k, so the rollout's false-rollback rate stays at
most α whichever metric would fire.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "AnalysisResult",
    "AnalysisSettings",
    "AnalysisDecision",
    "Margin",
    "MeanSample",
    "MetricInput",
    "MetricVerdict",
    "PairedCounts",
    "ProportionCounts",
    "binomial_mixture_log_lr",
    "combine",
    "compare_means",
    "compare_paired",
    "compare_proportions",
    "evaluate",
    "gaussian_alternatives_log_lr",
    "overdispersion",
]


class AnalysisDecision(enum.StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    PENDING = "Pending"
    INCONCLUSIVE = "Inconclusive"


@dataclass(frozen=True)
class Margin:
    """Tolerated degradation: the canary counts as worse only above ``relative × stable + absolute``."""

    relative: float = 1.0
    absolute: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.relative) and self.relative > 0):
            raise ValueError(f"margin.relative must be a finite number > 0, got {self.relative!r}")
        if not (math.isfinite(self.absolute) and self.absolute >= 0):
            raise ValueError(f"margin.absolute must be a finite number ≥ 0, got {self.absolute!r}")

    def describe(self, percent: bool) -> str:
        absolute = f"{self.absolute:.2%}" if percent else f"{self.absolute:.4g}"
        return f"margin ×{self.relative:g} +{absolute}"


@dataclass(frozen=True)
class AnalysisSettings:
    """How strict the analysis is.

    ``alpha`` is the false-rollback rate: the chance that a canary which is no worse than the margin is
    rolled back, over the whole analysis, however often it is evaluated. ``min_requests`` is the least
    number of requests per revision before any verdict. ``effects_of_interest`` are the alternatives the
    test is mixed over, as degradations relative to the margin's bound: 0.5 is a canary at 1.5× what the
    margin allows. The test is fastest for degradations near these sizes; its false-alarm guarantee
    holds for any of them.
    """

    alpha: float = 0.05
    margin: Margin = field(default_factory=Margin)
    min_requests: int = 200
    effects_of_interest: tuple[float, ...] = (0.5, 0.75, 1.0)

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests must be ≥ 1, got {self.min_requests!r}")
        if not self.effects_of_interest or not all(
            math.isfinite(e) and e > 0 for e in self.effects_of_interest
        ):
            raise ValueError(
                f"effects_of_interest must be finite numbers > 0, got {self.effects_of_interest!r}"
            )

    @property
    def threshold(self) -> float:
        """log(1/α): the level the log-likelihood ratio must reach."""
        return math.log(1.0 / self.alpha)

    def with_alpha(self, alpha: float) -> AnalysisSettings:
        return replace(self, alpha=alpha)

    def with_margin(self, margin: Margin) -> AnalysisSettings:
        return replace(self, margin=margin)

    def alternatives(self, bound: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The effects mixed over and their weights, for a margin whose bound (the canary's level it
        allows) is ``bound``: most of the weight on the effects of interest, the rest spread over smaller
        ones, so that a smaller degradation (a latency 20% worse) is still caught, only later."""
        effects = (*self.effects_of_interest, *_SMALLER_EFFECTS)
        main = (1.0 - _SMALLER_EFFECTS_WEIGHT) / len(self.effects_of_interest)
        small = _SMALLER_EFFECTS_WEIGHT / len(_SMALLER_EFFECTS)
        weights = (main,) * len(self.effects_of_interest) + (small,) * len(_SMALLER_EFFECTS)
        return tuple(e * bound for e in effects), weights


# A point alternative θ_k cannot detect effects below θ_k/2 however long it runs; a tenth of the weight
# on a geometric ladder of smaller effects (35% of the bound down to 3%) keeps the test consistent.
_SMALLER_EFFECTS = tuple(0.5 * 0.7**k for k in range(1, 9))
_SMALLER_EFFECTS_WEIGHT = 0.1

# Bad requests expected of the canary at the margin before the normal approximation may roll it back.
MIN_EXPECTED_EVENTS = 5


# --- inputs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProportionCounts:
    """Cumulative counts of one revision over the analysis window: requests and the bad ones among them
    (failures, or requests over the TTFT SLO). ``None`` means the metric could not be read.

    ``intervals``, when known, are the same counts split into consecutive equal intervals of the window
    (``(requests, events)`` each, oldest first): they show whether bad requests come in clumps, which widens
    the test's variance (``overdispersion``)."""

    requests: float | None
    events: float | None
    intervals: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class MeanSample:
    """A latency metric of one revision over the window: number of observations, their mean and variance
    (from a histogram's count and sum, the variance estimated from its buckets)."""

    count: float | None
    mean: float | None
    variance: float | None


@dataclass(frozen=True)
class PairedCounts:
    """Shadow traffic: the same requests answered by both revisions.

    ``canary_only_failures``: pairs where the canary (shadow) failed and the stable one did not;
    ``stable_only_failures``: the reverse; ``both_succeeded``: pairs where both answered, of which
    ``outputs_differ`` gave different outputs (meaningful for greedy decoding only, else ``None``).
    """

    pairs: float | None
    canary_only_failures: float | None
    stable_only_failures: float | None
    both_succeeded: float | None = None
    outputs_differ: float | None = None


# --- outputs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    decision: AnalysisDecision
    statistic: float | None  # log-likelihood ratio of "canary worse than the margin allows"
    threshold: float  # log(1/α) at the level this metric was tested
    reason: str
    canary: dict[str, float] = field(default_factory=dict)
    stable: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The status form (JSON-safe: an infinite statistic is written as a large number)."""
        statistic = None if self.statistic is None else _finite(self.statistic)
        return {
            "metric": self.metric,
            "decision": str(self.decision),
            "statistic": statistic,
            "threshold": round(self.threshold, 4),
            "reason": self.reason,
            "canary": dict(self.canary),
            "stable": dict(self.stable),
        }


@dataclass(frozen=True)
class AnalysisResult:
    decision: AnalysisDecision
    reason: str
    metrics: tuple[MetricVerdict, ...]

    def to_dict(self) -> dict:
        return {
            "decision": str(self.decision),
            "reason": self.reason,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _finite(x: float) -> float:
    if math.isnan(x):
        return 0.0
    return round(max(-1e9, min(1e9, x)), 4)


# --- the statistics ------------------------------------------------------------------------------------


def gaussian_alternatives_log_lr(
    estimate: float,
    variance: float,
    alternatives: Sequence[float],
    weights: Sequence[float] | None = None,
) -> float:
    """log Λ of a one-sided Gaussian mixture SPRT for H0: θ ≤ 0 against θ > 0.

    ``estimate`` ~ N(θ, variance) is the cumulative estimate of θ. Λ is the mixture, with ``weights``
    (equal by default; normalised to sum to 1), over the point alternatives θ_k > 0 of the likelihood
    ratios exp(θ_k θ̂/σ² − θ_k²/(2σ²)). Written in the cumulative sum S_n = n θ̂ with σ² = v/n, each is
    exp(θ_k S_n/v − n θ_k²/(2v)): a martingale under θ = 0 and a supermartingale under θ < 0. Λ is below
    1 before any evidence and grows with the estimate.
    """
    if variance <= 0 or not alternatives or min(alternatives) <= 0:
        raise ValueError(f"variance and alternatives must be > 0, got {variance!r}, {alternatives!r}")
    weights = [1.0] * len(alternatives) if weights is None else list(weights)
    if len(weights) != len(alternatives) or min(weights) <= 0:
        raise ValueError(f"one weight > 0 per alternative, got {weights!r} for {alternatives!r}")
    total = sum(weights)
    terms = [
        math.log(w / total) + theta * (estimate - theta / 2.0) / variance
        for theta, w in zip(alternatives, weights, strict=True)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


# A fixed grid of alternatives for the exact binomial test, in log-odds above the null, equally weighted.
# The grid is geometric, so small (likely) degradations are covered as densely as large ones.
_LOG_ODDS_SHIFTS = tuple(0.05 * 1.25**k for k in range(20))  # 0.05 … ≈ 3.5 in log-odds
_SHIFT_LOG_WEIGHTS = tuple(math.log(1.0 / len(_LOG_ODDS_SHIFTS)) for _ in _LOG_ODDS_SHIFTS)


def binomial_mixture_log_lr(successes: float, trials: float, null_probability: float) -> float:
    """log Λ of an exact one-sided sequential binomial test, H0: p ≤ p0 against p > p0.

    Λ is a weighted mixture, over a fixed grid of alternatives p1 > p0, of the likelihood ratios
    (p1/p0)^k ((1-p1)/(1-p0))^(n-k). Each of these is a nonnegative martingale under p = p0 (a
    supermartingale under p < p0), so their mixture is too, and Ville's inequality bounds the false-alarm
    rate by α at any number of looks. No normal approximation: valid from the first observation.
    """
    if not (0.0 < null_probability < 1.0):
        raise ValueError(f"null_probability must be in (0, 1), got {null_probability!r}")
    if trials <= 0:
        return 0.0
    failures = trials - successes
    null_logit = math.log(null_probability / (1.0 - null_probability))
    log_p0, log_q0 = math.log(null_probability), math.log1p(-null_probability)
    terms = []
    for shift, log_weight in zip(_LOG_ODDS_SHIFTS, _SHIFT_LOG_WEIGHTS, strict=True):
        logit = null_logit + shift
        log_p1 = -math.log1p(math.exp(-logit))
        log_q1 = -math.log1p(math.exp(logit))
        terms.append(log_weight + successes * (log_p1 - log_p0) + failures * (log_q1 - log_q0))
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


# --- clumped failures -----------------------------------------------------------------------------------

# Lags (in intervals) over which consecutive intervals' counts may move together, and the fewest intervals
# before the counts are trusted to say anything about clumping.
_DISPERSION_LAGS = 3
_MIN_DISPERSION_INTERVALS = 4


def _pooled(
    intervals: Sequence[tuple[float, float]], fewest: int
) -> tuple[list[tuple[float, float]], float, float] | None:
    """The intervals with requests, their total requests and pooled rate; None when fewer than ``fewest`` had
    requests or the rate is 0 or 1 (nothing varies)."""
    used = [(n, f) for n, f in intervals if n > 0 and math.isfinite(n) and math.isfinite(f)]
    if len(used) < fewest:
        return None
    total = sum(n for n, _ in used)
    rate = sum(f for _, f in used) / total
    return (used, total, rate) if 0.0 < rate < 1.0 else None


def overdispersion(
    intervals: Sequence[tuple[float, float]], lags: int = _DISPERSION_LAGS, taper: bool = True
) -> float:
    """How much more the count of bad requests over the window varies than independent requests would make it
    vary (≥ 1).

    The binomial variance p(1−p)/n assumes each request fails independently. Real failures come in clumps (a
    pod's bad minute, a flaky dependency): the count over a window then varies several times more, and a test
    that trusts the binomial variance rolls back a healthy canary whenever its pod has a bad minute the stable
    pods did not have. Each revision's variance is widened by this factor, the quasi-binomial way, from its
    per-interval counts: the variance of their total estimated from the residuals about the pooled rate,
    including the covariance of intervals up to ``_DISPERSION_LAGS`` apart (a clump that outlasts an interval
    makes neighbours move together; Bartlett weights keep the estimate positive, as in Newey and West's
    long-run variance), divided by the binomial variance of the total. Fewer than
    ``_MIN_DISPERSION_INTERVALS`` intervals, or no bad request at all: 1 (the binomial variance).
    """
    pooled = _pooled(intervals, _MIN_DISPERSION_INTERVALS)
    if pooled is None:
        return 1.0
    used, total, rate = pooled
    residuals = [f - n * rate for n, f in used]
    lags = min(lags, len(used) - 1)
    variance = sum(e * e for e in residuals)
    for lag in range(1, lags + 1):
        weight = 1.0 - lag / (lags + 1) if taper else 1.0
        variance += 2.0 * weight * sum(a * b for a, b in zip(residuals, residuals[lag:], strict=False))
    # K/(K−1): the pooled rate was estimated from the same counts
    variance *= len(used) / (len(used) - 1)
    return max(1.0, variance / (total * rate * (1.0 - rate)))


# Lags of the history's estimate: an hour of 30 s intervals has room to see a clump of a few minutes.
_HISTORY_LAGS = 16
# Fewer intervals of history than this (a quarter of an hour at 30 s) say too little: only the window's own
# intervals are used.
_MIN_HISTORY_INTERVALS = 30
# The volatility is an estimate from one hour, and too small a one rolls back healthy canaries: the test uses
# the upper end of its 90% confidence interval (below).
_VOLATILITY_CONFIDENCE_Z = 1.2816  # the standard normal's 90th percentile


def _upper_bound_factor(intervals: int, lags: int) -> float:
    """How much larger than a Bartlett long-run variance over ``intervals`` with ``lags`` lags its 90% upper
    confidence bound is: the estimate is about χ²-distributed with ν = 3·intervals/(lags + 1) degrees of freedom
    (Priestley, "Spectral Analysis and Time Series", 1981: the Bartlett window's equivalent degrees of
    freedom), so the bound is ν / χ²_ν(0.1), the quantile by Wilson and Hilferty's approximation. About 1.6 for
    an hour of 30 s intervals; it shrinks towards 1 as the history grows."""
    nu = 3.0 * intervals / (lags + 1)
    spread = math.sqrt(2.0 / (9.0 * nu))
    lower_quantile = nu * max(1e-3, 1.0 - 2.0 / (9.0 * nu) - _VOLATILITY_CONFIDENCE_Z * spread) ** 3
    return max(1.0, nu / lower_quantile)


def relative_volatility(history: Sequence[tuple[float, float]]) -> float:
    """How much a revision's error rate wanders, from its per-interval counts before the rollout: the v in
    "a revision failing a share p of n requests per interval has its count's variance widened by
    1 + n·p·v/(1 − p)" (the rate moving as p·m_t, with m_t's long-run variance v). The stable revision served
    every request before the canary started, so its recent past (an hour of intervals) says how clumped this
    service's failures are far more precisely than the few intervals of the analysis window can. (Cached: the
    history is the same at every look of a window.)"""
    return _relative_volatility(tuple(history))


@functools.lru_cache(maxsize=64)
def _relative_volatility(history: tuple[tuple[float, float], ...]) -> float:
    pooled = _pooled(history, _MIN_HISTORY_INTERVALS)
    if pooled is None:
        return 0.0
    used, total, rate = pooled
    per_interval = total / len(used)
    excess = (overdispersion(used, _HISTORY_LAGS) - 1.0) * _upper_bound_factor(len(used), _HISTORY_LAGS)
    return excess * (1.0 - rate) / (per_interval * rate)


def _requests_per_interval(counts: ProportionCounts) -> float:
    """The revision's mean requests per interval of the window; a window shorter than one interval is one."""
    used = [n for n, _ in counts.intervals if n > 0 and math.isfinite(n)]
    return sum(used) / len(used) if used else (counts.requests or 0.0)


def _predicted(per_interval: float, rate: float, volatility: float) -> float:
    """The dispersion a rate wandering with ``volatility`` gives a revision at ``per_interval`` requests."""
    if volatility <= 0 or not 0.0 < rate < 1.0:
        return 1.0
    return 1.0 + per_interval * rate * volatility / (1.0 - rate)


def dispersion_factors(
    canary: ProportionCounts,
    stable: ProportionCounts,
    canary_rate: float,
    stable_rate: float,
    volatility: float,
) -> tuple[float, float]:
    """The factors the canary's and the stable revision's binomial variances are widened by: for each, the
    larger of what its own intervals in the window show and what the service's volatility before the rollout
    (``relative_volatility``) predicts at its rate and traffic.

    Known limit: a canary that starts failing half-way through the window sees its own regression as a clump,
    which widens its variance and delays the verdict by a few looks (tests/unit/operator/test_analysis.py
    shows it). Capping the canary's own estimate at what the stable revision's clumping predicts was tried and
    undercounted the canary's own bursts: bench-rollout's healthy canaries with independent bursts were rolled
    back 0.064 ± 0.004 (cap at the stable's estimate) and 0.055 ± 0.004 (the same at its 90% upper bound) of
    the time against alpha 0.05, 2026-12-04; a false-rollback rate within alpha comes first."""
    canary_factor = max(
        overdispersion(canary.intervals),
        _predicted(_requests_per_interval(canary), canary_rate, volatility),
    )
    stable_factor = max(
        overdispersion(stable.intervals),
        _predicted(_requests_per_interval(stable), stable_rate, volatility),
    )
    return canary_factor, stable_factor


# --- comparisons of two revisions over the same time ----------------------------------------------------


def _bad_number(*values: float | None) -> bool:
    return any(v is None or not math.isfinite(v) or v < 0 for v in values)


def _verdict_from_tests(
    *,
    metric: str,
    worse_log_lr: float,
    within_log_lr: float,
    settings: AnalysisSettings,
    final: bool,
    comparison: str,
    canary: dict[str, float],
    stable: dict[str, float],
    not_yet_failing: str | None = None,
) -> MetricVerdict:
    """The one decision rule shared by every comparison (see the module docstring).

    ``not_yet_failing`` says why the data cannot fail the canary yet (the normal approximation not sound),
    or is None."""
    threshold = settings.threshold
    bound = f"log(1/α)={threshold:.2f}"
    comparison = f"{metric}: {comparison}"
    if worse_log_lr >= threshold and not_yet_failing is None:
        decision = AnalysisDecision.FAIL
        reason = f"{comparison}: canary worse, log-likelihood ratio {worse_log_lr:.2f} ≥ {bound}"
    elif worse_log_lr >= threshold:
        # worse by the statistic, but too few events to trust it: keep going, or, once the window is
        # over, say that the data could not judge
        decision = AnalysisDecision.INCONCLUSIVE if final else AnalysisDecision.PENDING
        reason = f"{comparison}: log-likelihood ratio {worse_log_lr:.2f} ≥ {bound}, but {not_yet_failing}"
    elif within_log_lr >= threshold:
        decision = AnalysisDecision.PASS
        reason = f"{comparison}: canary within the margin, log-likelihood ratio {within_log_lr:.2f} ≥ {bound}"
    elif final:
        decision = AnalysisDecision.PASS
        reason = f"{comparison}: not worse by the end of the window, log-likelihood ratio {worse_log_lr:.2f} < {bound}"
    else:
        decision = AnalysisDecision.PENDING
        reason = f"{comparison}: undecided, log-likelihood ratio {worse_log_lr:.2f} < {bound}"
    return MetricVerdict(metric, decision, worse_log_lr, threshold, reason, canary, stable)


def _too_little(
    metric: str, n_canary: float, n_stable: float, settings: AnalysisSettings, final: bool
) -> MetricVerdict | None:
    """PENDING (window open) or INCONCLUSIVE (window over) while a revision has < min_requests."""
    if min(n_canary, n_stable) >= settings.min_requests:
        return None
    reason = (
        f"{metric}: {n_canary:.0f} canary and {n_stable:.0f} stable requests, "
        f"fewer than the {settings.min_requests} needed per revision"
    )
    decision = AnalysisDecision.INCONCLUSIVE if final else AnalysisDecision.PENDING
    counts = ({"requests": n_canary}, {"requests": n_stable})
    return MetricVerdict(metric, decision, None, settings.threshold, reason, *counts)


def _proportion_alternatives(
    settings: AnalysisSettings, events: float, n_c: float, n_s: float, floor: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The alternatives θ_k = p_c − (r·p_s + a) of the proportion test, each placed where its effect says.

    An effect e means "the canary at (1 + e)× the margin's bound r·p_s + a". Under that alternative the
    bad requests of both revisions, ``events`` in all, are explained by a stable rate
    p_s,e = (events − n_c(1+e)·a) / (n_c(1+e)·r + n_s), so θ_e = e·(r·p_s,e + a). Scaling every effect
    by the rate re-estimated under the null (both revisions at the bound) instead would count the
    canary's own extra failures in the bound: at a 20% canary share, "2×" would sit at 2.2× the stable
    rate (2.5× at 50%), and the test would be slowest for the degradations it claims to catch first.
    """
    rel, abs_ = settings.margin.relative, settings.margin.absolute
    effects, weights = settings.alternatives(1.0)
    thetas = []
    for e in effects:
        p_s = (events - n_c * (1 + e) * abs_) / (n_c * (1 + e) * rel + n_s)
        p_s = min(1.0 - floor, max(floor, p_s))
        thetas.append(e * (rel * p_s + abs_))
    return tuple(thetas), weights


def compare_proportions(
    metric: str,
    canary: ProportionCounts,
    stable: ProportionCounts,
    settings: AnalysisSettings,
    *,
    final: bool = False,
    label: str = "error ratio",
    history: Sequence[tuple[float, float]] = (),
) -> MetricVerdict:
    """Is the canary's share of bad requests above ``relative × stable's + absolute``?

    θ = p_c − (r·p_s + a) is estimated by p̂_c − r·p̂_s − a. Its variance is taken at the null boundary
    θ = 0 (the rates re-estimated under that constraint, as a score test does) rather than at the raw
    estimates: with few events the raw estimate of a small rate is often 0, and a variance of 0 would make
    a single failure look decisive. The alternatives mixed over are the canary at 1.5×, 1.75×, 2× (...)
    the margin's bound of the stable rate, each with the rates re-estimated under it
    (``_proportion_alternatives``).
    """
    if _bad_number(canary.requests, canary.events, stable.requests, stable.events):
        reason = f"{metric}: a count is missing or not a number (canary {canary}, stable {stable})"
        return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
    n_c, f_c, n_s, f_s = canary.requests, canary.events, stable.requests, stable.events
    if f_c > n_c or f_s > n_s:
        reason = f"{metric}: more bad requests than requests (canary {f_c:g}/{n_c:g}, stable {f_s:g}/{n_s:g})"
        return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
    too_little = _too_little(metric, n_c, n_s, settings, final)
    if too_little is not None:
        return too_little

    rel, abs_ = settings.margin.relative, settings.margin.absolute
    p_c, p_s = f_c / n_c, f_s / n_s
    estimate = p_c - rel * p_s - abs_
    # Rates under the null boundary p_c = r·p_s + a, matching the total number of bad requests; floored
    # at half an event so that "no failures yet" still has a little variance.
    floor = 0.5 / (n_c + n_s)
    p_s0 = min(1.0 - floor, max(floor, (f_c + f_s - n_c * abs_) / (n_c * rel + n_s)))
    p_c0 = min(1.0 - floor, max(floor, rel * p_s0 + abs_))
    canary_spread, stable_spread = dispersion_factors(
        canary, stable, p_c0, p_s0, relative_volatility(history)
    )
    variance = p_c0 * (1 - p_c0) / n_c * canary_spread + rel * rel * p_s0 * (1 - p_s0) / n_s * stable_spread
    alternatives = _proportion_alternatives(settings, f_c + f_s, n_c, n_s, floor)
    worse = gaussian_alternatives_log_lr(estimate, variance, *alternatives)
    within = gaussian_alternatives_log_lr(-estimate, variance, *alternatives)
    # A count of rare events is skewed to the right, so a handful of them looks more surprising to the
    # normal approximation than it is; the textbook rule wants about 5 expected before trusting it.
    expected = n_c * p_c0
    not_yet_failing = (
        None
        if expected >= MIN_EXPECTED_EVENTS
        else f"only {expected:.1f} bad canary requests expected at the margin, fewer than the "
        f"{MIN_EXPECTED_EVENTS} a rollback needs"
    )
    comparison = (
        f"canary {label} {p_c:.2%} ({f_c:.0f}/{n_c:.0f}) vs stable {p_s:.2%} ({f_s:.0f}/{n_s:.0f}), "
        f"{settings.margin.describe(percent=True)}"
    )
    if max(canary_spread, stable_spread) >= 1.05:
        comparison += f" (bad requests come in clumps: variance x{canary_spread:.2f} canary, x{stable_spread:.2f} stable)"
    return _verdict_from_tests(
        metric=metric,
        worse_log_lr=worse,
        within_log_lr=within,
        settings=settings,
        final=final,
        comparison=comparison,
        canary={"requests": n_c, "events": f_c, "ratio": p_c},
        stable={"requests": n_s, "events": f_s, "ratio": p_s},
        not_yet_failing=not_yet_failing,
    )


def compare_means(
    metric: str,
    canary: MeanSample,
    stable: MeanSample,
    settings: AnalysisSettings,
    *,
    final: bool = False,
    unit: str = "s",
) -> MetricVerdict:
    """Is the canary's mean (e.g. inter-token latency) above ``relative × stable's + absolute``?

    The same one-sided mixture test on μ_c − r·μ_s − a with the plug-in variance v_c/n_c + r²·v_s/n_s;
    ``min_requests`` keeps the normal approximation in the range where it holds.
    """
    values = (canary.count, canary.mean, canary.variance, stable.count, stable.mean, stable.variance)
    if _bad_number(*values):
        reason = f"{metric}: a value is missing or not a number (canary {canary}, stable {stable})"
        return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
    too_little = _too_little(metric, canary.count, stable.count, settings, final)
    if too_little is not None:
        return too_little

    rel, abs_ = settings.margin.relative, settings.margin.absolute
    estimate = canary.mean - rel * stable.mean - abs_
    variance = canary.variance / canary.count + rel * rel * stable.variance / stable.count
    # The scale the effects are multiples of: the canary mean the margin allows, or the stable revision's
    # standard deviation when that is larger (a mean near 0 would otherwise make every effect tiny).
    scale = max(rel * stable.mean + abs_, math.sqrt(stable.variance), 1e-12)
    variance = max(variance, (1e-9 * scale) ** 2)  # identical constant samples: keep the ratio finite
    alternatives = settings.alternatives(scale)
    worse = gaussian_alternatives_log_lr(estimate, variance, *alternatives)
    within = gaussian_alternatives_log_lr(-estimate, variance, *alternatives)
    comparison = (
        f"canary mean {canary.mean:.4g}{unit} (n={canary.count:.0f}) vs stable {stable.mean:.4g}{unit} "
        f"(n={stable.count:.0f}), {settings.margin.describe(percent=False)}"
    )
    return _verdict_from_tests(
        metric=metric,
        worse_log_lr=worse,
        within_log_lr=within,
        settings=settings,
        final=final,
        comparison=comparison,
        canary={"count": canary.count, "mean": canary.mean},
        stable={"count": stable.count, "mean": stable.mean},
    )


def compare_paired(
    metric: str,
    counts: PairedCounts,
    settings: AnalysisSettings,
    *,
    final: bool = False,
    tolerated_disagreement: float = 0.02,
) -> MetricVerdict:
    """Shadow traffic: the same requests answered by both revisions.

    Errors (McNemar): only the discordant pairs carry information. Under "the canary fails no more often
    than ``relative`` times the stable one", a discordant pair is a canary-only failure with probability
    at most q0 = r / (1 + r) (r = margin.relative; 1/2 with no margin), so the number of canary-only
    failures among the discordant pairs is tested with the exact sequential binomial test.
    (margin.absolute does not apply to paired errors.)

    Outputs (greedy decoding): among pairs where both succeeded, the share that differ is tested against
    ``tolerated_disagreement`` the same way (batching makes greedy outputs differ a little even between
    identical revisions). Each of the two tests gets α/2 when both are present.

    PASS needs the window to end (final) with ``min_requests`` pairs: there is no early PASS here.
    """
    if _bad_number(counts.pairs, counts.canary_only_failures, counts.stable_only_failures):
        reason = f"{metric}: a paired count is missing or not a number ({counts})"
        return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
    pairs, c_only, s_only = counts.pairs, counts.canary_only_failures, counts.stable_only_failures
    if c_only + s_only > pairs:
        reason = f"{metric}: more discordant pairs ({c_only + s_only:g}) than pairs ({pairs:g})"
        return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
    check_outputs = counts.both_succeeded is not None or counts.outputs_differ is not None
    if check_outputs:
        if (
            _bad_number(counts.both_succeeded, counts.outputs_differ)
            or counts.outputs_differ > counts.both_succeeded
        ):
            reason = f"{metric}: output agreement counts are missing or inconsistent ({counts})"
            return MetricVerdict(metric, AnalysisDecision.INCONCLUSIVE, None, settings.threshold, reason)
        if not (0.0 < tolerated_disagreement < 1.0):
            raise ValueError(f"tolerated_disagreement must be in (0, 1), got {tolerated_disagreement!r}")
    too_little = _too_little(metric, pairs, pairs, settings, final)
    if too_little is not None:
        return too_little

    alpha = settings.alpha / 2 if check_outputs else settings.alpha
    threshold = math.log(1.0 / alpha)
    q0 = settings.margin.relative / (1.0 + settings.margin.relative)
    errors_llr = binomial_mixture_log_lr(c_only, c_only + s_only, q0)
    parts = [f"discordant pairs: canary-only failures {c_only:.0f}, stable-only {s_only:.0f}"]
    statistic, failed = errors_llr, errors_llr >= threshold
    canary_counts = {"pairs": pairs, "only_failures": c_only}
    if check_outputs:
        outputs_llr = binomial_mixture_log_lr(
            counts.outputs_differ, counts.both_succeeded, tolerated_disagreement
        )
        share = counts.outputs_differ / counts.both_succeeded if counts.both_succeeded else 0.0
        parts.append(
            f"outputs differ {share:.2%} of {counts.both_succeeded:.0f} (tolerated {tolerated_disagreement:.0%})"
        )
        statistic = max(errors_llr, outputs_llr)
        failed = failed or outputs_llr >= threshold
        canary_counts["outputs_differ"] = counts.outputs_differ
    bound = f"log(1/α)={threshold:.2f}"
    comparison = f"{metric}: " + "; ".join(parts)
    if failed:
        decision = AnalysisDecision.FAIL
        reason = f"{comparison}: canary worse, log-likelihood ratio {statistic:.2f} ≥ {bound}"
    elif final:
        decision = AnalysisDecision.PASS
        reason = f"{comparison}: not worse by the end of the window, log-likelihood ratio {statistic:.2f} < {bound}"
    else:
        decision = AnalysisDecision.PENDING
        reason = f"{comparison}: undecided, log-likelihood ratio {statistic:.2f} < {bound}"
    return MetricVerdict(
        metric, decision, statistic, threshold, reason, canary_counts, {"only_failures": s_only}
    )


# --- several metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricInput:
    """One metric of an analysis: its name and the measurements of the window.

    ``canary``/``stable`` are ProportionCounts or MeanSample; ``paired`` a PairedCounts (shadow);
    ``margin`` overrides the settings' margin for this metric.
    """

    name: str
    canary: ProportionCounts | MeanSample | None = None
    stable: ProportionCounts | MeanSample | None = None
    paired: PairedCounts | None = None
    margin: Margin | None = None
    label: str = "error ratio"  # what a proportion is, for the reason: "error ratio", "share over TTFT SLO"
    # (requests, bad requests) of the stable revision per interval before the window (``relative_volatility``)
    history: tuple[tuple[float, float], ...] = ()


def evaluate(metrics: Sequence[MetricInput], settings: AnalysisSettings, *, final: bool) -> AnalysisResult:
    """Judge every metric at α/k (Bonferroni) and combine the verdicts."""
    if not metrics:
        return AnalysisResult(AnalysisDecision.INCONCLUSIVE, "no metrics to analyse", ())
    per_metric = settings.with_alpha(settings.alpha / len(metrics))
    verdicts = []
    for m in metrics:
        s = per_metric if m.margin is None else per_metric.with_margin(m.margin)
        if m.paired is not None:
            verdicts.append(compare_paired(m.name, m.paired, s, final=final))
        elif isinstance(m.canary, MeanSample) and isinstance(m.stable, MeanSample):
            verdicts.append(compare_means(m.name, m.canary, m.stable, s, final=final))
        elif isinstance(m.canary, ProportionCounts) and isinstance(m.stable, ProportionCounts):
            verdicts.append(
                compare_proportions(
                    m.name, m.canary, m.stable, s, final=final, label=m.label, history=m.history
                )
            )
        else:
            reason = f"{m.name}: measurements missing for a revision (canary {m.canary}, stable {m.stable})"
            verdicts.append(MetricVerdict(m.name, AnalysisDecision.INCONCLUSIVE, None, s.threshold, reason))
    return combine(verdicts)


def combine(verdicts: Sequence[MetricVerdict]) -> AnalysisResult:
    """Any FAIL fails; else any INCONCLUSIVE is inconclusive; else any PENDING is pending; else PASS."""
    if not verdicts:
        return AnalysisResult(AnalysisDecision.INCONCLUSIVE, "no metrics to analyse", ())
    for decision in (AnalysisDecision.FAIL, AnalysisDecision.INCONCLUSIVE, AnalysisDecision.PENDING):
        hits = [v for v in verdicts if v.decision is decision]
        if hits:
            return AnalysisResult(decision, "; ".join(v.reason for v in hits), tuple(verdicts))
    return AnalysisResult(AnalysisDecision.PASS, "; ".join(v.reason for v in verdicts), tuple(verdicts))
