"""Autoscaler benchmark: tokenyard's policy against HPA, KEDA and Knative-style policies on one trace.

Every policy drives the same simulated fleet through the same trace -- a diurnal curve with a slow ramp and
sudden bursts of long-prompt requests -- in simulated time, far faster than real time. The fleet is a fluid
model of vLLM engine groups whose step times come from ``tokenyard.sim.model`` (Llama-3.1-8B on one L40S
per group, where the KV cache fills before compute runs out -- the regime the autoscaler is built for):

- a global FIFO queue (the router holds requests until a group has a free sequence slot and KV room);
- each ready group runs up to vLLM's 256 sequences within its KV capacity; every tick it spends its time first
  on prefill (prompt tokens x the model's per-token prefill cost), then on decode steps whose duration is the
  model's step time at the current batch and context; sequences finish at the rate their output lengths imply
  (a fluid approximation: fractional requests, exponential-like departures);
- a new group serves ``COLD_START_S`` after it is asked for (model load); a removed group keeps costing its
  GPUs until its pods are deleted: when its last request ends (less than one left, in the fluid model) or at
  ``DRAIN_TIMEOUT_S``, whichever comes first; requests still running then are cut off and count as misses.

Fair tuning: each policy has one main knob (its target). For each policy the knob is swept over a grid on a
*tuning* trace (another random seed of the same shape), and the setting that meets the TTFT SLO for at least
``TUNE_SLO_FLOOR`` of the requests with the fewest GPU-hours is kept (the highest attainment if none meets it).
The chosen settings then run on the evaluation trace. Everything else is each system's documented default:
HPA's tolerance 0.1, 300 s scale-down stabilisation, 4 pods or 100% per 15 s up, 100% per 15 s down, a 15 s
sync period (Kubernetes HPA docs); KEDA feeds the HPA an external metric as AverageValue (KEDA docs, scalers);
Knative's KPA averages concurrency over a 60 s stable window and a 6 s panic window, panics at 200%, scales
down at most by half per decision and decides every 2 s (Knative autoscaling docs, config-autoscaler defaults).
All policies see the same cold start, the same bounds, and metrics every 5 s (Knative: every 1 s, as its
queue-proxy reports).

tokenyard runs its policy (``tokenyard.autoscaler.policy``) on three signals: token load (tokens waiting plus
tokens running: queued prompt tokens and KV-occupied tokens, the ``TokenLoad`` kind), KV-cache usage (target 0.9,
a guard) and TTFT p95 against the SLO; it knows the cold start. Its one knob, swept the same way, is the
token-load target per group, as a fraction of a group's KV capacity (six points, as HPA's and Knative's grids).

Run: ``make bench-autoscaler`` (or ``BENCH_QUICK=1`` for a 2-hour trace and smaller grids).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for component in ("autoscaler", "sim", "core"):
    sys.path.insert(0, str(ROOT / component))

from tokenyard.autoscaler.policy import (  # noqa: E402
    Observation,
    Policy,
    PolicyConfig,
    RateLimit,
    SampleWindow,
    SignalKind,
    SignalSpec,
)
from tokenyard.sim.model import Deployment, StepShape, gpu_preset, model_preset  # noqa: E402

QUICK = os.environ.get("BENCH_QUICK") == "1"
HOURS = 2.0 if QUICK else 6.0
DT = 1.0  # simulation tick, seconds
METRICS_EVERY_S = 5.0
COLD_START_S = 120.0
# A removed group's pods are deleted when its last request ends or when the drain timeout passes, whichever
# comes first (Kubernetes' default termination grace period, and tokenyard's rollout.drainSeconds default);
# until then it costs its GPUs. What is still running at the timeout is cut off and counts as a miss.
DRAIN_TIMEOUT_S = 30.0
TTFT_SLO_S = 1.5
MIN_GROUPS, MAX_GROUPS = 1, 24
TUNE_SLO_FLOOR = 0.99
GPUS_PER_GROUP = 1
DEPLOYMENT = Deployment(model_preset("llama-3.1-8b"), gpu_preset("l40s"), tp=GPUS_PER_GROUP)
PREFILL_S_PER_TOKEN = DEPLOYMENT.prefill_step_seconds(2048) / 2048
KV_CAPACITY_TOKENS = DEPLOYMENT.kv_capacity_tokens * 0.95  # vLLM keeps a few blocks free


@dataclass(frozen=True)
class RequestClass:
    name: str
    prompt_tokens: int
    output_tokens: int


CHAT = RequestClass("chat", 1000, 600)
RAG = RequestClass("rag", 6000, 400)
CODE = RequestClass("codegen", 500, 1500)
CLASSES = (CHAT, RAG, CODE)


# ---------------------------------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class Burst:
    start_s: float
    duration_s: float
    extra_rps: float  # added request rate, all long-prompt (a batch job, a RAG re-index...)


@dataclass(frozen=True)
class Trace:
    hours: float
    base_rps: float
    bursts: tuple[Burst, ...]
    seed: int

    def mix(self, t: float) -> dict[RequestClass, float]:
        """Request rate per class at time t: a diurnal curve (one simulated day squeezed into the trace), a slow
        ramp in the last third and the bursts. The mix drifts too: long prompts are a larger share at night."""
        span = self.hours * 3600
        phase = t / span
        diurnal = 0.35 + 0.65 * (0.5 - 0.5 * math.cos(2 * math.pi * phase))  # low, peak mid-trace, low
        ramp = 1.0 + 0.6 * max(0.0, (phase - 0.66) / 0.34)  # a slow 60% ramp over the last third
        rps = self.base_rps * diurnal * ramp
        rag_share = 0.35 - 0.2 * diurnal  # 30% at night, 15% at the peak
        rates = {CHAT: rps * (0.75 - rag_share), RAG: rps * rag_share, CODE: rps * 0.25}
        for burst in self.bursts:
            if burst.start_s <= t < burst.start_s + burst.duration_s:
                rates[RAG] += burst.extra_rps
        return rates


def make_trace(seed: int, base_rps: float) -> Trace:
    rng = random.Random(seed)
    span = HOURS * 3600
    count = 2 if QUICK else 5
    bursts = []
    for i in range(count):
        # Spread bursts over the trace, each at a random point in its own slot.
        slot = span / count
        start = i * slot + rng.uniform(0.15, 0.6) * slot
        bursts.append(Burst(start, rng.uniform(300, 900), base_rps * rng.uniform(0.25, 0.5)))
    return Trace(HOURS, base_rps, tuple(bursts), seed)


def work_seconds(cls: RequestClass, batch: int = 128) -> float:
    """Group-seconds one request costs at a full batch: its prefill and its share of the decode steps."""
    context = cls.prompt_tokens + cls.output_tokens // 2
    step = DEPLOYMENT.decode_step_seconds(batch, context)
    return cls.prompt_tokens * PREFILL_S_PER_TOKEN + cls.output_tokens * step / batch


# ---------------------------------------------------------------------------------------------- the fleet
@dataclass
class Group:
    ready_at: float
    running: dict[RequestClass, float] = field(default_factory=lambda: {c: 0.0 for c in CLASSES})
    prefill_debt_s: float = 0.0
    draining: bool = False
    draining_since: float = 0.0

    def seqs(self) -> float:
        return sum(self.running.values())

    def kv_tokens(self) -> float:
        # On average a running sequence holds its prompt and half its output.
        return sum(n * (c.prompt_tokens + c.output_tokens / 2) for c, n in self.running.items())


@dataclass
class Queued:
    arrived: float
    cls: RequestClass
    count: float


@dataclass
class Stats:
    requests: float = 0.0
    met_slo: float = 0.0
    cut_off: float = 0.0  # requests still running on a removed group at its drain timeout
    gpu_seconds: float = 0.0
    scale_actions: int = 0
    burst_recovery_s: list[float] = field(default_factory=list)


class Fleet:
    def __init__(self, initial_groups: int) -> None:
        self.groups = [Group(ready_at=-1.0) for _ in range(initial_groups)]
        self.queue: deque[Queued] = deque()
        self.kv_capacity = KV_CAPACITY_TOKENS
        self.ttft_recent: deque[tuple[float, float, float]] = deque()  # (t, ttft, count)
        self.arrivals_recent: deque[tuple[float, float]] = deque()

    def active(self) -> list[Group]:
        return [g for g in self.groups if not g.draining]

    def ready(self, now: float) -> list[Group]:
        return [g for g in self.groups if not g.draining and g.ready_at <= now]

    def scale_to(self, desired: int, now: float) -> None:
        active = self.active()
        if desired > len(active):
            self.groups += [Group(ready_at=now + COLD_START_S) for _ in range(desired - len(active))]
        elif desired < len(active):
            # Remove groups still loading first, then the least busy ready ones; those drain.
            victims = sorted(active, key=lambda g: (g.ready_at <= now, g.seqs()))[: len(active) - desired]
            for g in victims:
                if g.ready_at > now:
                    self.groups.remove(g)
                else:
                    g.draining, g.draining_since = True, now

    def tick(self, now: float, rates: dict[RequestClass, float], rng: random.Random, stats: Stats) -> None:
        for cls, rate in rates.items():
            mean = rate * DT
            count = max(0.0, rng.gauss(mean, math.sqrt(mean))) if mean > 0 else 0.0  # Poisson-like noise
            if count > 0:
                self.queue.append(Queued(now, cls, count))
                self.arrivals_recent.append((now, count))
                stats.requests += count
        self._admit(now, stats)
        for g in list(self.groups):
            if g.ready_at <= now:
                self._run(g)
            # A fluid group is empty when less than one request is left in it (the fraction would otherwise
            # decay for minutes and be billed all along).
            if g.draining and (g.seqs() < 1.0 or now - g.draining_since >= DRAIN_TIMEOUT_S):
                cut_off = g.seqs()
                stats.cut_off += cut_off
                stats.met_slo = max(0.0, stats.met_slo - cut_off)
                self.groups.remove(g)
        stats.gpu_seconds += len(self.groups) * GPUS_PER_GROUP * DT

    def _admit(self, now: float, stats: Stats) -> None:
        ready = self.ready(now)
        while self.queue and ready:
            head = self.queue[0]
            need_kv = head.cls.prompt_tokens + head.cls.output_tokens / 2
            rooms = [
                (g, min(DEPLOYMENT.max_num_seqs - g.seqs(), (self.kv_capacity - g.kv_tokens()) / need_kv))
                for g in ready
            ]
            rooms = [(g, room) for g, room in rooms if room > 1e-3]
            total_room = sum(room for _, room in rooms)
            if total_room < 1e-3:
                return
            take = min(total_room, head.count)
            # The router spreads a tick's arrivals over the groups with room, in proportion to that room
            # (a fluid stand-in for least-outstanding-work routing).
            prefill_s = head.cls.prompt_tokens * PREFILL_S_PER_TOKEN
            debt_before = sum(g.prefill_debt_s * room for g, room in rooms) / total_room
            for g, room in rooms:
                share = take * room / total_room
                g.running[head.cls] += share
                g.prefill_debt_s += share * prefill_s
            # Requests of one chunk that land on the same group queue behind each other for prefill.
            per_group = take / len(rooms)
            ttft = now - head.arrived + debt_before + prefill_s * (1 + max(0.0, per_group - 1) / 2)
            self.ttft_recent.append((now, ttft, take))
            if ttft <= TTFT_SLO_S:
                stats.met_slo += take
            head.count -= take
            if head.count < 1e-6:
                self.queue.popleft()

    def _run(self, g: Group) -> None:
        """One tick of a group: prefill first, then decode steps."""
        budget = DT
        spent = min(g.prefill_debt_s, budget)
        g.prefill_debt_s -= spent
        budget -= spent
        batch = g.seqs()
        if batch < 1e-6 or budget <= 0:
            return
        pairs = sum(n * (c.prompt_tokens + c.output_tokens / 2) for c, n in g.running.items())
        step = DEPLOYMENT.step_seconds(
            StepShape(max(1, round(batch)), max(1, round(batch)), int(pairs), int(pairs))
        )
        steps = budget / step
        for c, n in g.running.items():
            g.running[c] = n * max(0.0, 1.0 - steps / c.output_tokens)

    # --- what Prometheus (or Knative's queue-proxy) would report ----------------------------------------
    def metrics(self, now: float) -> dict[str, float | None]:
        ready = self.ready(now)
        while self.ttft_recent and now - self.ttft_recent[0][0] > 60:
            self.ttft_recent.popleft()
        while self.arrivals_recent and now - self.arrivals_recent[0][0] > 60:
            self.arrivals_recent.popleft()
        waiting = sum(q.count for q in self.queue)
        queued_tokens = sum(q.count * q.cls.prompt_tokens for q in self.queue)
        kv = sum(g.kv_tokens() for g in ready) / (self.kv_capacity * len(ready)) if ready else None
        running = sum(g.seqs() for g in ready)
        return {
            "waiting": waiting,
            "kv": kv,
            "ttft_p95": _p95(self.ttft_recent),
            "rps": sum(c for _, c in self.arrivals_recent) / 60.0,
            "concurrency": waiting + running,
            # Tokens waiting plus tokens running (KV-occupied) on the ready groups: TokenLoad's reading.
            "tokens_in_system": queued_tokens + sum(g.kv_tokens() for g in ready),
        }


def _p95(entries) -> float | None:
    """p95 of the TTFTs of the last minute's first tokens (histogram_quantile over rate(...[1m]))."""
    total = sum(c for _, _, c in entries)
    if total <= 0:
        return None
    seen = 0.0
    for _, ttft, count in sorted(entries, key=lambda e: e[1]):
        seen += count
        if seen >= 0.95 * total:
            return ttft
    return None


