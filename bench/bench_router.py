"""Router benchmark: tokenyard against round robin, least outstanding requests, and sglang-router's and
vllm-router's cache_aware policies, on the same simulated fleet and the same arrivals, in one run.

Fleet: ENGINES tokenyard.sim engines (Llama-3.1-8B on H100-SXM, time-scaled), all in one helper process (the sim
runs many engines on one event loop). Their KV cache is limited with --num-gpu-blocks-override so that one
engine holds only part of the tenants' system prompts while the fleet holds all of them: the regime where
a request goes decides whether its prefix is cached (with the preset's full 28k blocks every engine would
hold every prompt of this small benchmark and locality would not matter).

Policies:
- tokenyard: `python -m tokenyard.router` (a separate process) as shipped: its default scorers, no tokenizer
  (prompts hashed by character blocks), told nothing of output lengths but each request's max_tokens; told the
  engines' configured batch size (--engine-max-num-seqs, ENGINE_BATCH_SIZE), which in a cluster it reads from
  the ModelDeployment;
- round_robin, least_outstanding: dispatched by the load generator itself straight to the engines (no proxy
  hop, exact in-flight counts): the ideal, zero-overhead form of those balancers;
- sglang:SETTING, vllm:SETTING: sglang-router 0.3.2 and vllm-router 0.1.17 with `--policy cache_aware` and the
  named setting of their grid (bench/router_peers.py): each at its defaults, and sglang-router also at
  SGLANG_TUNED, the setting of its grid that did best on the tuning workloads;
- sglang:round_robin: sglang-router's own round robin, i.e. round robin as a user deploys it, a proxy with a
  hop of its own, beside the hop-free bound above (added after the 2026-12-03 full run).

BENCH_ENGINE=llm-d (`make bench-router-llm-d`): the same comparison on llm-d-inference-sim v0.9.2 engines instead
(LlmdFleet), whose tokenizer, KV cache and prefill model are not this project's; results go to
bench/results/router-llm-d.json. BENCH_SIM_GPUS=h100-sxm,a100-80gb: a tokenyard.sim fleet of mixed GPUs, engine i
on the i-th kind in turn, as a cluster in the middle of an upgrade (results in bench/results/router-mixed-fleet.json).

Workloads (bench/router_workloads.py; rates relative to a capacity measured on one engine x ENGINES). The router's
defaults, and SGLANG_TUNED, are chosen on the four tuning workloads only; the held-out families report them:
- tuning: shared_prefix_70 / _95 (48 tenants with Zipf popularity, each with a long system prompt, short unique
  suffixes; at 70% and 95% of capacity), no_sharing (unique prompts at 70%), multi_turn (chat conversations
  whose every turn extends the previous one);
- held out: zipf_tenants (256 tenants, prompts of 1,500-4,000 tokens, ~3x the fleet's KV cache), tenant_surge (a
  cold tenant jumps to 60% of the traffic halfway), long_documents (24 documents of 5,000-9,000 tokens, short
  questions), unknown_output (no ignore_eos: heavy-tailed reply lengths under a loose max_tokens cap),
  mixed_lengths (chat as public traces show it: unique prompts of log-normal length, replies ending by
  themselves).

Each workload runs in ROUNDS rounds; in each round every policy gets a fresh router, empty engine caches and the
same arrivals, in an order rotated round by round (the machine is shared: a burst of load from another process
then falls on all policies alike instead of deciding one policy's tail).

Figures, per workload and policy:
- ttft_p50_s / ttft_p99_s: client-side time to first token in the open-loop phase (Poisson arrivals at the
  workload's rate, RUN_SECONDS in all per policy, or long enough for MIN_REQUESTS per policy);
- output_tok_s: output tokens per second delivered in the closed-loop phase: after each round's open loop,
  level x CLOSED_CLIENTS_PER_ENGINE x ENGINES clients (level = 0.70 or 0.95, the workload's share of
  capacity), each sending its next request as soon as its last one ended (multi_turn: each client joins its
  first conversation at a different turn); after CLOSED_WARMUP_SECONDS, the output tokens streamed to the
  clients inside a window of CLOSED_SECONDS / ROUNDS count, summed over the rounds (see TokenWindow). (Measured in
  the last round only, one 20 s window per policy swung with the load of other processes on the machine:
  sglang_cache_aware alone, back to back, gave 1,650 to 2,120 tok/s; spread over the rotated rounds, a burst
  falls on all policies alike, as for the open loop.) Open-loop throughput would only restate the
  offered load (every policy delivers it); with demand held at a fixed concurrency that saturates the fleet, a
  policy that saves prefill work (cache hits) or keeps every engine busy (balance) delivers more tokens, and
  one that piles requests up delivers fewer;
- prefix_hit_rate: from the engines' own counters (vllm:prefix_cache_hits/queries) over the open-loop phase
  (closed_prefix_hit_rate: the same over the closed loop; closed_preemptions: the engines' preemptions per 100
  requests they finished in the closed loop);
- imbalance: max/mean of requests served per engine over the open-loop phase;
- shared-prefix workloads: the closed loop's decode bound (decode_bound_tok_s, from the engines' step model)
  and each policy's share of it (output_share_of_decode_bound);
- in the JSON only, client_ttft_mean_s beside engine_ttft_mean_s (the engines' own histogram): their difference
  is what the path in front of the engines adds under load, a router hop or the load generator alone.
Then the router's overhead (added latency p50/p99 against calling an engine directly, and the requests/s one
router process sustains with a closed loop of small requests), with a bare aiohttp pass-through proxy as a
labelled floor row (bench/passthrough_proxy.py: what the HTTP stack alone adds). Prints a table and, last, one
JSON line.

BENCH_QUICK=1: shorter runs (same comparison).
The results file (bench/results/router.json, or router-llm-d / router-mixed-fleet) is written after each workload,
each workload with the run record of the run that measured it (``part_runs``; results_io.merge_parts): a run
stopped half way keeps what it finished and leaves the other workloads as an earlier run measured them. A run that
ends drops the workloads it did not run, unless BENCH_MERGE=1 (bring a file up to date a few workloads at a time).
BENCH_TRACE=<file>: also append one JSON line per open-loop request (policy/workload/round, when it was sent on the
monotonic clock, its TTFT, the replica tokenyard chose from the x-tokenyard-replica header, the prompt's first 60
characters): what a tail is made of (for example which documents went cold where), not a figure of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp
from results_io import merge_parts, read_results, run_record, write_results
from router_peers import (
    OTHER_POLICIES,
    READINESS_PATH,
    SGLANG_ROUTER_GRID,
    VLLM_ROUTER_GRID,
    peer_argv,
    router_ready,
)
from router_workloads import (
    OUTPUT_TOKENS,
    Request,
    Workload,
    open_loop_seconds,
    open_requests,
    poisson_times,
    shared_prefix_body,
    tenant_prompts,
    words,
)
from router_workloads import WORKLOADS as ALL_WORKLOADS
from tokenyard.core.engines import configured_batch_size
from tokenyard.core.process import stop_process
from tokenyard.router.proxy import carries_token
from tokenyard.sim.model import MAX_NUM_SEQS as SIM_MAX_NUM_SEQS

QUICK = os.environ.get("BENCH_QUICK") == "1"
MERGE = os.environ.get("BENCH_MERGE") == "1"
ENGINES = int(os.environ.get("BENCH_ENGINES", "8"))
TIME_SCALE = float(os.environ.get("BENCH_TIME_SCALE", "10.0"))  # served seconds per modelled second
KV_BLOCKS = int(os.environ.get("BENCH_KV_BLOCKS", "2048"))  # per engine (16 tokens each)
RUN_SECONDS = float(os.environ.get("BENCH_RUN_SECONDS", "15" if QUICK else "45"))  # open loop, all rounds
# ... or longer, for a low-rate workload to send each policy this many requests (router_workloads.open_loop_seconds)
MIN_REQUESTS = int(os.environ.get("BENCH_MIN_REQUESTS", "0" if QUICK else "600"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if QUICK else "3"))
# Closed-loop windows of 12 s per round: at ~6.7 s (20 s over 3 rounds, until 2026-12-03) a round's tokens/s
# swung more than the policies differ (zipf_tenants: tokenyard 541/357/459 against sglang-router's 535/685/573
# in one run; with 12 s windows a rerun gave 590 against 589), so the full run's 24% gap was mostly noise.
CLOSED_SECONDS = float(os.environ.get("BENCH_CLOSED_SECONDS", "12" if QUICK else "36"))
# Before the closed loop's window opens, in every round: the clients start together and need a few request
# lifetimes (~2 s each at full load) to reach a steady state.
CLOSED_WARMUP_SECONDS = float(os.environ.get("BENCH_CLOSED_WARMUP_SECONDS", "5" if QUICK else "7"))
MODEL = "bench-model"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
# tokenyard as shipped: no tokenizer configured (prompts hashed by character blocks, as a user's would be until
# they set spec.routing.tokenizer), no --default-max-tokens (requests name their max_tokens).
TOKENYARD_ARGS = os.environ.get("BENCH_TOKENYARD_ARGS", "").split()
TRACE_PATH = os.environ.get("BENCH_TRACE")
# The peers' cache_aware settings (bench/router_peers.py grids): each at its defaults, and sglang-router also at
# the setting of its grid that did best on the tuning workloads (SGLANG_TUNED, chosen as tokenyard's defaults
# were: on the four tuning workloads only; see the README's router benchmark section for the grid's figures).
SGLANG_TUNED = "sglang:threshold_0.6"
# The engines: tokenyard's own simulator (the default), or llm-d-inference-sim, an OpenAI-compatible vLLM
# simulator nobody here wrote, with its own tokenizer, KV block cache and prefill model (BENCH_ENGINE=llm-d; see
# LlmdFleet). The router's defaults were chosen on the first only; the second is what it was not tuned on.
ENGINE_KIND = os.environ.get("BENCH_ENGINE", "tokenyard-sim")
if ENGINE_KIND not in ("tokenyard-sim", "llm-d"):
    raise SystemExit(f"BENCH_ENGINE: unknown engine {ENGINE_KIND!r}; known: tokenyard-sim, llm-d")
# vllm-router's cache_aware posts every request to each worker's /tokenize first: tokenyard.sim serves it as vLLM
# does, and so does llm-d-inference-sim v0.9.2 (pkg/communication/http.go routes POST /tokenize to its tokenizer).
_DEFAULT_POLICIES = (
    f"tokenyard,round_robin,least_outstanding,sglang:defaults,{SGLANG_TUNED},vllm:defaults,sglang:round_robin"
)
POLICIES = tuple(os.environ.get("BENCH_POLICIES", _DEFAULT_POLICIES).split(","))
# Tuning: extra tokenyard configurations run side by side with the others, as policies of their own:
# BENCH_VARIANTS="name=--flag value --flag2 value;name2=..." adds policies `name`, `name2` (router flags on top of
# BENCH_TOKENYARD_ARGS). Empty by default: the comparison the issue asks for is the four policies above.
VARIANTS = {
    name.strip(): args.split()
    for name, _, args in (
        part.partition("=") for part in os.environ.get("BENCH_VARIANTS", "").split(";") if part.strip()
    )
}
POLICIES += tuple(name for name in VARIANTS if name not in POLICIES)
for _policy in POLICIES:
    _router, _, _setting = _policy.partition(":")
    _grid = {"sglang": SGLANG_ROUTER_GRID, "vllm": VLLM_ROUTER_GRID}.get(_router)
    if _grid is not None and _setting not in _grid and _setting not in OTHER_POLICIES:
        raise SystemExit(
            f"BENCH_POLICIES: {_router} has no setting {_setting!r}; its grid: {', '.join(_grid)}; other policies: "
            + ", ".join(OTHER_POLICIES)
        )
    if _grid is None and _policy not in ("tokenyard", "round_robin", "least_outstanding", *VARIANTS):
        raise SystemExit(f"BENCH_POLICIES: unknown policy {_policy!r}")
WORKLOADS = tuple(os.environ.get("BENCH_WORKLOADS", ",".join(ALL_WORKLOADS)).split(","))
for _name in WORKLOADS:
    if _name not in ALL_WORKLOADS:
        raise SystemExit(f"BENCH_WORKLOADS: unknown workload {_name!r}; known: {', '.join(ALL_WORKLOADS)}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the engine host (a child process) -------------------------------------------------------------------


SIM_MODEL = "llama-3.1-8b"
# The GPUs of the tokenyard.sim fleet, engine i on SIM_GPUS[i % len(SIM_GPUS)]. One kind by default; several
# (BENCH_SIM_GPUS=h100-sxm,a100-80gb) make a mixed fleet, as a cluster has in the middle of an upgrade, where a
# replica's speed is not the fleet's: capacity is then measured on one engine of each kind.
SIM_GPUS = tuple(os.environ.get("BENCH_SIM_GPUS", "h100-sxm").split(","))
SIM_GPU = SIM_GPUS[0]
MIXED_FLEET = len(set(SIM_GPUS)) > 1
if "BENCH_SIM_GPUS" in os.environ:
    from tokenyard.sim.model import GPUS

    if ENGINE_KIND != "tokenyard-sim":
        raise SystemExit(f"BENCH_SIM_GPUS: chooses tokenyard.sim's GPUs; BENCH_ENGINE={ENGINE_KIND} has none")
    for _gpu in SIM_GPUS:
        if _gpu not in GPUS:
            raise SystemExit(f"BENCH_SIM_GPUS: unknown GPU {_gpu!r}; known: {', '.join(GPUS)}")


def engine_gpu(index: int) -> str:
    return SIM_GPUS[index % len(SIM_GPUS)]


def engine_options(time_scale: float, blocks: int, gpu: str = SIM_GPU):
    from tokenyard.sim.server import EngineOptions

    return EngineOptions(
        model=SIM_MODEL,
        gpu=gpu,
        port=0,
        time_scale=time_scale,
        served_model_name=MODEL,
        num_gpu_blocks_override=blocks,
        # vLLM with --enable-prompt-tokens-details, as a user would start it to try --prefix-feedback (a
        # labelled variant); the shipped router does not read it
        report_cached_tokens=True,
    )


async def host_engines(count: int, time_scale: float, blocks: int, port_file: str) -> None:
    from tokenyard.sim.server import SimEngine

    engines = [SimEngine(engine_options(time_scale, blocks, engine_gpu(i))) for i in range(count)]
    for engine in engines:
        await engine.start()
    with open(port_file + ".tmp", "w") as handle:
        json.dump([engine.url for engine in engines], handle)
    os.replace(port_file + ".tmp", port_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for engine in engines:
        await engine.stop(drain_timeout_s=0.5)


@dataclass
class Result:
    ttft: float | None
    latency: float
    output_tokens: int
    ok: bool
    text: str = ""


# --- dispatch --------------------------------------------------------------------------------------------------


class Dispatcher:
    """Where the load generator sends a request: a router's URL, or an engine chosen client-side."""

    def __init__(self, policy: str, engines: list[str], router_url: str | None) -> None:
        self.policy = policy
        self.engines = engines
        self.router_url = router_url
        self._rr = itertools.cycle(range(len(engines)))
        self.in_flight = [0] * len(engines)
        self._rng = random.Random(5)

    def acquire(self) -> tuple[str, int | None]:
        if self.router_url:
            return self.router_url, None
        if self.policy == "round_robin":
            index = next(self._rr)
        else:
            least = min(self.in_flight)
            index = self._rng.choice([i for i, n in enumerate(self.in_flight) if n == least])
        self.in_flight[index] += 1
        return self.engines[index], index

    def release(self, index: int | None) -> None:
        if index is not None:
            self.in_flight[index] -= 1


