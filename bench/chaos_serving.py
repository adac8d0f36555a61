"""Chaos for the serving path: kill a router, Redis or an engine under load and count what the clients lost.

One stack serves the whole run, every part a real process on 127.0.0.1: a redis-server (Debian's binary),
four simulated engines (``python -m tokenyard.sim serve``, time scale 5, a KV cache of 800 blocks each so
that where a tenant's prompt goes decides whether it is cached) and two routers (``python -m tokenyard.router``
with static backends, sharing load and prefix state through the Redis, otherwise at their shipped defaults:
probes every 2 s, ejection after 3 failures in a row). A load generator keeps 8 streamed completions in
flight (bench/router_workloads.py's shared-prefix workload on its 16 most popular tenants, 24 output tokens,
``ignore_eos``), sending each to the routers in turn as a Service would, and retrying once on the other
router on a connection error or a 503 before the status line (as a client or a Service retry would).

Scenarios, each repeated CHAOS_TRIALS times, every fault point drawn from one seeded RNG:

* router-kill: SIGKILL one router at a random moment; a replacement (a new router id, the same port) starts
  after the trial. Measured: the dead router's load hash held in Redis until its TTL (``stale_peer_load``),
  and the accounting once the load stops.
* redis-restart: SIGKILL redis-server at a random moment, restart it (empty) after a random outage. Measured:
  time until both routers report it down and back (``tokenyard_router_redis_up``), and routing quality in
  three phases (baseline before the kill, outage until both report it back, after): the engines' prefix-cache
  hit rate (``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` deltas over the four engines)
  and the load spread (busiest engine's request count over the mean).
* engine-crash: SIGKILL one engine while a client stream is reading from it; restart it after a random pause.
  Measured: time until every router reports it not routable (``tokenyard_router_replica_healthy`` 0,
  ``eject``; the gauge is exported once per probe round, so it can trail the router's own decision by up to
  one probe interval), and time from its /health answering again until a new request is routed to it
  (``recover``).
* engine-hang: SIGSTOP one engine while a client stream is reading from it, SIGCONT it once every router has
  ejected it (and a random extra pause). Measured: ``eject`` as above, ``recover`` from SIGCONT until a new
  request is routed to it, the requests routed into the hung engine and the clients' stalls.

Per request (see chaos_serving_summary.RequestRecord): failed before its stream started (no 200 status line
even after the retry; must be 0 everywhere), cut mid-stream (a 200 whose ``data: [DONE]`` never came; must be
0 where nothing that streamed went away: redis-restart, engine-hang), retried, stalled (waited 2 s or more
for its next byte).

Accounting drift, after each trial once the load stopped and every client request ended (must return to 0
within 10 s): the largest of (a) the sum over replicas of ``tokenyard_router_outstanding_tokens`` and
``tokenyard_router_outstanding_requests`` on each live router's /metrics - its own LoadLedger plus the
loads its live peers published - and (b) the sum of the ``tokens,requests`` values of every
``tokenyard:router:load:<router id>`` hash in Redis (each router's raw ledger: unlike the gauges, not clipped
at 0, so a negative drift shows there).

Run: ``.venv/bin/python bench/chaos_serving.py`` from the repository root. ``CHAOS_TRIALS`` (default 10),
``CHAOS_QUICK=1`` (3 trials), ``CHAOS_SEED`` (default: random, printed), ``CHAOS_ONLY`` (a comma-separated
subset, e.g. ``engine-hang``; chaos_operator.py's names are skipped here), ``CHAOS_LOG_DIR`` (keep the processes' logs there; default: a temporary folder). Prints a line per trial, one table and a final JSON line; exits 1 when a
must-be-zero quantity is not zero or a measured event never happened. Everything listens and dials on
127.0.0.1 only, and every process it started is stopped by its pid at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from chaos_operator import ALL_SCENARIOS as OPERATOR_SCENARIOS  # noqa: E402
from chaos_operator import (  # noqa: E402
    QUICK,
    SEED,
    SERVING_SCENARIOS,  # noqa: E402
    TRIALS,
    fmt,
)
from chaos_serving_summary import (  # noqa: E402
    CUT_MID_STREAM,
    RequestRecord,
    Scenario,
    Trial,
    error_kinds,
    quality_lines,
    summarize,
    table,
    violations,
)
from redis.asyncio.retry import Retry  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: E402
from redis.exceptions import RedisError  # noqa: E402
from results_io import write_results  # noqa: E402
from router_workloads import shared_prefix_body, tenant_prompts  # noqa: E402
from tokenyard.core.process import ManagedProcess  # noqa: E402
from tokenyard.router.proxy import carries_token  # noqa: E402
from tokenyard.router.shared import redis_keys  # noqa: E402

from tests.integration.router.conftest import RedisProcess, free_port, parse_metric  # noqa: E402

MODEL = "chaos-model"
ENGINES = 4
ENGINE_TIME_SCALE = 5.0  # a 24-token answer streams for ~1 s: a kill lands mid-stream
# The 16 most popular tenants' system prompts (~1,500 tokens each) against 800 blocks of 16 tokens per engine
# (~8 prompts beside the running requests): routed by prefix, every tenant stays cached on some engine; spread
# evenly, each engine would see all 16 and evict. Few enough that the caches are warm after the warm-up.
TENANTS = 16
ENGINE_KV_BLOCKS = 800
CONCURRENCY = 8
REDIS_KEY_PREFIX = "tokenyard:router"  # the routers' default (shared.RedisShare)
CLIENT_TIMEOUT_SECONDS = 60.0  # longer than any hang injected here: a stalled stream resumes, not times out
WARMUP_SECONDS = 4.0 if QUICK else 8.0  # caches warm before the first trial (not measured)
SETTLE_TIMEOUT_SECONDS = 10.0  # the routers' load TTL is 3 s
EVENT_TIMEOUT_SECONDS = 30.0  # an ejection, a recovery, Redis reported back: longer means it never happens
POLL_SECONDS = 0.05

# Fault points (seconds), drawn from the seeded RNG.
ROUTER_KILL_AT = (1.0, 3.0)  # after the load began
AFTER_ROUTER_KILL_LOAD = 2.0  # load kept on the survivor
REDIS_KILL_AT = (2.0, 3.0)
REDIS_OUTAGE = (2.0, 4.0)
AFTER_REDIS_BACK_LOAD = 2.5
ENGINE_FAULT_AT = (0.5, 1.5)
ENGINE_CRASH_DOWN = (0.5, 1.5)  # after every router ejected it, before it restarts
ENGINE_HANG_EXTRA = (0.0, 1.0)  # after every router ejected it, before SIGCONT

SCENARIOS = [
    Scenario("router-kill", zero_outcomes=(), times=("stale_peer_load", "settle")),
    Scenario("redis-restart", zero_outcomes=(CUT_MID_STREAM,), times=("redis_down", "redis_back", "settle")),
    Scenario("engine-crash", zero_outcomes=(), times=("eject", "recover", "settle")),
    Scenario("engine-hang", zero_outcomes=(CUT_MID_STREAM,), times=("eject", "recover", "settle")),
]


# ---------------------------------------------------------------------------------------------- processes
class Engine:
    """One ``tokenyard.sim serve`` process on a fixed port (a restart comes back at the same address)."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.paused = False
        args = ["tokenyard.sim", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--time-scale", str(ENGINE_TIME_SCALE), "--served-model-name", MODEL,
                "--num-gpu-blocks-override", str(ENGINE_KV_BLOCKS), "--log-level", "WARNING"]  # fmt: skip
        self.process = ManagedProcess(args, folder / f"engine-{name}.log")

    def start(self) -> None:
        self.process.start()

    def kill(self) -> None:
        self.process.stop(sig=signal.SIGKILL)

    def pause(self, paused: bool) -> None:
        os.kill(self.process.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)
        self.paused = paused

    def stop(self) -> None:
        if self.paused and self.process.alive():
            self.pause(False)  # a stopped process would not act on SIGTERM
        self.process.stop(timeout=10)


