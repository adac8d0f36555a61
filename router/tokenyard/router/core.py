"""The routing decision: filters narrow the candidates, weighted scorers rate them, a picker chooses.

Mirrors the scheduler frameworks (kube-scheduler's framework, the Gateway API inference extension's endpoint
picker): each plug-in is small; weights come from configuration (``ModelDeployment.spec.routing.weights``);
each scorer's values are normalised min-max across the candidates (all equal -> 1.0) before the weighted sum;
the picker takes the best score and breaks ties at random after a stable sort. Everything here is pure: the
snapshot, the request and the time come in as arguments, the decision goes out.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class ReplicaSnapshot:
    """What the router knows about one replica at decision time."""

    name: str
    url: str
    revision: str = ""
    healthy: bool = True
    ejected: bool = False
    outstanding_tokens: int = 0  # counted by the router(s): prefill not yet done + expected decode
    outstanding_requests: int = 0
    # From the replica's /metrics; None when unknown or older than the freshness bound (unknown is not zero).
    kv_usage: float | None = None  # 0..1
    queue_waiting: float | None = None
    block_size: int = 16


@dataclass
class RequestState:
    """What one stage of a decision tells the next, and the caller: one typed field per fact, so that a
    plug-in that reads a fact names the one that wrote it."""

    # The revision the canary split chose for this request (set by the caller; RevisionFilter keeps it).
    # None: no constraint.
    revision: str | None = None
    # NotSaturatedFilter left no candidate: every replica is full (the client is told to retry later).
    saturated: bool = False
    # Replicas PrefixCacheScorer gave no prefix credit because of the hot-spot guard.
    hotspot_guarded: list[str] = field(default_factory=list)


@dataclass
class RoutingRequest:
    """One request as the decision sees it. ``prefix_match_tokens`` maps replica name to the prompt tokens
    that replica most likely still caches (looked up in the prefix index by the caller)."""

    model: str
    prompt_tokens: int
    expected_output_tokens: int
    prefix_match_tokens: Mapping[str, int] = field(default_factory=dict)
    state: RequestState = field(default_factory=RequestState)


@dataclass(frozen=True)
class RoutingDecision:
    replica: ReplicaSnapshot | None
    scores: dict[str, float]  # total weighted score per candidate
    breakdown: dict[str, dict[str, float]]  # scorer name -> candidate -> normalised score
    reason: str

    @property
    def ok(self) -> bool:
        return self.replica is not None


# --- registry ---------------------------------------------------------------------------------------------


class Plugin:
    """Base of filters and scorers: subclasses register under a configuration name."""

    kind: ClassVar[str] = "plugin"
    registry: ClassVar[dict[str, type[Plugin]]]

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "registry" not in cls.__dict__ and name is None:
            cls.registry = {}  # a new family (Filter, Scorer) gets its own registry
            return
        if name is not None:
            if name in cls.registry:
                raise ValueError(f"{cls.kind} {name!r} is registered twice")
            cls.registry[name] = cls
            cls.name = name

    name: ClassVar[str] = ""

    @classmethod
    def build(cls, name: str, **options: Any) -> Plugin:
        try:
            plugin_cls = cls.registry[name]
        except KeyError:
            known = ", ".join(sorted(cls.registry))
            raise ValueError(f"unknown {cls.kind} {name!r}; known: {known}") from None
        return plugin_cls(**options)


# --- filters ----------------------------------------------------------------------------------------------


class Filter(Plugin):
    kind = "filter"

    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        raise NotImplementedError

    def apply(self, request: RoutingRequest, candidates: list[ReplicaSnapshot]) -> list[ReplicaSnapshot]:
        return [replica for replica in candidates if self.keep(request, replica)]

    def none_left(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> str:
        """Why no replica is left, once this filter removed all of ``candidates`` (the decision's reason)."""
        return f"no replica left after filter {self.name!r}"


class HealthyFilter(Filter, name="healthy"):
    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        return replica.healthy


class NotEjectedFilter(Filter, name="notEjected"):
    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        return not replica.ejected


@dataclass
class SaturationLimits:
    """A replica is saturated when the router already has this many requests in flight on it, or when it
    reports this many waiting requests (fresh metrics only)."""

    max_outstanding_requests: int = 256
    max_queue_waiting: float = 128


class NotSaturatedFilter(Filter, name="notSaturated"):
    """Drops saturated replicas; when none is left, marks the request ``saturated`` (a 429 with Retry-After,
    not a 503: the replicas are there, only full). Runs last, so that saturation is judged among the replicas
    the request may go to."""

    def __init__(self, limits: SaturationLimits | None = None) -> None:
        self.limits = limits or SaturationLimits()

    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        if replica.outstanding_requests >= self.limits.max_outstanding_requests:
            return False
        return replica.queue_waiting is None or replica.queue_waiting < self.limits.max_queue_waiting

    def none_left(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> str:
        request.state.saturated = True
        return f"all {len(candidates)} replicas are saturated"


class RevisionFilter(Filter, name="revision"):
    """Keeps the revision the canary split chose for this request (``request.state.revision``)."""

    def keep(self, request: RoutingRequest, replica: ReplicaSnapshot) -> bool:
        wanted = request.state.revision
        return wanted is None or replica.revision == wanted


def choose_revision(traffic: Sequence[tuple[str, float]], available: set[str], draw: float) -> str | None:
    """The revision a request goes to, given the traffic weights and a uniform draw in [0, 1).

    Weights of revisions with no available replica are dropped and the rest renormalised, so a canary whose
    pods are all down does not turn its share into errors. Returns None (no constraint) when no weight
    applies: empty traffic means every ready replica regardless of revision."""
    usable = [(rev, float(weight)) for rev, weight in traffic if weight > 0 and rev in available]
    total = sum(weight for _, weight in usable)
    if total <= 0:
        return None
    point = draw * total
    for rev, weight in usable:
        point -= weight
        if point < 0:
            return rev
    return usable[-1][0]


# --- scorers ----------------------------------------------------------------------------------------------

NEUTRAL_SCORE = 0.5  # the score of a candidate whose raw value is unknown (stale metrics)


def normalise(raw: Sequence[float | None], higher_is_better: bool) -> list[float]:
    """Min-max normalisation to [0, 1]; all equal (or all unknown) -> 1.0; unknown -> NEUTRAL_SCORE."""
    known = [value for value in raw if value is not None]
    if not known:
        return [1.0] * len(raw)
    low, high = min(known), max(known)
    scores = []
    for value in raw:
        if value is None:
            scores.append(NEUTRAL_SCORE if high > low else 1.0)
        elif high == low:
            scores.append(1.0)
        else:
            fraction = (value - low) / (high - low)
            scores.append(fraction if higher_is_better else 1.0 - fraction)
    return scores


class Scorer(Plugin):
    kind = "scorer"
    higher_is_better: ClassVar[bool] = True

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        raise NotImplementedError

    def score(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float]:
        return normalise(self.raw(request, candidates), self.higher_is_better)


def expected_load(request: RoutingRequest, replica: ReplicaSnapshot) -> int:
    """Outstanding tokens on the replica if this request went there: what it already owes plus the part of
    this prompt it would have to prefill (its cached prefix excluded). Both are tokens, so locality and load
    meet in one unit; the request's decode tokens are the same everywhere and left out."""
    uncached = max(0, request.prompt_tokens - request.prefix_match_tokens.get(replica.name, 0))
    return replica.outstanding_tokens + uncached


class OutstandingTokensScorer(Scorer, name="outstandingTokens"):
    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [float(expected_load(request, replica)) for replica in candidates]


@dataclass(frozen=True)
class HotSpotGuard:
    """Locality never piles load on one replica: a replica earns prefix credit only while its outstanding
    tokens are within ``max_ratio`` x the least-loaded candidate's plus ``slack_tokens``, and its requests in
    flight within ``max_ratio`` x the fewest plus ``slack_requests``.

    Why this shape: a popular prefix makes one replica the best match for every request that carries it; a
    pure locality score would send them all there while the others idle (the failure sglang-router's
    cache-aware policy guards with its balance thresholds). Beyond the bound the request is placed on load
    alone, which is exactly where the prefix then gets replicated - so a hot prefix spreads over as many
    replicas as its load needs. Two dimensions because a request whose prompt is cached owes few prefill
    tokens yet still occupies a decode slot for its whole output: counting tokens alone lets cheap-looking
    cached requests pile up. The slacks keep light load from flapping on small differences."""

    max_ratio: float = 1.5
    slack_tokens: int = 2048
    slack_requests: int = 4

    def bound(self, least_load: int) -> float:
        return least_load * self.max_ratio + self.slack_tokens

    def request_bound(self, fewest_requests: int) -> float:
        return fewest_requests * self.max_ratio + self.slack_requests

    def eligible(self, loads: Sequence[int], requests: Sequence[int] | None = None) -> list[bool]:
        if not loads:
            return []
        limit = self.bound(min(loads))
        if requests is None:
            return [load <= limit for load in loads]
        request_limit = self.request_bound(min(requests))
        return [load <= limit and count <= request_limit for load, count in zip(loads, requests, strict=True)]


class PrefixCacheScorer(Scorer, name="prefixCache"):
    """Prompt tokens the replica most likely still caches, with the hot-spot guard applied."""

    def __init__(self, guard: HotSpotGuard | None = None) -> None:
        self.guard = guard or HotSpotGuard()

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        eligible = self.guard.eligible(
            [replica.outstanding_tokens for replica in candidates],
            [replica.outstanding_requests for replica in candidates],
        )
        request.state.hotspot_guarded = [
            replica.name for replica, ok in zip(candidates, eligible, strict=True) if not ok
        ]
        return [
            float(request.prefix_match_tokens.get(replica.name, 0)) if ok else 0.0
            for replica, ok in zip(candidates, eligible, strict=True)
        ]


class KvCacheScorer(Scorer, name="kvCache"):
    """Free KV cache from the replica's own report (vllm:kv_cache_usage_perc, sglang:token_usage); unknown when
    stale or unreadable."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [replica.kv_usage for replica in candidates]


class QueueScorer(Scorer, name="queue"):
    """Requests waiting in the replica's scheduler (vllm:num_requests_waiting, sglang:num_queue_reqs); unknown
    when stale or unreadable."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [replica.queue_waiting for replica in candidates]


class OutstandingRequestsScorer(Scorer, name="outstandingRequests"):
    """Requests in flight (the classic least-outstanding-requests balancer), for configurations that want it."""

    higher_is_better = False

    def raw(self, request: RoutingRequest, candidates: Sequence[ReplicaSnapshot]) -> list[float | None]:
        return [float(replica.outstanding_requests) for replica in candidates]


# --- picker and pipeline ----------------------------------------------------------------------------------

TIE_EPSILON = 1e-9


def pick_max(scores: Sequence[tuple[str, float]], rng: random.Random) -> str | None:
    """The best-scored name; ties broken at random after a stable sort by name (so the draw is reproducible
    for a given seed whatever the input order)."""
    if not scores:
        return None
    ordered = sorted(scores, key=lambda item: item[0])
    best = max(score for _, score in ordered)
    tied = [name for name, score in ordered if score >= best - TIE_EPSILON]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


DEFAULT_FILTERS = ("healthy", "notEjected", "revision", "notSaturated")
# Scorer weights when a ModelDeployment gives none (spec.routing.weights uses the same keys).
# kvCache and queue read the engines' /metrics, which lag by up to a scrape interval; a router that sees all
# the traffic (alone, or sharing through Redis) knows its outstanding tokens exactly and now, and in
# bench/bench_router.py giving the scraped signals even 0.1 each raised TTFT p99 by roughly half on the shared-
# prefix and no-sharing workloads. So they default to 0: weight them where traffic bypasses the router.
# prefixCache is a tie-breaker on top of outstandingTokens, which already counts a cached prefix as prefill
# saved, in tokens: min-max normalised, the best match gets full credit however small its lead (a system prompt
# every replica will soon hold), and at weight 1 that credit piled conversations on one replica (bench-router
# multi_turn: imbalance 2.5, TTFT p99 0.32 s against 0.27 s at 0.25; shared_prefix_70: 1.00 s against 0.57 s).
# Tried and reverted: load and locality on one token scale (a cached token worth 0.25 of a token of load, no
# min-max). Open-loop hit rate rose to sglang-router's (0.784 vs 0.762) with the same TTFT p99 and tokens/s on
# shared_prefix_70, but on multi_turn one of three closed-loop rounds dipped in two full runs (1,209 and 1,018
# tok/s against ~1,400), min-max never did (bench-router, BENCH_VARIANTS, 2026-12-03).
DEFAULT_WEIGHTS: dict[str, float] = {
    "outstandingTokens": 1.0,
    "prefixCache": 0.25,
    "kvCache": 0.0,
    "queue": 0.0,
}


@dataclass
class Pipeline:
    filters: list[Filter]
    scorers: list[tuple[Scorer, float]]

    @classmethod
    def from_config(
        cls,
        weights: Mapping[str, float] | None = None,
        filters: Sequence[str] = DEFAULT_FILTERS,
        guard: HotSpotGuard | None = None,
        saturation: SaturationLimits | None = None,
    ) -> Pipeline:
        weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
        scorers: list[tuple[Scorer, float]] = []
        for name, weight in weights.items():
            if weight < 0:
                raise ValueError(f"routing weight {name!r} must be >= 0, got {weight}")
            if weight == 0:
                continue
            options: dict[str, Any] = {"guard": guard} if name == "prefixCache" and guard else {}
            scorers.append((Scorer.build(name, **options), float(weight)))  # type: ignore[arg-type]
        filter_options: dict[str, dict[str, Any]] = {"notSaturated": {"limits": saturation}}
        built = [Filter.build(name, **filter_options.get(name, {})) for name in filters]
        return cls(filters=built, scorers=scorers)  # type: ignore[arg-type]

    def decide(
        self, request: RoutingRequest, replicas: Sequence[ReplicaSnapshot], rng: random.Random
    ) -> RoutingDecision:
        candidates = list(replicas)
        for plugin in self.filters:
            kept = plugin.apply(request, candidates)
            if not kept:
                return RoutingDecision(None, {}, {}, plugin.none_left(request, candidates))
            candidates = kept
        totals = dict.fromkeys((replica.name for replica in candidates), 0.0)
        breakdown: dict[str, dict[str, float]] = {}
        for scorer, weight in self.scorers:
            scores = scorer.score(request, candidates)
            breakdown[scorer.name] = {
                replica.name: score for replica, score in zip(candidates, scores, strict=True)
            }
            for replica, score in zip(candidates, scores, strict=True):
                totals[replica.name] += weight * score
        chosen_name = pick_max(list(totals.items()), rng)
        chosen = next(replica for replica in candidates if replica.name == chosen_name)
        parts = ", ".join(f"{name}={values[chosen.name]:.2f}" for name, values in breakdown.items())
        reason = f"{chosen.name} scored {totals[chosen.name]:.3f} of {len(candidates)} candidates ({parts})"
        return RoutingDecision(chosen, totals, breakdown, reason)