class TokenWindow:
    """Counts the output tokens that reach the clients between ``opens_at`` and ``closes_at`` (one streamed
    event with text is one token, as the sim and vLLM stream), whatever request they belong to.

    Why tokens and not finished requests: under a closed loop the requests of one policy drift into waves
    (similar requests started together end together), and a count of the requests that ended inside a short
    window then depends on where the window falls in the wave - least outstanding gave 1447.0 tok/s in two
    runs to the digit and 1046 with other window bounds. Tokens arrive continuously, so their count does not."""

    def __init__(self, opens_at: float, duration: float) -> None:
        self.opens_at = opens_at
        self.closes_at = opens_at + duration
        self.tokens = 0

    def tick(self) -> None:
        if self.opens_at <= time.monotonic() < self.closes_at:
            self.tokens += 1


async def send(
    session: aiohttp.ClientSession,
    dispatcher: Dispatcher,
    path: str,
    body: dict,
    keep_text: bool = False,
    window: TokenWindow | None = None,
    trace_tag: str | None = None,
) -> Result:
    base, index = dispatcher.acquire()
    # A plain client: it does not ask for the stream's usage (stream_options.include_usage), as many load
    # generators and the OpenAI SDKs' users do not; a router that learns from usage must ask for it itself.
    payload = {"model": MODEL, "stream": True, "ignore_eos": True, **body}
    started = time.monotonic()
    ttft = None
    tokens = 0
    text_parts: list[str] = []
    try:
        async with session.post(base + path, json=payload) as response:
            replica = response.headers.get("x-tokenyard-replica", "")
            if response.status != 200:
                await response.read()
                return Result(None, time.monotonic() - started, 0, False)
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                if carries_token(line):  # not the empty role-only delta of a chat stream
                    tokens += 1
                    if ttft is None:
                        ttft = time.monotonic() - started
                    if window is not None:
                        window.tick()
                if keep_text:
                    for choice in json.loads(line[6:]).get("choices") or ():
                        text_parts.append(
                            (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                        )
        if trace_tag is not None:
            trace(trace_tag, started, ttft, replica, str(body.get("prompt", ""))[:60])
        return Result(ttft, time.monotonic() - started, tokens, ttft is not None, "".join(text_parts))
    except (TimeoutError, aiohttp.ClientError):
        return Result(ttft, time.monotonic() - started, tokens, False)
    finally:
        dispatcher.release(index)


_trace_file = None


def trace(tag: str, sent: float, ttft: float | None, replica: str, prompt_head: str) -> None:
    """One open-loop request's line in BENCH_TRACE's file (opened once: no open() per request beside the load)."""
    global _trace_file
    if _trace_file is None:
        _trace_file = open(TRACE_PATH, "a", buffering=1)  # line-buffered: a stopped run keeps what it traced
    _trace_file.write(
        json.dumps({"slice": tag, "sent": sent, "ttft": ttft, "replica": replica, "prompt": prompt_head})
        + "\n"
    )


async def run_open_loop(
    session, dispatcher, requests: list[Request], trace_tag: str | None = None
) -> tuple[list[Result], float]:
    started = time.monotonic()

    async def one(request: Request) -> Result:
        delay = started + request.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        return await send(session, dispatcher, request.path, request.body, trace_tag=trace_tag)

    results = await asyncio.gather(*(one(r) for r in requests))
    return list(results), time.monotonic() - started


MULTI_TURN_TURNS = 5
MULTI_TURN_SYSTEM = "You are the support assistant of a large bank. " + words(random.Random(77), 300)


async def conversation(
    session,
    dispatcher,
    crng: random.Random,
    results: list[Result],
    think_s: float,
    first_turn: int = 0,
    window: TokenWindow | None = None,
) -> None:
    """TURNS turns, each sent after the previous reply (plus a think time drawn with mean ``think_s``), its
    messages the whole history so far. ``first_turn`` > 0 joins a conversation already under way: the turns
    before it are made up (user and assistant text no engine has seen)."""
    messages = [{"role": "system", "content": MULTI_TURN_SYSTEM}]
    for _turn in range(first_turn):
        messages.append({"role": "user", "content": words(crng, 150)})
        messages.append({"role": "assistant", "content": words(crng, OUTPUT_TOKENS)})
    for _turn in range(first_turn, MULTI_TURN_TURNS):
        messages.append({"role": "user", "content": words(crng, 150)})
        result = await send(
            session,
            dispatcher,
            "/v1/chat/completions",
            {"messages": list(messages), "max_tokens": OUTPUT_TOKENS},
            keep_text=True,
            window=window,
        )
        results.append(result)
        if not result.ok:
            return
        messages.append({"role": "assistant", "content": result.text})
        if think_s > 0:
            await asyncio.sleep(crng.expovariate(1 / think_s))


async def run_multi_turn(
    session, dispatcher, rate: float, duration: float, seed: int = 3
) -> tuple[list[Result], float]:
    """Conversations start as a Poisson process (rate / TURNS, so that turns arrive at ``rate``)."""
    rng = random.Random(seed)
    starts = poisson_times(rng, rate / MULTI_TURN_TURNS, duration)
    results: list[Result] = []
    t0 = time.monotonic()

    async def start(k: int, at: float) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        await conversation(session, dispatcher, random.Random(seed * 1000 + k), results, think_s=0.3)

    await asyncio.gather(*(start(k, at) for k, at in enumerate(starts)))
    return results, time.monotonic() - t0


class WindowedResults(list):
    """Results that ended after ``opens_at`` (earlier ones are dropped as they come)."""

    def __init__(self, opens_at: float) -> None:
        super().__init__()
        self.opens_at = opens_at

    def append(self, result: Result) -> None:
        if time.monotonic() >= self.opens_at:
            super().append(result)


async def run_closed_loop(
    session, dispatcher, workload: Workload, clients: int, duration: float, seed: int = 4
) -> tuple[list[Result], float]:
    """``clients`` clients, each sending its next request as soon as its last one ended (multi_turn: its next
    turn, and a new conversation after the last): after CLOSED_WARMUP_SECONDS, a window of ``duration``
    seconds opens; when it closes the requests still in flight are cancelled (a client disconnect). Returns
    the requests that ended inside the window (for errors), the output tokens delivered inside it and its
    length.

    In multi_turn, client c starts in turn c mod TURNS of its first conversation: started all at turn 1, the
    conversations stay in step (every client at the same turn, the engines' caches all cold or all warm
    together) for longer than the window lasts."""
    results = WindowedResults(time.monotonic() + CLOSED_WARMUP_SECONDS)
    window = TokenWindow(results.opens_at, duration)

    async def client(c: int) -> None:
        rng = random.Random(seed * 10_000 + c)
        first_turn = c % MULTI_TURN_TURNS
        while True:
            if workload.body is None:  # multi_turn
                await conversation(session, dispatcher, rng, results, 0.0, first_turn, window)
                first_turn = 0
                continue
            # progress 0.99: the mix of the open loop's end (tenant_surge: the surge under way)
            body = workload.body(rng, 0.99)
            results.append(await send(session, dispatcher, "/v1/completions", body, window=window))

    tasks = [asyncio.create_task(client(c)) for c in range(clients)]
    await asyncio.sleep(max(0.0, window.closes_at - time.monotonic()))
    elapsed = time.monotonic() - results.opens_at
    ended = list(results)  # what ended inside the window; cancelling adds nothing to it
    tokens = window.tokens
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return ended, tokens, elapsed


# --- engine counters -----------------------------------------------------------------------------------------


async def engine_counters(session, engines: list[str]) -> list[dict[str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(COUNTERS)

    async def one(url: str) -> dict[str, float]:
        async with session.get(url + "/metrics") as response:
            text = await response.text()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                # vLLM names its counters ..._total; llm-d-inference-sim v0.9.2 leaves the suffix off some
                # (vllm:prefix_cache_hits, vllm:prefix_cache_queries)
                name = sample.name if sample.name in wanted else sample.name + "_total"
                if name in wanted:
                    values[name] = values.get(name, 0.0) + sample.value
        return values

    return list(await asyncio.gather(*(one(u) for u in engines)))


class SimFleet:
    """ENGINES tokenyard.sim engines in one helper process (this script with --engine-host): the sim runs many
    engines on one event loop. Caches are emptied through the sim's /flush_cache."""

    def __init__(self) -> None:
        self.host: subprocess.Popen | None = None

    def describe(self, capacity: float) -> str:
        return (
            f"fleet: {ENGINES} x tokenyard.sim {SIM_MODEL} on {'/'.join(SIM_GPUS)}, time scale {TIME_SCALE}, "
            f"{KV_BLOCKS} KV blocks each; shared-prefix capacity ~{capacity:.1f} req/s"
        )

    async def start(self) -> list[str]:
        port_file = os.path.join(tempfile.mkdtemp(prefix="bench-router-"), "engines.json")
        argv = [PY, os.path.abspath(__file__), "--engine-host", "--count", str(ENGINES)]
        argv += ["--time-scale", str(TIME_SCALE), "--blocks", str(KV_BLOCKS), "--port-file", port_file]
        self.host = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(port_file):
            if self.host.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the engine host did not start")
            await asyncio.sleep(0.1)
        with open(port_file) as handle:
            return json.load(handle)

    async def flush(self, session, engines: list[str], router_attached: bool = False) -> None:
        for url in engines:
            async with session.post(url + "/flush_cache") as response:
                await response.read()

    def stop(self) -> None:
        if self.host is not None:
            stop_process(self.host, timeout=15)


# llm-d-inference-sim v0.9.2 (github.com/llm-d/llm-d-inference-sim, built from its tag; see the README's router
# section for the build). Its model, from its source (pkg/llm-d-inference-sim/latencies.go, pkg/kv-cache): at
# most --max-num-seqs requests run, the rest wait in a queue; a request's time to first token is
# prefill-overhead + (prompt tokens not found in its KV block cache) x prefill-time-per-token, both stretched by
# 1 + (time-factor-under-load - 1) x (running - 1) / (max-num-seqs - 1), as are its inter-token gaps; the cache
# holds --kv-cache-size blocks of --block-size tokens and evicts the oldest block no running request uses. Its
# tokenizer is its own (a simulated one for a model name it does not know). The figures below are this
# benchmark's choice, not the project's defaults: about an 8B model on one H100 (10k prompt tokens/s, 20 ms a
# token, twice as slow with a full batch) with a cache of 8,192 blocks, which holds the 8 running requests of the
# longest documents (9k tokens) beside some 45 of zipf_tenants' 256 system prompts, so that, as on the
# tokenyard.sim fleet, one engine holds part of the tenants' prompts and the fleet all of them.
# `make bench-router-llm-d` builds it (bench/build_llm_d_inference_sim.sh) and sets BENCH_LLMD_SIM
LLMD_SIM = os.environ.get("BENCH_LLMD_SIM", "llm-d-inference-sim")
LLMD_ARGS = os.environ.get(
    "BENCH_LLMD_ARGS",
    "--max-num-seqs 8 --kv-cache-size 8192 --block-size 16 --prefill-overhead 10ms --prefill-time-per-token 100us "
    "--inter-token-latency 20ms --time-factor-under-load 2 --max-model-len 32768",
).split()

# The engines' configured batch size, as tokenyard is told it. In a cluster the router reads it from each
# ModelDeployment's engine args (--max-num-seqs); here the backends are static, so it gets the same figure as
# --engine-max-num-seqs: tokenyard.sim runs vLLM's default (256), llm-d-inference-sim LLMD_ARGS' --max-num-seqs
# (its own default is 5). The peers have no such option. A variant whose flags include UNTOLD runs without it
# (a labelled row: what a static-backend user who leaves the flag out gets).
ENGINE_BATCH_SIZE = (
    SIM_MAX_NUM_SEQS if ENGINE_KIND == "tokenyard-sim" else (configured_batch_size("Custom", LLMD_ARGS) or 5)
)
UNTOLD = "--bench-untold-batch-size"


class LlmdFleet:
    """ENGINES llm-d-inference-sim processes, one per port. It has no endpoint that empties its cache, so a flush
    restarts the process on the same port."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = tempfile.mkdtemp(prefix="bench-router-llmd-")

    def describe(self, capacity: float) -> str:
        return f"fleet: {ENGINES} x llm-d-inference-sim {' '.join(LLMD_ARGS)}; shared-prefix capacity ~{capacity:.1f} req/s"

    def _spawn(self, port: int, seed: int) -> subprocess.Popen:
        argv = [
            LLMD_SIM,
            "--model",
            MODEL,
            "--port",
            str(port),
            "--enable-kvcache",
            "--seed",
            str(seed),
            *LLMD_ARGS,
        ]
        # POD_IP: its KV cache publishes block events and will not start without an address to name itself by
        env = {**os.environ, "POD_IP": "127.0.0.1"}
        log = open(os.path.join(self.logs, f"{port}.log"), "ab")  # noqa: SIM115 - the child holds it
        try:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        finally:
            log.close()

    async def _ready(self, session, url: str, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llm-d-inference-sim on {url} exited {proc.returncode}; logs in {self.logs}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.get(url + "/health") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"llm-d-inference-sim on {url} not ready after 30 s; logs in {self.logs}")

    async def start(self) -> list[str]:
        for i in range(ENGINES):
            url = f"http://127.0.0.1:{free_port()}"
            self.procs[url] = self._spawn(int(url.rsplit(":", 1)[1]), seed=11 + i)
        async with aiohttp.ClientSession() as session:
            for url, proc in self.procs.items():
                await self._ready(session, url, proc)
        return list(self.procs)

    async def flush(self, session, engines: list[str], router_attached: bool = False) -> None:
        if router_attached:
            # A restart under a router would break its connections and scrapes mid-slice. Nothing needs emptying
            # then: the router's warm-up prompt ("warm up") is shorter than one 16-token block, so it caches none.
            return
        for index, url in enumerate(engines):
            stop_process(self.procs[url], timeout=10)
            self.procs[url] = self._spawn(int(url.rsplit(":", 1)[1]), seed=11 + index)
        for url in engines:
            await self._ready(session, url, self.procs[url])

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process(proc, timeout=10)


FLEET = SimFleet() if ENGINE_KIND == "tokenyard-sim" else LlmdFleet()


async def flush_caches(session, engines: list[str], router_attached: bool = False) -> None:
    await FLEET.flush(session, engines, router_attached)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))
    return ordered[k]


# The open-loop TTFT at every percentile and at 99.9 (bench/report.py draws each policy's TTFT CDF from these).
TTFT_CDF_PERCENTS = [*range(1, 100), 99.9]


COUNTERS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_success_total",
    # A preempted request gives its KV blocks back and is prefilled again later: where a router packs more
    # distinct prefixes onto an engine than its KV holds beside the running requests, this counts it.
    "vllm:num_preemptions_total",
    # The engines' own time to first token (arrival at the engine to first token): set beside the client's,
    # the difference is what the path in front of the engine adds under load (a router hop, or none).
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
)


def counter_deltas(before: list[dict[str, float]], after: list[dict[str, float]]) -> list[dict[str, float]]:
    return [
        {name: a.get(name, 0.0) - b.get(name, 0.0) for name in COUNTERS}
        for a, b in zip(after, before, strict=True)
    ]


def add_deltas(total: list[dict[str, float]], more: list[dict[str, float]]) -> list[dict[str, float]]:
    if not total:
        return more
    return [{name: t[name] + m[name] for name in COUNTERS} for t, m in zip(total, more, strict=True)]


@dataclass
class PolicyRun:
    """One policy on one workload, over all its rounds."""

    open_results: list[Result]
    deltas: list[dict[str, float]]  # engine counters over the open-loop phases, per engine
    closed_results: list[Result]  # the requests that ended inside the closed loop's windows
    closed_tokens: int  # output tokens delivered inside them
    closed_elapsed: float
    closed_deltas: list[dict[str, float]] = field(default_factory=list)  # engine counters, closed loop
    # output tokens/s of each round's window: their spread shows how far apart two policies must be to differ
    closed_rounds: list[float] = field(default_factory=list)
    # the open loop's TTFT p90 and p99 of each round: the same for the tail
    ttft_rounds: list[tuple[float, float]] = field(default_factory=list)
    # tokenyard's prefill-overlap verdict at the end of each round (its /metrics): what it learned of the engine
    overlap_rounds: list[dict[str, float]] = field(default_factory=list)


def summarise(run: PolicyRun) -> dict[str, float]:
    ttfts = [r.ttft for r in run.open_results if r.ok and r.ttft is not None]
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in run.deltas)
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in run.deltas)
    served = [d["vllm:request_success_total"] for d in run.deltas]
    mean = sum(served) / len(served) if served else 0
    closed_ok = [r for r in run.closed_results if r.ok]
    closed_hits = sum(d["vllm:prefix_cache_hits_total"] for d in run.closed_deltas)
    closed_queries = sum(d["vllm:prefix_cache_queries_total"] for d in run.closed_deltas)
    engine_ttft_sum = sum(d["vllm:time_to_first_token_seconds_sum"] for d in run.deltas)
    engine_ttft_count = sum(d["vllm:time_to_first_token_seconds_count"] for d in run.deltas)
    closed_preempted = sum(d["vllm:num_preemptions_total"] for d in run.closed_deltas)
    closed_finished = sum(d["vllm:request_success_total"] for d in run.closed_deltas)
    return {
        "ttft_p50_s": round(percentile(ttfts, 0.5), 4),
        "ttft_p90_s": round(percentile(ttfts, 0.9), 4),
        "ttft_p99_s": round(percentile(ttfts, 0.99), 4),
        "ttft_cdf_percent": TTFT_CDF_PERCENTS,
        "ttft_cdf_s": [round(percentile(ttfts, p / 100), 4) for p in TTFT_CDF_PERCENTS],
        "output_tok_s": round(run.closed_tokens / run.closed_elapsed, 1) if run.closed_elapsed else 0.0,
        "output_tok_s_rounds": [round(value, 1) for value in run.closed_rounds],
        "ttft_p90_s_rounds": [round(p90, 4) for p90, _ in run.ttft_rounds],
        "ttft_p99_s_rounds": [round(p99, 4) for _, p99 in run.ttft_rounds],
        **({"prefill_overlap_rounds": run.overlap_rounds} if run.overlap_rounds else {}),
        "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "imbalance": round(max(served) / mean, 3) if mean else 0.0,
        "closed_prefix_hit_rate": round(closed_hits / closed_queries, 4) if closed_queries else 0.0,
        "client_ttft_mean_s": round(sum(ttfts) / len(ttfts), 4) if ttfts else 0.0,
        "engine_ttft_mean_s": round(engine_ttft_sum / engine_ttft_count, 4) if engine_ttft_count else 0.0,
        # per 100 requests the engines finished in the closed loop
        "closed_preemptions": round(100 * closed_preempted / closed_finished, 2) if closed_finished else 0.0,
        "requests": len(run.open_results),
        "errors": sum(not r.ok for r in run.open_results) + len(run.closed_results) - len(closed_ok),
    }


async def router_overlap(session, metrics_url: str) -> dict[str, float]:
    """tokenyard's prefill-overlap samples (overtook / waited) and verdict (side_by_side 1 or 0), from its /metrics
    (accounting.PrefillOverlap): whether it judged the engine to prefill side by side in this round."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(metrics_url) as response:
        text = await response.text()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tokenyard_router_prefill_overlap_samples":
                found[sample.labels.get("outcome", "")] = sample.value
            elif sample.name == "tokenyard_router_prefills_side_by_side":
                found["side_by_side"] = sample.value
    return found


# --- routers as processes --------------------------------------------------------------------------------------


class RouterProcess:
    def __init__(self, policy: str, engines: list[str]) -> None:
        self.peer = ":" in policy  # sglang:SETTING, vllm:SETTING
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url: str | None = None  # tokenyard's own /metrics (a peer's is not read)
        if policy == PASSTHROUGH:
            args = [
                PY,
                os.path.join(REPO, "bench", "passthrough_proxy.py"),
                "--port",
                str(self.port),
                *engines,
            ]
        elif policy == "tokenyard" or policy in VARIANTS:
            metrics_port = free_port()
            self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            variant = VARIANTS.get(policy, [])
            told = [] if UNTOLD in variant else ["--engine-max-num-seqs", str(ENGINE_BATCH_SIZE)]
            args = [
                PY,
                "-m",
                "tokenyard.router",
                "--port",
                str(self.port),
                "--grpc-port",
                "-1",
                "--metrics-port",
                str(metrics_port),
                "--served-model",
                MODEL,
                "--log-level",
                "WARNING",
                *told,
                *TOKENYARD_ARGS,
                *(flag for flag in variant if flag != UNTOLD),
            ]
            for i, url in enumerate(engines):
                args += ["--backend", f"e{i}={url}"]
        else:
            router, _, setting = policy.partition(":")
            grid = SGLANG_ROUTER_GRID if router == "sglang" else VLLM_ROUTER_GRID
            if setting in OTHER_POLICIES:
                args = peer_argv(
                    router, "127.0.0.1", self.port, engines, free_port(), python=PY, policy=setting
                )
            else:
                args = peer_argv(
                    router, "127.0.0.1", self.port, engines, free_port(), grid[setting], python=PY
                )
        # Its log goes to a file, never to a pipe nobody reads: a chatty router would fill the pipe and block.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.log)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    async def ready(self, session: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
                if self.peer:  # a peer routes once some worker is healthy: wait until every one is
                    async with session.get(self.url + READINESS_PATH) as response:
                        body = await response.json(content_type=None)
                        if not router_ready(response.status, body):
                            await asyncio.sleep(0.2)
                            continue
                payload = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
                async with session.post(self.url + "/v1/completions", json=payload) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"router on {self.url} not ready after {timeout}s")

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)
        self.log.close()


# --- the benchmark -------------------------------------------------------------------------------------------


CALIBRATION_CLIENTS = 24  # on the one engine calibrated: enough to keep its batch full whatever the latency
# Closed-loop clients per engine at full load: as many as the calibration keeps one engine saturated with.
# Decode steps batch for free (memory-bound), so an engine is only saturated once prefill fills its time: with a
# few clients per engine every policy is latency-bound by the decode and delivers the same tokens/s (measured:
# identical to 3 digits at 3 per engine); saturated, the work a policy saves (cache hits) or wastes (idle
# engines beside piled-up ones) decides the tokens delivered.
CLOSED_CLIENTS_PER_ENGINE = CALIBRATION_CLIENTS


def closed_clients(level: float) -> int:
    """Closed-loop clients for a workload run at ``level`` of capacity."""
    return max(1, round(level * CLOSED_CLIENTS_PER_ENGINE * ENGINES))


def decode_bound_tok_s(clients: int) -> float:
    """Closed-loop output tokens/s that no routing can exceed on the shared-prefix workloads, from the engines'
    own step model: every engine holds exactly clients / ENGINES requests and every step is a pure decode step
    of them (every prompt cached, no step spent waiting or prefilling, no time between a request's end and
    the client's next). A step of ``b`` sequences yields ``b`` tokens; the tokens/s ``b / step(b)`` is concave
    in ``b`` (the step's cost is weights read once plus KV read per sequence), so an even split of the clients
    and a constant batch is the best any placement can do. Engines serve ``TIME_SCALE`` x modelled time."""
    from tokenyard.core.tokenizer import Tokenizer

    deployment = engine_options(TIME_SCALE, KV_BLOCKS).deployment()
    tokenizer = Tokenizer(deployment.model.vocab_size)  # the engines' own token counts
    rng = random.Random(0)
    samples = [shared_prefix_body(rng, tenant_prompts())["prompt"] for _ in range(64)]
    prompt_tokens = sum(len(tokenizer.encode(text)) for text in samples) / len(samples)
    context = round(prompt_tokens + OUTPUT_TOKENS / 2)  # a request's mean context over its decode steps
    batch = clients / ENGINES
    return ENGINES * batch / deployment.decode_step_seconds(batch, context) / TIME_SCALE


async def calibrate(session, engines: list[str], workload: Workload) -> float:
    """Requests/s the fleet sustains on ``workload``'s requests (closed loop): what one engine sustains, times
    the fleet size; on a mixed fleet (SIM_GPUS), one engine of each kind, times the engines of its kind."""
    if not MIXED_FLEET:
        return await calibrate_one(session, engines[0], workload) * len(engines)
    total = 0.0
    for kind in dict.fromkeys(SIM_GPUS):
        indices = [i for i in range(len(engines)) if engine_gpu(i) == kind]
        one = await calibrate_one(session, engines[indices[0]], workload)
        print(f"{workload.name}: one {kind} engine sustains ~{one:.2f} req/s", flush=True)
        total += one * len(indices)
    return total


async def calibrate_one(session, engine: str, workload: Workload) -> float:
    """Requests/s one engine sustains on ``workload``'s requests (closed loop)."""
    engines = [engine]
    dispatcher = Dispatcher("direct", engines, None)
    requests = open_requests(workload, 100, 20, seed=99)  # ~2000 prompts, reused in a cycle
    concurrency, stop_at, done = CALIBRATION_CLIENTS, time.monotonic() + (6 if QUICK else 10), 0
    feed = itertools.cycle(requests)
    await flush_caches(session, engines)

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            request = next(feed)
            result = await send(session, dispatcher, request.path, request.body)
            done += result.ok

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.monotonic() - started)