class Router:
    """One ``tokenyard.router`` process in slot ``slot`` (a, b); each start is a new pod: a new router id."""

    def __init__(self, slot: str, engines: list[Engine], redis_url: str, folder: Path) -> None:
        self.slot = slot
        self.engines = engines
        self.redis_url = redis_url
        self.folder = folder
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.generation = 0
        self.process: ManagedProcess | None = None

    @property
    def router_id(self) -> str:
        return f"chaos-{self.slot}{self.generation}"

    def start(self) -> None:
        self.generation += 1
        args = ["tokenyard.router", "--served-model", MODEL, "--redis-url", self.redis_url,
                "--router-id", self.router_id, "--host", "127.0.0.1", "--port", str(self.port),
                "--grpc-port", "-1", "--metrics-port", str(self.metrics_port), "--log-level", "INFO"]  # fmt: skip
        for engine in self.engines:
            args += ["--backend", f"{engine.name}={engine.url}"]
        self.process = ManagedProcess(args, self.folder / f"router-{self.slot}.log").start()

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def kill(self) -> None:
        assert self.process is not None
        self.process.stop(sig=signal.SIGKILL)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)

    async def metrics(self, session: aiohttp.ClientSession) -> str | None:
        """The router's /metrics text; None while it does not answer."""
        try:
            async with session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as response:
                return await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None


