"""The pure part of bench/chaos_serving.py: what one client request's record says about how it ended, the
figures of one trial, a scenario's summary over its trials, the pass/fail verdict and the table. No I/O, no
clocks: the harness records times, this module only reads them (and tests/unit/bench tests it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_operator import fmt, percentile  # noqa: E402

OK = "ok"
CUT_MID_STREAM = "cut_mid_stream"  # the status line (200) had arrived, the stream ended before `data: [DONE]`
FAILED_BEFORE_STREAM = "failed_before_stream"  # no 200 status line, after the client's one retry
STALL_SECONDS = 2.0  # a wait this long for the next byte of an answer is a stall the client notices


@dataclass
class RequestRecord:
    """One client request as the load generator saw it (times are monotonic seconds)."""

    router: str  # the router the client sent it to first
    started: float
    attempts: int = 0  # 2 when the client retried (a connection error or a 503 before the status line)
    status: int | None = None  # the final answer's HTTP status; None when no answer came
    headers_at: float | None = None
    ended_at: float | None = None
    replica: str = ""  # x-tokenyard-replica: the engine the router chose
    token_events: int = 0
    done: bool = False  # `data: [DONE]` arrived
    max_wait_s: float = 0.0  # the longest the client waited for its next byte, from sending to the end
    error: str = ""

    @property
    def outcome(self) -> str:
        if self.status == 200:
            return OK if self.done else CUT_MID_STREAM
        return FAILED_BEFORE_STREAM

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    @property
    def stalled(self) -> bool:
        return self.max_wait_s >= STALL_SECONDS


@dataclass(frozen=True)
class Scenario:
    name: str
    # Outcomes that must not occur at all in this scenario: failed-before-stream always (the client retries and
    # the routers retry on another replica); cut streams where nothing that streamed went away.
    zero_outcomes: tuple[str, ...]
    # The times a trial measures (seconds), in table order; a trial whose time never came (None) fails.
    times: tuple[str, ...]


@dataclass
class Trial:
    fault_at_s: float  # when the fault was injected, seconds after the load began
    records: list[RequestRecord] = field(default_factory=list)
    times: dict[str, float | None] = field(default_factory=dict)
    # Accounting left once the load stopped and settled: outstanding tokens and requests as the surviving
    # routers' metrics report them, and as the load hashes in Redis hold them (see chaos_serving's docstring).
    drift_tokens: int = 0
    drift_requests: int = 0
    # Routing quality per phase (baseline, outage, after): when each phase began and ended (monotonic), and
    # the engines' prefix-cache hit and query tokens over it.
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    cache_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # scenario-specific counts, summed over the trials
    notes: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.records if r.outcome == outcome)


def error_kinds(records: list[RequestRecord], limit: int = 5) -> dict[str, int]:
    """The most frequent errors of the requests that did not end well, by their first 120 characters."""
    kinds: dict[str, int] = {}
    for r in records:
        if r.outcome != OK:
            kind = (r.error or f"status {r.status}")[:120]
            kinds[kind] = kinds.get(kind, 0) + 1
    return dict(sorted(kinds.items(), key=lambda item: -item[1])[:limit])


def in_window(record: RequestRecord, window: tuple[float, float]) -> bool:
    return window[0] <= record.started < window[1]


def imbalance(records: list[RequestRecord]) -> float | None:
    """The busiest replica's share of the answered requests over the mean share (1.0: an even spread)."""
    per_replica: dict[str, int] = {}
    for r in records:
        if r.replica:
            per_replica[r.replica] = per_replica.get(r.replica, 0) + 1
    if not per_replica:
        return None
    return max(per_replica.values()) / (sum(per_replica.values()) / len(per_replica))