async def run_slice(
    session,
    engines,
    policy: str,
    workload: Workload,
    rate: float,
    seconds: float,
    seed: int,
    closed_clients: int,
) -> PolicyRun:
    """One policy's share of one round: a fresh router and empty engine caches, the open-loop arrivals of
    this round's seed for ``seconds``, then (when ``closed_clients``) the closed loop, on the caches and the
    router state the open loop left."""
    await flush_caches(session, engines)
    direct = policy in ("round_robin", "least_outstanding")
    router = None if direct else RouterProcess(policy, engines)
    try:
        if router:
            await router.ready(session)
        dispatcher = Dispatcher(policy, engines, router.url if router else None)
        await flush_caches(session, engines, router_attached=True)  # the warm-up must leave no cached prefix
        before = await engine_counters(session, engines)
        if workload.body is None:
            results, _ = await run_multi_turn(session, dispatcher, rate, seconds, seed=3 + 100 * seed)
        else:
            results, _ = await run_open_loop(
                session,
                dispatcher,
                open_requests(workload, rate, seconds, 1 + 100 * seed),
                f"{policy}/{workload.name}/{seed}" if TRACE_PATH else None,
            )
        after = await engine_counters(session, engines)
        closed, closed_tokens, closed_elapsed, closed_deltas = [], 0, 0.0, []
        if closed_clients:
            closed, closed_tokens, closed_elapsed = await run_closed_loop(
                session, dispatcher, workload, closed_clients, CLOSED_SECONDS / ROUNDS
            )
            closed_deltas = counter_deltas(after, await engine_counters(session, engines))
        rounds = [closed_tokens / closed_elapsed] if closed_elapsed else []
        ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
        overlap = [await router_overlap(session, router.metrics_url)] if router and router.metrics_url else []
        return PolicyRun(
            results,
            counter_deltas(before, after),
            closed,
            closed_tokens,
            closed_elapsed,
            closed_deltas,
            rounds,
            [(percentile(ttfts, 0.9), percentile(ttfts, 0.99))],
            overlap,
        )
    finally:
        if router:
            router.stop()