# ---------------------------------------------------------------------------------------------- the load
class Load:
    """CONCURRENCY clients, each sending streamed completions one after another until stopped; every request's
    record is kept in ``records`` from the moment it is sent."""

    def __init__(self, session: aiohttp.ClientSession, routers: list[Router], seed: int) -> None:
        self.session = session
        self.routers = routers
        self.seed = seed
        self.records: list[RequestRecord] = []
        prompts, weights = tenant_prompts()
        self.tenants = (prompts[:TENANTS], weights[:TENANTS])
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.began = 0.0
        self.ended = 0.0

    def start(self) -> Load:
        self.began = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._client(i, random.Random(self.seed * 1000 + i)))
            for i in range(CONCURRENCY)
        ]
        return self

    async def stop(self) -> None:
        """Stops sending; returns once every request sent has ended."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        self.ended = time.monotonic()

    def streaming_on(self, replica: str) -> int:
        """Requests whose answer from ``replica`` is streaming now (tokens arrived, not ended)."""
        return sum(1 for r in self.records if r.replica == replica and r.token_events and r.ended_at is None)

    def first_routed_to(self, replica: str, since: float) -> float | None:
        """When the first request sent at or after ``since`` got its status line from ``replica``."""
        times = [
            r.headers_at for r in self.records if r.replica == replica and r.started >= since and r.headers_at
        ]
        return min(times) if times else None

    async def _client(self, index: int, rng: random.Random) -> None:
        turn = index
        while not self._stop.is_set():
            first = self.routers[turn % len(self.routers)]
            turn += 1
            retry = self.routers[turn % len(self.routers)]
            body = {
                "model": MODEL,
                "stream": True,
                "ignore_eos": True,
                **shared_prefix_body(rng, self.tenants),
            }
            record = RequestRecord(router=first.slot, started=time.monotonic())
            self.records.append(record)
            try:
                await self._send(record, body, (first, retry))
            finally:
                record.ended_at = time.monotonic()

    async def _send(self, record: RequestRecord, body: dict, routers: tuple[Router, Router]) -> None:
        last_byte = record.started
        for attempt, router in enumerate(routers, 1):
            record.attempts = attempt
            try:
                async with self.session.post(router.url + "/v1/completions", json=body) as response:
                    now = time.monotonic()
                    record.max_wait_s = max(record.max_wait_s, now - last_byte)
                    last_byte = now
                    if response.status == 503 and attempt < len(routers):
                        record.error = f"{router.slot}: 503 {(await response.read())[:200]!r}"
                        continue
                    record.status, record.headers_at = response.status, now
                    record.replica = response.headers.get("x-tokenyard-replica", "")
                    if response.status != 200:
                        record.error = f"{router.slot}: {response.status} {(await response.read())[:200]!r}"
                        return
                    last_line = b""
                    async for line in response.content:
                        now = time.monotonic()
                        record.max_wait_s = max(record.max_wait_s, now - last_byte)
                        last_byte = now
                        last_line = line if line.strip() else last_line
                        if line.startswith(b"data: [DONE]"):
                            record.done = True
                        elif line.startswith(b'data: {"error"'):  # the router's word that the stream broke
                            record.error = (
                                f"{router.slot}: error event {line[6:206].decode(errors='replace')}"
                            )
                        elif carries_token(line):
                            record.token_events += 1
                    if (
                        not record.done and not record.error
                    ):  # it ended like a whole answer: truncated silently
                        record.error = (
                            f"{router.slot}: ended cleanly without [DONE] or an error event from "
                            f"{record.replica}; last line {last_line[:80]!r}"
                        )
                    return
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                record.error = f"{router.slot}: {error!r}"
                # Only a connection that failed before the status line is retried; a total timeout is not.
                retriable = isinstance(error, aiohttp.ClientConnectionError | OSError)
                if record.headers_at is not None or not retriable:
                    return


# ---------------------------------------------------------------------------------------------- the stack
class Stack:
    """The processes of one run and what the scenarios ask of them."""

    def __init__(self, folder: Path, session: aiohttp.ClientSession) -> None:
        self.folder = folder
        self.session = session
        self.redis = RedisProcess(free_port())
        # Retried once on a connection error: a pooled connection is dead after redis-restart's restart.
        self.redis_client = aioredis.from_url(
            self.redis.url,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )
        self.engines = [Engine(f"e{i}", folder) for i in range(ENGINES)]
        self.routers = [Router(slot, self.engines, self.redis.url, folder) for slot in "ab"]
        self.load_seeds = iter(range(1, 1 << 30))

    def start(self) -> None:
        self.redis.start()
        for engine in self.engines:
            engine.start()
        for router in self.routers:
            router.start()

    async def stop(self) -> None:
        await self.redis_client.aclose()
        for part in (*self.routers, *self.engines):
            with contextlib.suppress(Exception):
                part.stop()
        self.redis.stop()

    def load(self) -> Load:
        return Load(self.session, self.routers, SEED + next(self.load_seeds)).start()

    async def until(self, condition, timeout: float = EVENT_TIMEOUT_SECONDS) -> bool:
        """Polls ``condition`` (a function, async or not) until it holds (True) or ``timeout`` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            held = condition()
            if asyncio.iscoroutine(held):
                held = await held
            if held:
                return True
            await asyncio.sleep(POLL_SECONDS)
        return False

    async def elapsed_until(
        self, since: float, condition, timeout: float = EVENT_TIMEOUT_SECONDS
    ) -> float | None:
        return time.monotonic() - since if await self.until(condition, timeout) else None

    async def every_router(self, name: str, value: float, **labels: str) -> bool:
        for router in self.routers:
            text = await router.metrics(self.session)
            if text is None or parse_metric(text, name, **labels) != value:
                return False
        return True

    async def engine_answers(self, engine: Engine) -> bool:
        try:
            async with self.session.get(engine.url + "/health") as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def ready(self) -> None:
        """Every router answers, shares through Redis and routes to every engine (a trial's start state)."""

        async def all_ready() -> bool:
            for engine in self.engines:
                if not await self.every_router("tokenyard_router_replica_healthy", 1, replica=engine.name):
                    return False
            return await self.every_router("tokenyard_router_redis_up", 1)

        if not await self.until(all_ready, 60):
            raise RuntimeError(f"the stack did not become ready in 60 s; logs in {self.folder}")

    async def cache_tokens(self) -> tuple[float, float]:
        """The engines' prefix-cache hit and query tokens, summed (counters since each engine started)."""
        hits = queries = 0.0
        for engine in self.engines:
            async with self.session.get(engine.url + "/metrics") as response:
                text = await response.text()
            hits += parse_metric(text, "vllm:prefix_cache_hits_total") or 0.0
            queries += parse_metric(text, "vllm:prefix_cache_queries_total") or 0.0
        return hits, queries

    async def redis_loads(self) -> tuple[int, int]:
        """Outstanding tokens and requests summed over every router's load hash in Redis (raw ledger values)."""
        tokens = requests = 0
        async for key in self.redis_client.scan_iter(match=redis_keys(REDIS_KEY_PREFIX, "*")["load"]):
            for value in (await self.redis_client.hgetall(key)).values():
                t, _, n = value.decode().partition(",")
                tokens, requests = tokens + int(t), requests + int(n or 0)
        return tokens, requests

    async def accounting(self, routers: list[Router]) -> dict[str, tuple[int, int]]:
        """Each live router's view of outstanding tokens and requests, and Redis's, by where it was read."""
        views = {}
        for router in routers:
            text = await router.metrics(self.session)
            if text is not None:
                views[router.router_id] = (
                    int(parse_metric(text, "tokenyard_router_outstanding_tokens") or 0),
                    int(parse_metric(text, "tokenyard_router_outstanding_requests") or 0),
                )
        views["redis"] = await self.redis_loads()
        return views

    async def settle(self, trial: Trial, routers: list[Router], since: float) -> None:
        """Waits for the accounting to return to zero once the load ended; records the time and what is left."""
        views: dict[str, tuple[int, int]] = {}

        async def zero() -> bool:
            nonlocal views
            views = await self.accounting(routers)
            return all(v == (0, 0) for v in views.values())

        trial.times["settle"] = await self.elapsed_until(since, zero, SETTLE_TIMEOUT_SECONDS)
        trial.drift_tokens = max((abs(t) for t, _ in views.values()), default=0)
        trial.drift_requests = max((abs(n) for _, n in views.values()), default=0)
        if trial.drift_tokens or trial.drift_requests:
            trial.notes.append(
                f"accounting left after {SETTLE_TIMEOUT_SECONDS:g}s (tokens, requests): {views}"
            )

    async def wait_streaming(self, load: Load, engine: Engine, timeout: float = 5.0) -> int:
        """Waits until a client stream is reading from ``engine``; returns how many are."""
        await self.until(lambda: load.streaming_on(engine.name) > 0, timeout)
        return load.streaming_on(engine.name)