# ---------------------------------------------------------------------------------------------- policies
class Autoscaler:
    name = ""
    decide_every_s = 15.0
    sample_every_s = METRICS_EVERY_S

    def observe(self, now: float, metrics: dict[str, float | None]) -> None:
        raise NotImplementedError

    def decide(self, now: float, current: int, ready: int, pending: int) -> int:
        raise NotImplementedError


class TokenyardPolicy(Autoscaler):
    name = "tokenyard"

    # The fleet's metric behind each signal (what the default PromQL reads from vLLM's metrics).
    READS = {"token_load": "tokens_in_system", "kv": "kv", "ttft_p95": "ttft_p95"}

    def __init__(self, token_load_fraction: float, kv_target: float = 0.9, **policy_overrides) -> None:
        self.knob = f"token load target={token_load_fraction:g} x KV"
        signals = (
            # Tokens waiting plus running per group, against a share of a group's KV capacity: demand in the
            # unit that fills a group, which keeps counting (in the queue) when capacity runs short.
            SignalSpec("token_load", SignalKind.TOKEN_LOAD, token_load_fraction * KV_CAPACITY_TOKENS),
            # KV occupancy as a guard: the cache must not fill (preemption and recomputation follow).
            SignalSpec("kv", SignalKind.KV_CACHE_USAGE, kv_target),
            SignalSpec("ttft_p95", SignalKind.TTFT_P95, TTFT_SLO_S),
        )
        # Settings besides the defaults (chosen on the tuning trace, kept for every grid point): act on the first
        # decision that asks for more (the stable window and tolerance already filter noise), and release up to
        # two groups a minute after the stabilisation window.
        settings = dict(
            scale_up_consecutive=1, scale_down_limit=RateLimit(groups=2, percent=0.0, period_seconds=60)
        )
        settings.update(policy_overrides)
        self.policy = Policy(
            PolicyConfig(
                signals=signals,
                min_groups=MIN_GROUPS,
                max_groups=MAX_GROUPS,
                cold_start_seconds=COLD_START_S,
                **settings,
            )
        )
        self.window = SampleWindow(self.policy.config.history_seconds)

    def observe(self, now, metrics):
        for signal, metric in self.READS.items():
            self.window.add(signal, now, metrics[metric])

    def decide(self, now, current, ready, pending):
        return self.policy.decide(Observation(now, current, ready, pending, self.window.snapshot())).desired