async def run_workload(
    session, engines, workload: Workload, rate: float, seconds: float, closed_clients: int
) -> dict[str, PolicyRun]:
    """ROUNDS rounds of ``seconds`` of open loop each; in each, every policy gets the same arrivals, in an order rotated round by round, so that
    a burst of load from other processes on the machine falls on all policies alike rather than on one."""
    runs: dict[str, PolicyRun] = {}
    for round_index in range(ROUNDS):
        order = POLICIES[round_index % len(POLICIES) :] + POLICIES[: round_index % len(POLICIES)]
        for policy in order:
            part = await run_slice(
                session,
                engines,
                policy,
                workload,
                rate,
                seconds,
                round_index,
                closed_clients,
            )
            seen = runs.get(policy)
            if seen is None:
                runs[policy] = part
            else:
                seen.open_results += part.open_results
                seen.deltas = add_deltas(seen.deltas, part.deltas)
                seen.closed_results += part.closed_results
                seen.closed_tokens += part.closed_tokens
                seen.closed_rounds += part.closed_rounds
                seen.ttft_rounds += part.ttft_rounds
                seen.overlap_rounds += part.overlap_rounds
                seen.closed_elapsed += part.closed_elapsed
                seen.closed_deltas = add_deltas(seen.closed_deltas, part.closed_deltas)
    return runs