# ---------------------------------------------------------------------------------------------- scenarios
async def router_kill(stack: Stack, rng: random.Random) -> Trial:
    await stack.ready()
    victim = rng.choice(stack.routers)
    delay = rng.uniform(*ROUTER_KILL_AT)
    load = stack.load()
    await asyncio.sleep(delay)
    dead_load_key = redis_keys(REDIS_KEY_PREFIX, victim.router_id)["load"]
    victim.kill()
    killed = time.monotonic()
    trial = Trial(fault_at_s=killed - load.began)

    async def dead_load_gone() -> bool:
        return not await stack.redis_client.exists(dead_load_key)

    stale = asyncio.create_task(stack.elapsed_until(killed, dead_load_gone))
    await asyncio.sleep(AFTER_ROUTER_KILL_LOAD)
    await load.stop()
    trial.records = load.records
    trial.times["stale_peer_load"] = await stale
    await stack.settle(trial, [r for r in stack.routers if r is not victim], load.ended)
    victim.start()  # its replacement, for the next trial
    return trial


async def redis_restart(stack: Stack, rng: random.Random) -> Trial:
    await stack.ready()
    kill_at, outage = rng.uniform(*REDIS_KILL_AT), rng.uniform(*REDIS_OUTAGE)
    before = await stack.cache_tokens()
    load = stack.load()
    await asyncio.sleep(kill_at)
    at_kill = await stack.cache_tokens()
    stack.redis.stop()  # SIGKILL
    killed = time.monotonic()
    trial = Trial(fault_at_s=killed - load.began)
    down = asyncio.create_task(
        stack.elapsed_until(killed, lambda: stack.every_router("tokenyard_router_redis_up", 0))
    )
    await asyncio.sleep(outage)
    trial.times["redis_down"] = await down
    await asyncio.to_thread(stack.redis.start)  # empty: no persistence, as a restarted cache pod
    restarted = time.monotonic()
    trial.times["redis_back"] = await stack.elapsed_until(
        restarted, lambda: stack.every_router("tokenyard_router_redis_up", 1)
    )
    back = time.monotonic()
    at_back = await stack.cache_tokens()
    await asyncio.sleep(AFTER_REDIS_BACK_LOAD)
    at_end = await stack.cache_tokens()
    await load.stop()
    trial.records = load.records
    trial.phases = {"baseline": (load.began, killed), "outage": (killed, back), "after": (back, load.ended)}
    for phase, (start, end) in (("baseline", (before, at_kill)), ("outage", (at_kill, at_back)),
                                ("after", (at_back, at_end))):  # fmt: skip
        trial.cache_tokens[phase] = (end[0] - start[0], end[1] - start[1])
    await stack.settle(trial, stack.routers, load.ended)
    return trial