class HpaPolicy(Autoscaler):
    """The Kubernetes HPA's algorithm (pkg/controller/podautoscaler) on one metric, with default behaviour."""

    def __init__(self, name: str, metric: str, target: float, per_ready_group: bool) -> None:
        self.name, self.metric, self.target, self.per_ready_group = name, metric, target, per_ready_group
        self.knob = f"{metric} target={target:g}"
        self.value: float | None = None
        self.recommendations: deque[tuple[float, int]] = deque()
        self.steps: deque[tuple[float, int, int]] = deque()

    def observe(self, now, metrics):
        self.value = metrics[self.metric]

    def decide(self, now, current, ready, pending):
        """Held to the HPA's documentation and source by tests/unit/bench/test_autoscaler_baselines.py."""
        if self.value is None:
            return current
        if self.per_ready_group:  # a per-pod average ("Pods" metric): ratio x ready pods
            ratio = self.value / max(ready, 1) / self.target
            wanted = current if abs(ratio - 1) <= 0.1 else math.ceil(ratio * max(ready, 1))
            if ratio > 1.1 and ready < current:
                # Pods not ready yet count as using 0% of the target before a scale-up; if that reverses the
                # direction or lands within the tolerance, nothing changes (replica_calculator.go).
                ratio = self.value / current / self.target
                wanted = current if ratio <= 1.1 else math.ceil(ratio * current)
        else:  # KEDA's external metric as AverageValue: ceil(total / target)
            ratio = self.value / (self.target * max(current, 1))
            wanted = current if abs(ratio - 1) <= 0.1 else math.ceil(self.value / self.target)
        wanted = min(max(wanted, MIN_GROUPS), MAX_GROUPS)
        self.recommendations.append((now, wanted))
        while now - self.recommendations[0][0] >= 300:  # kept only while after now - 300 s
            self.recommendations.popleft()
        while self.steps and now - self.steps[0][0] >= 15:
            self.steps.popleft()
        if wanted < current:
            # scale-down stabilisation: the highest recommendation of the window, never above the current count
            wanted = min(current, max(r for _, r in self.recommendations))
        elif wanted > current:
            # default scale-up policies: 4 pods or 100% per 15 s, whichever allows more, counted from the
            # replicas at the start of the period
            start = current - sum(a - b for _, b, a in self.steps)
            wanted = min(wanted, max(start + 4, 2 * start))
        if wanted != current:
            self.steps.append((now, current, wanted))
        return wanted


