"""The demo's load generator: open-loop requests through the router at a rate that rises and falls.

`RateCycle` and `arrivals` are the pure part (a rate as a function of time, and the arrival times of a Poisson
process with that rate, by thinning); `LoadGenerator` sends the requests from a background thread with its own
event loop, so that the demo's main thread stays free to report and to stop on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class RateCycle:
    """Requests per second rising from `low` to `peak` and back over `period_s` (a raised cosine), repeated
    `cycles` times (then `low` for good; None: for ever)."""

    low: float
    peak: float
    period_s: float
    cycles: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.peak or self.peak <= 0:
            raise ValueError(f"need 0 <= low <= peak and peak > 0, got low={self.low} peak={self.peak}")
        if self.period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if self.cycles is not None and self.cycles < 1:
            raise ValueError(f"cycles must be at least 1 (or None: for ever), got {self.cycles}")

    def rate_at(self, t: float) -> float:
        if self.cycles is not None and t >= self.cycles * self.period_s:
            return self.low
        phase = (t % self.period_s) / self.period_s
        return self.low + (self.peak - self.low) * (1 - math.cos(2 * math.pi * phase)) / 2


def arrivals(cycle: RateCycle, rng: random.Random, start: float = 0.0) -> Iterator[float]:
    """Arrival times (seconds from the start of the cycle) of a Poisson process whose rate follows `cycle`:
    candidates at the peak rate, each kept with probability rate(t) / peak (Lewis and Shedler's thinning)."""
    t = start
    while True:
        t += rng.expovariate(cycle.peak)
        if rng.random() * cycle.peak < cycle.rate_at(t):
            yield t


def request_body(model: str, rng: random.Random, prompt_words: int, max_tokens: int, stream: bool) -> dict:
    """A completion of `max_tokens` tokens (no early stop, so the load is what the rate says) after a prompt of
    a shared system prefix and a question of random words (prefix caching helps, but never all of it); streamed
    token by token when `stream`, as chat clients do."""
    system = "You answer questions about replica groups, routing and autoscaling. " * 8
    question = " ".join(rng.choice(_WORDS) for _ in range(prompt_words))
    return {
        "model": model,
        "prompt": f"{system}\n{question}?",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


_WORDS = (
    "group replica token cache prefix router queue scale engine tensor pipeline rollout canary shadow weight "
    "revision node rack zone gpu latency decode prefill batch sequence block memory"
).split()


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    # arrivals skipped because `max_in_flight` requests were already waiting: the machine, not the fleet, is full
    skipped: int = 0
    in_flight: int = 0
    last_error: str = ""


class LoadGenerator:
    """Sends `request_body` completions to `url` (an OpenAI-compatible /v1/completions) at `cycle`'s rate,
    `stream_share` of them streamed."""

    def __init__(
        self,
        url: str,
        model: str,
        cycle: RateCycle,
        prompt_words: int = 600,
        max_tokens: int = 96,
        max_in_flight: int = 96,
        stream_share: float = 0.5,
        seed: int = 1,
    ):
        self.url, self.model, self.cycle = url, model, cycle
        self.prompt_words, self.max_tokens, self.max_in_flight = prompt_words, max_tokens, max_in_flight
        self.stream_share = stream_share
        self.rng = random.Random(seed)
        self.stats = LoadStats()
        self.started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def rate_now(self) -> float:
        return self.cycle.rate_at(self.elapsed())

    def start(self) -> LoadGenerator:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        """Stop sending; requests still in flight are cancelled (the router releases their accounting)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            tasks: set[asyncio.Task] = set()
            for at in arrivals(self.cycle, self.rng):
                while not self._stop.is_set() and self.elapsed() < at:
                    await asyncio.sleep(min(0.05, at - self.elapsed()))
                if self._stop.is_set():
                    break
                if self.stats.in_flight >= self.max_in_flight:
                    self.stats.skipped += 1
                    continue
                task = asyncio.create_task(self._one(session))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            for task in list(tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, session: aiohttp.ClientSession) -> None:
        stream = self.rng.random() < self.stream_share
        body = request_body(self.model, self.rng, self.prompt_words, self.max_tokens, stream)
        self.stats.sent += 1
        self.stats.in_flight += 1
        try:
            async with session.post(self.url, json=body) as response:
                await response.read()
                if response.status == 200:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
                    self.stats.last_error = f"HTTP {response.status}"
        except (TimeoutError, aiohttp.ClientError) as e:
            self.stats.failed += 1
            self.stats.last_error = f"{type(e).__name__}: {e}"
        finally:
            self.stats.in_flight -= 1