OVERHEAD_ROUTERS = ("tokenyard", "sglang:defaults", "vllm:defaults")
# A labelled floor row of the overhead table, not a peer: a bare aiohttp proxy (bench/passthrough_proxy.py) on
# the router's HTTP stack, doing nothing else. tokenyard's hop less its hop is what tokenyard's own work costs.
PASSTHROUGH = "passthrough (floor)"


async def overhead(session, engines) -> dict[str, dict[str, float]]:
    """Per router process (tokenyard, the peers and the PASSTHROUGH floor, all running at once): the added
    latency of its hop (sequential small requests, interleaved direct / through each router so that all see the
    same machine load) and the requests/s it sustains alone (closed loop, 64 clients, tiny requests; one router
    at a time)."""
    names = [name for name in OVERHEAD_ROUTERS if name == "tokenyard" or name in POLICIES] + [PASSTHROUGH]
    routers = {name: RouterProcess(name, engines) for name in names}
    try:
        for router in routers.values():
            await router.ready(session)
        body = {"model": MODEL, "prompt": "ping", "max_tokens": 1}

        async def timed(url: str) -> float:
            started = time.monotonic()
            async with session.post(url + "/v1/completions", json=body) as response:
                await response.read()
                assert response.status == 200, response.status
            return time.monotonic() - started

        samples = 100 if QUICK else 300
        direct: list[float] = []
        routed: dict[str, list[float]] = {name: [] for name in routers}
        for i in range(samples):
            direct.append(await timed(engines[i % len(engines)]))
            for name, router in routers.items():
                routed[name].append(await timed(router.url))
        figures: dict[str, dict[str, float]] = {}
        for name, router in routers.items():
            done = 0

            async def client(url: str, stop_at: float) -> None:
                nonlocal done
                while time.monotonic() < stop_at:
                    await timed(url)
                    done += 1

            started = time.monotonic()
            until = started + (4 if QUICK else 8)
            await asyncio.gather(*(client(router.url, until) for _ in range(64)))
            figures[name] = {
                "added_p50_ms": round((percentile(routed[name], 0.5) - percentile(direct, 0.5)) * 1000, 3),
                "added_p99_ms": round((percentile(routed[name], 0.99) - percentile(direct, 0.99)) * 1000, 3),
                "max_rps": round(done / (time.monotonic() - started), 1),
            }
        return figures
    finally:
        for router in routers.values():
            router.stop()