def hit_rate(hits_and_queries: list[tuple[float, float]]) -> float | None:
    hits = sum(h for h, _ in hits_and_queries)
    queries = sum(q for _, q in hits_and_queries)
    return hits / queries if queries > 0 else None


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(scenario: Scenario, trials: list[Trial]) -> dict:
    records = [r for t in trials for r in t.records]
    summary: dict = {
        "trials": len(trials),
        "requests": len(records),
        "ok": sum(1 for r in records if r.outcome == OK),
        "failed_before_stream": sum(1 for r in records if r.outcome == FAILED_BEFORE_STREAM),
        "cut_mid_stream": sum(1 for r in records if r.outcome == CUT_MID_STREAM),
        "retried": sum(1 for r in records if r.retried),
        "stalled": sum(1 for r in records if r.stalled),
        "max_wait_seconds": _rounded(max((r.max_wait_s for r in records), default=None), 2),
        "drift_tokens": sum(abs(t.drift_tokens) for t in trials),
        "drift_requests": sum(abs(t.drift_requests) for t in trials),
        "must_be_zero": ["failed_before_stream", "drift_tokens", "drift_requests", *scenario.zero_outcomes],
        "fault_at_seconds": [round(t.fault_at_s, 2) for t in trials],
    }
    for name in scenario.times:
        values = [t.times[name] for t in trials if t.times.get(name) is not None]
        summary[f"{name}_p50_seconds"] = _rounded(percentile(values, 0.5), 2)
        summary[f"{name}_max_seconds"] = _rounded(max(values), 2) if values else None
        summary[f"{name}_missing"] = len(trials) - len(values)
    for phase in dict.fromkeys(phase for t in trials for phase in t.phases):  # in the order they happened
        summary[f"prefix_hit_rate_{phase}"] = _rounded(
            hit_rate([t.cache_tokens[phase] for t in trials if phase in t.cache_tokens])
        )
        in_phase = [
            r for t in trials if phase in t.phases for r in t.records if in_window(r, t.phases[phase])
        ]
        summary[f"imbalance_{phase}"] = _rounded(imbalance(in_phase), 2)
    errors = error_kinds(records)
    if errors:
        summary["errors"] = errors
    for name in dict.fromkeys(name for t in trials for name in t.counts):
        summary[name] = sum(t.counts.get(name, 0) for t in trials)
    notes = [note for t in trials for note in t.notes]
    if notes:
        summary["notes"] = notes
    return summary


def violations(scenario: Scenario, summary: dict) -> list[str]:
    """What breaks the pass verdict: a must-be-zero quantity that is not zero, or a time that never came."""
    found = [
        f"{scenario.name}: {name} = {summary[name]} (must be 0)"
        for name in summary["must_be_zero"]
        if summary[name]
    ]
    found += [
        f"{scenario.name}: {name} never happened in {summary[f'{name}_missing']} trial(s)"
        for name in scenario.times
        if summary[f"{name}_missing"]
    ]
    return found


def table(scenarios: list[Scenario], results: dict[str, dict]) -> list[str]:
    """One row per scenario: trials, requests, outcomes, drift and each measured time's p50/max."""
    header = ("scenario", "trials", "requests", "failed-before-stream", "cut-mid-stream", "retried",
              "stalled", "drift tok/req", "times p50/max s", "verdict")  # fmt: skip
    rows = []
    for scenario in scenarios:
        r = results[scenario.name]
        times = ", ".join(
            f"{name} {fmt(r[f'{name}_p50_seconds'])}/{fmt(r[f'{name}_max_seconds'])}"
            for name in scenario.times
        )
        rows.append(
            (
                scenario.name,
                r["trials"],
                r["requests"],
                r["failed_before_stream"],
                r["cut_mid_stream"]
                if CUT_MID_STREAM in scenario.zero_outcomes
                else f"{r['cut_mid_stream']} (exp)",
                r["retried"],
                r["stalled"],
                f"{r['drift_tokens']}/{r['drift_requests']}",
                times,
                "FAIL" if violations(scenario, r) else "pass",
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    return [
        "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def quality_lines(results: dict[str, dict]) -> list[str]:
    """Routing quality by phase, for the scenarios that measured it."""
    lines = []
    for name, r in results.items():
        phases = [key.removeprefix("prefix_hit_rate_") for key in r if key.startswith("prefix_hit_rate_")]
        if phases:
            hit_rates = " / ".join(fmt(r[f"prefix_hit_rate_{p}"]) for p in phases)
            spreads = " / ".join(fmt(r[f"imbalance_{p}"]) for p in phases)
            lines.append(
                f"{name} routing quality ({' / '.join(phases)}): engine prefix-cache hit rate {hit_rates}; "
                f"busiest engine's requests over the mean {spreads}"
            )
    return lines