async def engine_fault(stack: Stack, rng: random.Random, hang: bool) -> Trial:
    """An engine SIGKILLed (``hang`` False) or SIGSTOPped mid-stream; ejection and recovery."""
    await stack.ready()
    victim = rng.choice(stack.engines)
    delay = rng.uniform(*ENGINE_FAULT_AT)
    extra = rng.uniform(*(ENGINE_HANG_EXTRA if hang else ENGINE_CRASH_DOWN))
    load = stack.load()
    await asyncio.sleep(delay)
    streaming = await stack.wait_streaming(load, victim)
    if hang:
        victim.pause(True)
    else:
        victim.kill()
    faulted = time.monotonic()
    trial = Trial(fault_at_s=faulted - load.began, counts={"streams_on_victim_at_fault": streaming})
    trial.times["eject"] = await stack.elapsed_until(
        faulted, lambda: stack.every_router("tokenyard_router_replica_healthy", 0, replica=victim.name)
    )
    await asyncio.sleep(extra)
    if hang:
        victim.pause(False)
        live_again = time.monotonic()
    else:
        victim.start()
        if not await stack.until(lambda: stack.engine_answers(victim), 30):
            trial.notes.append(f"engine {victim.name} did not answer /health within 30 s of its restart")
        live_again = time.monotonic()

    if await stack.until(lambda: load.first_routed_to(victim.name, live_again) is not None):
        trial.times["recover"] = load.first_routed_to(victim.name, live_again) - live_again
    await load.stop()
    trial.records = load.records
    if hang:  # known only now: a request sent into the hang got its status line after SIGCONT
        trial.counts["routed_into_hang"] = sum(
            1 for r in load.records if r.replica == victim.name and faulted <= r.started < live_again
        )
    await stack.settle(trial, stack.routers, load.ended)
    return trial