class KnativePolicy(Autoscaler):
    """Knative's KPA (pkg/autoscaler/scaling/autoscaler.go) on in-flight requests per group."""

    name = "knative_concurrency"
    decide_every_s = 2.0
    sample_every_s = 1.0

    def __init__(self, target: float) -> None:
        self.target = target  # already multiplied by the target utilisation
        self.knob = f"concurrency target={target:g}"
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.max_panic = 0

    def observe(self, now, metrics):
        self.samples.append((now, metrics["concurrency"]))
        while now - self.samples[0][0] >= 60:
            self.samples.popleft()

    def decide(self, now, current, ready, pending):
        if not self.samples:
            return current
        stable = sum(v for _, v in self.samples) / len(self.samples)
        recent = [v for t, v in self.samples if now - t < 6]
        panic = sum(recent) / len(recent) if recent else stable
        ready = max(ready, 1)
        want_stable = math.ceil(stable / self.target)
        want_panic = math.ceil(panic / self.target)
        if want_panic / ready >= 2.0:
            if self.panic_since is None:
                self.max_panic = ready  # the panic's floor starts at the ready pods
            self.panic_since = now
        elif self.panic_since is not None and now - self.panic_since > 60:
            self.panic_since, self.max_panic = None, 0
        if self.panic_since is not None:
            # never below the highest count decided during this panic (autoscaler.go maxPanicPods)
            want = max(want_panic, want_stable, self.max_panic)
            self.max_panic = want
        else:
            want = want_stable
        want = min(want, 1000 * ready)  # max-scale-up-rate
        want = max(want, math.floor(ready / 2.0))  # max-scale-down-rate 2.0
        return min(max(want, MIN_GROUPS), MAX_GROUPS)