async def main() -> None:
    try:
        engines = await FLEET.start()
        timeout = aiohttp.ClientTimeout(total=300)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            capacity = await calibrate(session, engines, ALL_WORKLOADS["shared_prefix_70"])
            print(FLEET.describe(capacity), flush=True)
            results: dict[str, dict[str, dict[str, float]]] = {}
            measured: dict[str, dict] = {}  # workload -> the run record when it was measured
            print(
                f"TTFT, hit rate and imbalance: open loop (Poisson arrivals at the rate shown), {ROUNDS} rounds "
                f"of {RUN_SECONDS / ROUNDS:.0f}s per policy (longer where a workload's rate would send a policy fewer "
                f"than {MIN_REQUESTS} requests in all); out tok/s: closed loop (the clients shown, each "
                f"sending its next request when its last ended), counted over {ROUNDS} windows of "
                f"{CLOSED_SECONDS / ROUNDS:.1f}s, each after a {CLOSED_WARMUP_SECONDS:.0f}s warm-up, one per round",
                flush=True,
            )
            header = (
                f"{'workload':<18}{'policy':<20}{'rate/s':>7}{'clients':>8}{'ttft p50 s':>11}{'ttft p90 s':>11}"
                f"{'ttft p99 s':>11}"
                f"{'out tok/s':>10}{'hit rate':>9}{'imbal':>7}{'errors':>7}{'closed hits':>12}{'preempt%':>9}"
                "  tok/s by round; ttft p99 by round"
            )
            print(header, flush=True)
            announced_held_out = False
            for name in WORKLOADS:
                spec = ALL_WORKLOADS[name]
                own = await calibrate(session, engines, spec) if spec.own_calibration else capacity
                if spec.own_calibration:
                    print(f"{name}: capacity on its own requests ~{own:.1f} req/s", flush=True)
                if not spec.tuning and not announced_held_out:
                    announced_held_out = True
                    print("held-out families (the defaults were not chosen on these):", flush=True)
                rate = spec.level * own
                clients = closed_clients(spec.level)
                per_round = open_loop_seconds(rate, RUN_SECONDS, ROUNDS, MIN_REQUESTS)
                if per_round > RUN_SECONDS / ROUNDS:
                    print(
                        f"{name}: {per_round:.0f}s of open loop per round, for {MIN_REQUESTS} requests",
                        flush=True,
                    )
                runs = await run_workload(session, engines, spec, rate, per_round, clients)
                workload = name
                # the decode bound comes from tokenyard.sim's step model of one GPU: none for another engine, nor
                # for a mixed fleet
                shared = (
                    workload.startswith("shared_prefix")
                    and ENGINE_KIND == "tokenyard-sim"
                    and not MIXED_FLEET
                )
                bound = decode_bound_tok_s(clients) if shared else None
                results[workload] = {}
                for policy in POLICIES:
                    figures = summarise(runs[policy])
                    if bound:
                        figures["output_share_of_decode_bound"] = round(figures["output_tok_s"] / bound, 3)
                    results[workload][policy] = figures
                    print(
                        f"{workload:<18}{policy:<20}{rate:>7.1f}{clients:>8}{figures['ttft_p50_s']:>11.3f}"
                        f"{figures['ttft_p90_s']:>11.3f}"
                        f"{figures['ttft_p99_s']:>11.3f}{figures['output_tok_s']:>10.0f}"
                        f"{figures['prefix_hit_rate']:>9.3f}{figures['imbalance']:>7.2f}{figures['errors']:>7}"
                        f"{figures['closed_prefix_hit_rate']:>12.3f}{figures['closed_preemptions']:>9.1f}  "
                        + " ".join(f"{value:.0f}" for value in figures["output_tok_s_rounds"])
                        + "; "
                        + " ".join(f"{value:.2f}" for value in figures["ttft_p99_s_rounds"]),
                        flush=True,
                    )
                if bound:
                    shares = ", ".join(
                        f"{policy} {results[workload][policy]['output_share_of_decode_bound']:.1%}"
                        for policy in POLICIES
                    )
                    print(
                        f"{workload:<18}closed-loop decode bound {bound:.0f} tok/s "
                        f"(decode_bound_tok_s: every prompt cached, even batches, no wait); reached: {shares}",
                        flush=True,
                    )
                measured[workload] = run_record()
                save_results(results, measured, keep_others=True)
            if os.environ.get("BENCH_OVERHEAD", "1") != "0":  # "0": quick experiments on a few workloads
                results["overhead"] = await overhead(session, engines)
                measured["overhead"] = run_record()
                save_results(results, measured, keep_others=True)
                ours = results["overhead"]["tokenyard"]
                for name, o in results["overhead"].items():
                    ratio = ""
                    if name == PASSTHROUGH:
                        own = ours["added_p50_ms"] - o["added_p50_ms"]
                        ratio = f"; tokenyard's own work (its hop less this floor): +{own:.3f} ms p50"
                    elif name != "tokenyard" and o["added_p99_ms"] > 0:
                        ratio = (
                            f"; tokenyard's hop p99 is {ours['added_p99_ms'] / o['added_p99_ms']:.2f}x this"
                        )
                    print(
                        f"router overhead, {name}: +{o['added_p50_ms']} ms p50, +{o['added_p99_ms']} ms p99 per "
                        f"request; one process sustains {o['max_rps']} req/s (load generator on the same 2 cores)"
                        + ratio
                    )
    finally:
        FLEET.stop()
    print(json.dumps(results_payload(results)))
    save_results(results, measured, keep_others=MERGE)