async def engine_crash(stack: Stack, rng: random.Random) -> Trial:
    return await engine_fault(stack, rng, hang=False)


async def engine_hang(stack: Stack, rng: random.Random) -> Trial:
    return await engine_fault(stack, rng, hang=True)


RUNNERS = {
    "router-kill": router_kill,
    "redis-restart": redis_restart,
    "engine-crash": engine_crash,
    "engine-hang": engine_hang,
}


assert set(RUNNERS) == set(SERVING_SCENARIOS), "chaos_operator.SERVING_SCENARIOS names these runners"


def chosen_scenarios() -> list[Scenario]:
    """The scenarios ``CHAOS_ONLY`` names (all when unset). `make chaos` runs chaos_operator.py with the same
    variable: its scenario names are left to it here, a name neither script knows is an error."""
    names = {n.strip() for n in os.environ.get("CHAOS_ONLY", "").split(",") if n.strip()}
    unknown = names - set(RUNNERS) - set(OPERATOR_SCENARIOS)
    if unknown:
        known = ", ".join([*RUNNERS, *OPERATOR_SCENARIOS])
        raise SystemExit(f"CHAOS_ONLY: unknown scenario(s) {', '.join(sorted(unknown))}; known: {known}")
    return [s for s in SCENARIOS if not names or s.name in names]


