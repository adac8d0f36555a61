"""The routing framework: the data a decision reads and writes, and the interfaces its plug-ins implement.

Shaped after kube-scheduler's framework interface and the Gateway API Inference Extension's scheduling
framework: a ``Filter`` keeps or drops each candidate replica; a ``Scorer`` rates the candidates left, its raw
values normalised min-max (``normalise``) before the pipeline (``core.Pipeline``) weighs them. Both register
under a configuration name by subclassing (``class HealthyFilter(Filter, name="healthy")``); the built-in
plug-ins live one per file in ``plugins/``. What one stage tells the next travels in the request's typed
``RequestState``, never in an untyped dict.
"""

from __future__ import annotations

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
    # KV tokens the requests in flight there hold (router-counted, shared prefixes once), and the replica's KV
    # capacity in tokens as its /metrics reported it (None: not reported, so nothing is judged against it).
    kv_held_tokens: float = 0.0
    kv_capacity_tokens: int | None = None
    # Requests the replica runs at once, learned from its /metrics (RouterState.record_stats); None: not seen.
    concurrency: int | None = None
    # Its configured batch size (--max-num-seqs in the ModelDeployment's engine args, --engine-max-num-seqs for
    # static backends); None: not configured. Known before any request, unlike the learned cap.
    batch_size: int | None = None
    # The most requests any replica of the fleet was scraped running at once (0: none scraped yet): what the
    # engines have shown they start without queueing, where no cap is confirmed (free_slot.shown_to_start).
    running_seen: int = 0


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
    # KvFitsFilter found the request's new KV blocks fit on no candidate: every replica was kept.
    fits_nowhere: bool = False


@dataclass
class RoutingRequest:
    """One request as the decision sees it. ``prefix_match_tokens`` maps replica name to the prompt tokens
    that replica most likely still caches (looked up in the prefix index by the caller)."""

    model: str
    prompt_tokens: int
    expected_output_tokens: int  # of all its answers
    prefix_match_tokens: Mapping[str, int] = field(default_factory=dict)
    state: RequestState = field(default_factory=RequestState)
    # replica name -> KV tokens the request would add there beside the requests in flight (its blocks none of
    # them holds, and its private ones); a replica missing here is not judged on memory.
    kv_new_tokens: Mapping[str, float] = field(default_factory=dict)
    samples: int = 1  # its ``n``: the sequences it runs, each a place in the replica's batch


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