# ---------------------------------------------------------------------------------------------- one run
def run(policy: Autoscaler, trace: Trace) -> dict:
    rng = random.Random(trace.seed * 7919 + 1)
    fleet = Fleet(initial_groups=2)
    stats = Stats()
    next_sample = next_decision = 0.0
    burst_pending = {b.start_s: b for b in trace.bursts}
    watching: list[Burst] = []
    span = trace.hours * 3600
    now = 0.0
    while now < span:
        rates = trace.mix(now)
        fleet.tick(now, rates, rng, stats)
        if now >= next_sample:
            policy.observe(now, fleet.metrics(now))
            next_sample += policy.sample_every_s
        if now >= next_decision:
            active = fleet.active()
            ready = len(fleet.ready(now))
            desired = policy.decide(now, len(active), ready, len(active) - ready)
            if desired != len(active):
                stats.scale_actions += 1
                fleet.scale_to(desired, now)
            next_decision += policy.decide_every_s
        # Burst recovery: from a burst's start until the ready groups can carry the offered work.
        for start in [s for s in burst_pending if s <= now]:
            watching.append(burst_pending.pop(start))
        offered = sum(rate * work_seconds(c) for c, rate in rates.items())  # group-seconds per second
        for burst in list(watching):
            if len(fleet.ready(now)) >= offered or now >= burst.start_s + burst.duration_s:
                stats.burst_recovery_s.append(now - burst.start_s)
                watching.remove(burst)
        now += DT
    # Requests still queued at the end count as misses: they are in `requests`, not in `met_slo`.
    return {
        "slo_attainment": round(stats.met_slo / stats.requests, 4) if stats.requests else 0.0,
        "gpu_hours": round(stats.gpu_seconds / 3600, 2),
        "cut_off_requests": round(stats.cut_off, 1),
        "scale_actions": stats.scale_actions,
        "worst_burst_recovery_s": round(max(stats.burst_recovery_s, default=0.0), 1),
    }