def trial_line(scenario: Scenario, number: int, trial: Trial) -> str:
    outcomes = {o: trial.count(o) for o in ("ok", "failed_before_stream", "cut_mid_stream")}
    times = ", ".join(f"{name} {fmt(trial.times.get(name))}s" for name in scenario.times)
    counts = "".join(f", {k} {v}" for k, v in trial.counts.items())
    errors = error_kinds(trial.records, limit=3)
    notes = (
        f" [{'; '.join([*trial.notes, *(f'{n}x {e}' for e, n in errors.items())])}]"
        if trial.notes or errors
        else ""
    )
    return (
        f"  {scenario.name} #{number}: fault at {trial.fault_at_s:.2f}s, {len(trial.records)} requests "
        f"({outcomes['ok']} ok, {outcomes['failed_before_stream']} failed before stream, "
        f"{outcomes['cut_mid_stream']} cut, {sum(r.retried for r in trial.records)} retried), {times}, "
        f"drift {trial.drift_tokens}/{trial.drift_requests}{counts}{notes}"
    )


async def run(folder: Path, scenarios: list[Scenario]) -> dict[str, dict]:
    rng = random.Random(SEED)
    results: dict[str, dict] = {}
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS, sock_connect=2.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        stack = Stack(folder, session)
        try:
            stack.start()
            await stack.ready()
            warmup = stack.load()
            await asyncio.sleep(WARMUP_SECONDS)
            await warmup.stop()
            print(f"  warm-up: {len(warmup.records)} requests in {WARMUP_SECONDS:g}s", flush=True)
            for scenario in scenarios:
                trials = []
                for i in range(TRIALS):
                    trial = await RUNNERS[scenario.name](stack, rng)
                    trials.append(trial)
                    print(trial_line(scenario, i + 1, trial), flush=True)
                results[scenario.name] = summarize(scenario, trials)
        finally:
            await stack.stop()
    return results


def main() -> int:
    scenarios = chosen_scenarios()
    if not scenarios:
        print("chaos_serving: CHAOS_ONLY names no serving scenario; nothing to run")
        return 0
    print(
        f"chaos_serving: seed {SEED} (CHAOS_SEED={SEED} repeats the fault points), {TRIALS} trials per scenario, "
        f"{ENGINES} engines, 2 routers, {CONCURRENCY} clients",
        flush=True,
    )
    keep = os.environ.get("CHAOS_LOG_DIR")
    with contextlib.ExitStack() as scope:
        folder = keep or scope.enter_context(tempfile.TemporaryDirectory(prefix="tokenyard-chaos-serving-"))
        Path(folder).mkdir(parents=True, exist_ok=True)
        try:
            results = asyncio.run(run(Path(folder), scenarios))
        except (RuntimeError, RedisError) as error:
            print(f"chaos_serving: error: {error}", file=sys.stderr)
            for log in sorted(Path(folder).glob("*.log")):
                print(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
            return 2
    for line in table(scenarios, results):
        print(line)
    for line in quality_lines(results):
        print(line)
    failures = [v for s in scenarios for v in violations(s, results[s.name])]
    for failure in failures:
        print(f"FAIL {failure}")
    verdict = {"pass": not failures, "violations": failures}
    outcome = {"bench": "chaos_serving", "seed": SEED, "results": results, "verdict": verdict}
    write_results("chaos_serving", outcome)
    print(json.dumps(outcome))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
