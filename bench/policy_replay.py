"""Placement alone, in modelled time: round robin against tokenyard's load score on unique, equal-length prompts
(bench-router's no_sharing), with the simulator's engines driven step by step and no router process, no hop and
no CPU shared with anything. A diagnostic, not a benchmark of the shipped router: it says whether a TTFT gap seen
in `make bench-router` comes from where requests are placed or from the router's process on the machine.

The load score is `plugins.outstanding_tokens.expected_load` as shipped (the miss penalty included) on the
shipped `accounting.LoadLedger`: each replica owes the uncached prompt tokens of its requests until their first
token, less what it has likely prefilled since the oldest of them was sent (at the prefill rate the ledger
measured), and their output tokens until streamed; a request goes to the replica owing least with its own prompt
added, ties drawn at random. That is the router with ``--prefill-progress`` (opt-in); ``load_score_no_progress``
is the same score on the whole debt, the router's default.

Run: ``.venv/bin/python bench/policy_replay.py [RATE ...]`` (requests per modelled second; default 80 and 146,
bench-router's no_sharing rate at its time scale of 10).
Measured 2026-12-04 (before the progress): p50/p90/p99 equal within 0.3 ms (rate 80: round robin 22.5/25.3/26.0 ms,
load score 22.8/25.4/26.0), but at rate 146 the load score's p99.7 was 30.1 ms against round robin's 27.6
(p99.9 33.5 against 30.1): in a burst that finds every replica prefilling, it sent the next request to a
replica that had just begun its prompt, where the rotation sends it to the one that began first. bench-router's
open-loop rounds are a few hundred requests, so such a burst lands at their p99 (a no_sharing round at 0.41 s
against round robin's 0.27 s, the same round in every run).
"""

from __future__ import annotations

import heapq
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_router import ENGINES, engine_options  # noqa: E402
from router_workloads import OUTPUT_TOKENS, SYSTEM_WORDS  # noqa: E402
from tokenyard.core.tokenizer import Tokenizer  # noqa: E402
from tokenyard.router.accounting import LoadLedger, Ticket  # noqa: E402
from tokenyard.router.core import DEFAULT_MISS_PENALTY  # noqa: E402
from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest  # noqa: E402
from tokenyard.router.plugins.outstanding_tokens import expected_load  # noqa: E402
from tokenyard.sim.engine import Engine, SamplingParams  # noqa: E402

PROMPT_TOKENS = SYSTEM_WORDS // 2 + 10  # "Request <key>. " and half a system prompt, one token per word


def replay(policy: str, rate: float, seconds: float = 400.0, seed: int = 1) -> list[float]:
    """Every request's TTFT (modelled seconds) under `policy`: "round_robin", "load_score" (the shipped score
    on the shipped ledger with --prefill-progress: outstanding tokens less the prefill each replica has likely
    done, at its measured rate), or "load_score_no_progress" (the same score on the whole debt, the default)."""
    rng = random.Random(seed)
    deployment = engine_options(1.0, 2048).deployment()
    engines = [
        Engine.for_deployment(deployment, Tokenizer(deployment.model.vocab_size)) for _ in range(ENGINES)
    ]
    stepping = [False] * ENGINES
    ledger = LoadLedger()
    tickets: dict[str, Ticket] = {}
    arrived: dict[str, float] = {}
    ttft: dict[str, float] = {}
    events: list[tuple[float, int, object]] = []
    at, count = 0.0, 0
    while at < seconds:
        at += rng.expovariate(rate)
        heapq.heappush(events, (at, 0, count))
        count += 1

    def step(replica: int, now: float) -> None:
        outcome = engines[replica].step(now)
        stepping[replica] = outcome is not None
        if outcome is not None:
            heapq.heappush(events, (outcome.end_s, 1, (replica, outcome)))

    def outstanding(replica: int, now: float) -> int:
        owed = ledger.load(str(replica)).tokens
        if policy == "load_score_no_progress":
            return owed
        return max(0, round(owed - ledger.prefill_done(str(replica), now)))  # as state.RouterState.snapshot

    turn = 0
    while events:
        now, kind, data = heapq.heappop(events)
        if kind == 0:
            name = f"r{data}"
            prompt = [rng.randrange(1000, 30000) for _ in range(PROMPT_TOKENS)]
            if policy == "round_robin":
                replica, turn = turn % ENGINES, turn + 1
            else:
                request = RoutingRequest(
                    model="m", prompt_tokens=PROMPT_TOKENS, expected_output_tokens=OUTPUT_TOKENS
                )
                loads = [
                    expected_load(
                        request,
                        ReplicaSnapshot(name=str(i), url="", outstanding_tokens=outstanding(i, now)),
                        DEFAULT_MISS_PENALTY,
                    )
                    for i in range(ENGINES)
                ]
                least = min(loads)
                replica = rng.choice([i for i, load in enumerate(loads) if load == least])
            engines[replica].add_request(
                name, prompt, SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True), now
            )
            arrived[name] = now
            tickets[name] = ledger.open(str(replica), PROMPT_TOKENS, OUTPUT_TOKENS, now=now)
            if not stepping[replica]:
                step(replica, now)
        else:
            replica, outcome = data
            for request, _token in outcome.tokens:
                if request.request_id not in ttft:
                    ttft[request.request_id] = outcome.end_s - arrived[request.request_id]
                ledger.generated(tickets[request.request_id], 1, outcome.end_s)
            for request in outcome.finished:
                ledger.close(tickets.pop(request.request_id))
            step(replica, outcome.end_s)
    return sorted(ttft.values())


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


POLICIES = ("round_robin", "load_score", "load_score_no_progress")
QUANTILES = (0.5, 0.9, 0.99, 0.997, 0.999)


def main(argv: list[str]) -> None:
    rates = [float(a) for a in argv] or [80.0, 146.0]
    print(
        f"{ENGINES} engines, unique prompts of {PROMPT_TOKENS} tokens, {OUTPUT_TOKENS} output tokens; TTFT in ms "
        f"at p{', p'.join(f'{100 * q:g}' for q in QUANTILES)}"
    )
    for rate in rates:
        rows = {policy: replay(policy, rate, seconds=150.0) for policy in POLICIES}
        for policy, ordered in rows.items():
            figures = "  ".join(f"{1000 * percentile(ordered, q):6.1f}" for q in QUANTILES)
            print(f"rate {rate:5.1f}/s  {policy:24s} {figures}  (n={len(ordered)})")
        for q in (0.99, 0.999):
            ratio = percentile(rows["load_score"], q) / percentile(rows["round_robin"], q)
            print(f"rate {rate:5.1f}/s  load score / round robin, p{100 * q:g}: {ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