def results_payload(results: dict) -> dict:
    # which rows are a peer tuned on the tuning workloads, and which are extra tokenyard configurations (labelled
    # as such in bench/report.py's table, never the headline)
    return {
        "bench": "router",
        "engine": ENGINE_KIND,
        "tuned_peers": [SGLANG_TUNED],
        "tokenyard_variants": list(VARIANTS),
        "results": results,
    }


def save_results(results: dict, measured: dict[str, dict], keep_others: bool) -> None:
    """Writes the workloads measured so far, each with its run record; ``keep_others``: also the workloads of
    the file already there that this run has not measured (with their own records)."""
    # a run on other engines, or on a mixed fleet, must not overwrite the figures of the default fleet
    if ENGINE_KIND != "tokenyard-sim":
        name = "router-llm-d"
    else:
        name = "router-mixed-fleet" if MIXED_FLEET else "router"
    previous = read_results(name) if keep_others else None
    write_results(name, merge_parts(previous, results_payload(results), measured))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-host", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=ENGINES)
    parser.add_argument("--time-scale", type=float, default=TIME_SCALE)
    parser.add_argument("--blocks", type=int, default=KV_BLOCKS)
    parser.add_argument("--port-file")
    args = parser.parse_args()
    if args.engine_host:
        asyncio.run(host_engines(args.count, args.time_scale, args.blocks, args.port_file))
    else:
        asyncio.run(main())