def per_group_rps() -> float:
    """Requests per second one group serves at full use with the average mix (the knobs' unit)."""
    return 1.0 / sum(work_seconds(c) * w for c, w in ((CHAT, 0.5), (RAG, 0.25), (CODE, 0.25)))


def candidates() -> dict[str, list]:
    """Each policy's knob grid, in each metric's natural unit, spanning under- to over-provisioning."""
    # Wide enough that every policy's best point lies inside its grid (the bench says when one sits on an edge).
    fractions = (
        (0.05, 0.1, 0.2, 0.5, 0.9) if QUICK else (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    )
    # Busy sequences per group at full use (Little's law over the mix), Knative's concurrency unit.
    seqs_at_capacity = per_group_rps() * sum(
        w * c.output_tokens * DEPLOYMENT.decode_step_seconds(128, c.prompt_tokens + c.output_tokens // 2)
        for c, w in ((CHAT, 0.5), (RAG, 0.25), (CODE, 0.25))
    )
    return {
        # Token load per group as a share of a group's KV capacity. The TTFT SLO, not the cache, binds first
        # (a group whose cache is a fifth full already queues prefills), so the grid sits lower than the
        # fractions of compute capacity above.
        "tokenyard": [
            (lambda f=f: TokenyardPolicy(f))
            for f in ((0.05, 0.1, 0.15, 0.3) if QUICK else (0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4))
        ],
        "hpa_rps": [
            (lambda f=f: HpaPolicy("hpa_rps", "rps", per_group_rps() * f, per_ready_group=False))
            for f in fractions
        ],
        "keda_queue": [
            (lambda w=w: HpaPolicy("keda_queue", "waiting", w, per_ready_group=False))
            for w in ((0.5, 2, 8, 32) if QUICK else (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64))
        ],
        "knative_concurrency": [(lambda f=f: KnativePolicy(round(seqs_at_capacity * f))) for f in fractions],
    }


def main() -> None:
    started = time.monotonic()
    base_rps = 9.0 * per_group_rps()  # the diurnal peak needs about 9 groups before bursts and the ramp
    tuning, evaluation = make_trace(seed=11, base_rps=base_rps), make_trace(seed=29, base_rps=base_rps)
    print(
        f"trace: {HOURS:g} simulated hours, peak {base_rps:.1f} req/s plus bursts, "
        f"{len(evaluation.bursts)} bursts; model {DEPLOYMENT.model.name} on {GPUS_PER_GROUP} x "
        f"{DEPLOYMENT.gpu.name} per group; cold start {COLD_START_S:.0f} s; TTFT SLO {TTFT_SLO_S} s"
    )
    results, chosen = {}, {}
    for name, makers in candidates().items():
        tuned = []
        for make in makers:
            policy = make()
            tuned.append((run(policy, tuning), policy.knob, make))
        meeting = [t for t in tuned if t[0]["slo_attainment"] >= TUNE_SLO_FLOOR]
        best = (
            min(meeting, key=lambda t: t[0]["gpu_hours"])
            if meeting
            else max(tuned, key=lambda t: t[0]["slo_attainment"])
        )
        chosen[name] = best[1]
        results[name] = run(best[2](), evaluation)
        position = [t[1] for t in tuned].index(best[1])
        edge = " -- ON THE GRID'S EDGE: widen it" if position in (0, len(tuned) - 1) else ""
        print(f"  tuned {name:<20} {best[1]:<28} (tuning trace: {best[0]}){edge}", flush=True)
    print()
    print(f"{'policy':<21}{'setting':<28}{'SLO met':>9}{'GPU-hours':>11}{'actions':>9}{'worst burst s':>15}")
    for name, r in results.items():
        print(
            f"{name:<21}{chosen[name]:<28}{r['slo_attainment']:>9.2%}{r['gpu_hours']:>11.1f}"
            f"{r['scale_actions']:>9}{r['worst_burst_recovery_s']:>15.0f}"
        )
    baselines = {k: v for k, v in results.items() if k != "tokenyard"}
    best_base = max(baselines.values(), key=lambda r: (r["slo_attainment"], -r["gpu_hours"]))
    ours = results["tokenyard"]
    verdict = (
        "met"
        if (
            ours["slo_attainment"] >= best_base["slo_attainment"]
            and ours["gpu_hours"] <= best_base["gpu_hours"]
        )
        or (
            ours["slo_attainment"] > best_base["slo_attainment"]
            and ours["gpu_hours"] <= best_base["gpu_hours"] * 1.02
        )
        else "not met"
    )
    print(
        f"\ntarget (SLO at least the best baseline's with fewer GPU-hours, or more with the same): {verdict}; "
        f"wall time {time.monotonic() - started:.0f} s"
    )
    print(json.dumps({"bench": "autoscaler", "results": results}))


if __name__ == "__main__":
    main()
