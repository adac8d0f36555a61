"""Placement alone, in modelled time: round robin against tokenyard's load score on unique, equal-length prompts
(bench-router's no_sharing), with the simulator's engines driven step by step and no router process, no hop and
no CPU shared with anything. A diagnostic, not a benchmark of the shipped router: it says whether a TTFT gap seen
in `make bench-router` comes from where requests are placed or from the router's process on the machine.

The load score is `plugins.outstanding_tokens.expected_load` as shipped (the miss penalty included): each replica
owes the uncached prompt tokens of its requests until their first token, and their output tokens until streamed;
a request goes to the replica owing least with its own prompt added, ties drawn at random.

Run: ``.venv/bin/python bench/policy_replay.py [RATE ...]`` (requests per modelled second; default 50 65 80).
Measured 2026-12-04: p50/p90/p99 TTFT equal within 0.3 ms at every rate (rate 80: round robin 22.5/25.3/26.0 ms,
load score 22.8/25.4/26.0 ms), while bench-router's wall-clock run had tokenyard's p99 at 0.329 s against round
robin's 0.266 s: the gap is in the router's hop (a tail of about 2% of requests), not in its placement.
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
from tokenyard.router.core import DEFAULT_MISS_PENALTY  # noqa: E402
from tokenyard.router.framework import ReplicaSnapshot, RoutingRequest  # noqa: E402
from tokenyard.router.plugins.outstanding_tokens import expected_load  # noqa: E402
from tokenyard.sim.engine import Engine, SamplingParams  # noqa: E402

PROMPT_TOKENS = SYSTEM_WORDS // 2 + 10  # "Request <key>. " and half a system prompt, one token per word


def replay(policy: str, rate: float, seconds: float = 400.0, seed: int = 1) -> list[float]:
    """Every request's TTFT (modelled seconds) under `policy` ("round_robin" or "load_score")."""
    rng = random.Random(seed)
    deployment = engine_options(1.0, 2048).deployment()
    engines = [
        Engine.for_deployment(deployment, Tokenizer(deployment.model.vocab_size)) for _ in range(ENGINES)
    ]
    stepping = [False] * ENGINES
    owed = [0] * ENGINES  # outstanding tokens per replica, as the router's ledger counts them
    left: dict[str, list[int]] = {}  # request -> [replica, prefill tokens owed, output tokens owed]
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
                    expected_load(request, ReplicaSnapshot(name=str(i), url="", outstanding_tokens=owed[i]),
                                  DEFAULT_MISS_PENALTY)
                    for i in range(ENGINES)
                ]  # fmt: skip
                least = min(loads)
                replica = rng.choice([i for i, load in enumerate(loads) if load == least])
            engines[replica].add_request(
                name, prompt, SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True), now
            )
            arrived[name] = now
            left[name] = [replica, PROMPT_TOKENS, OUTPUT_TOKENS]
            owed[replica] += PROMPT_TOKENS + OUTPUT_TOKENS
            if not stepping[replica]:
                step(replica, now)
        else:
            replica, outcome = data
            for request, _token in outcome.tokens:
                ticket = left[request.request_id]
                if request.request_id not in ttft:
                    ttft[request.request_id] = outcome.end_s - arrived[request.request_id]
                    owed[replica] -= ticket[1]
                    ticket[1] = 0
                if ticket[2] > 0:
                    owed[replica] -= 1
                    ticket[2] -= 1
            for request in outcome.finished:
                ticket = left.pop(request.request_id)
                owed[replica] -= ticket[1] + ticket[2]
            step(replica, outcome.end_s)
    return sorted(ttft.values())


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str]) -> None:
    rates = [float(a) for a in argv] or [50.0, 65.0, 80.0]
    print(
        f"{ENGINES} engines, unique prompts of {PROMPT_TOKENS} tokens, {OUTPUT_TOKENS} output tokens; TTFT in ms"
    )
    for rate in rates:
        rows = {policy: replay(policy, rate) for policy in ("round_robin", "load_score")}
        for policy, ordered in rows.items():
            p50, p90, p99 = (1000 * percentile(ordered, q) for q in (0.5, 0.9, 0.99))
            print(
                f"rate {rate:5.1f}/s  {policy:12s} p50 {p50:6.1f}  p90 {p90:6.1f}  p99 {p99:6.1f}  (n={len(ordered)})"
            )
        ratio = percentile(rows["load_score"], 0.99) / percentile(rows["round_robin"], 0.99)
        print(f"rate {rate:5.1f}/s  load score / round robin, p99: {ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
