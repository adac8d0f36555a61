"""The router benchmark's workloads: what the clients send, as data (no I/O here).

Two kinds, kept apart on purpose (issue 14):
- TUNING workloads (shared_prefix_70, shared_prefix_95, no_sharing, multi_turn): the router's defaults
  (core.DEFAULT_WEIGHTS, the hot-spot guard, the peers' tuned settings) are chosen on these only;
- HELD-OUT families (zipf_tenants, tenant_surge, long_documents, unknown_output, mixed_lengths): never used to
  choose a default; the defaults are reported on them unchanged. A change of default justified by a held-out figure
  breaks the rule: the held-out figures would then be tuning figures too.

Every prompt is made of words from a small vocabulary; the simulated engines' tokenizer gives one token per
word here (~7 characters per token), so a router hashing character blocks at its default 4 characters per token
misjudges prompt lengths and cache capacity, as it would on a real tokenizer it was not told about.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river mountain forest ocean desert "
    "city village market harbor bridge tower garden library museum station airport castle temple palace "
    "engine turbine circuit signal network server cluster router gateway buffer kernel thread process "
    "invoice ledger account balance payment refund policy contract clause tenant customer support ticket"
).split()

TENANTS = 48
SYSTEM_WORDS = 1500
SUFFIX_WORDS = 40
OUTPUT_TOKENS = 24


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Request:
    path: str
    body: dict
    at: float  # seconds after the run's start


def zipf_weights(n: int, s: float = 0.8) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def poisson_times(rng: random.Random, rate: float, duration: float) -> list[float]:
    times, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return times
        times.append(t)


# --- tuning workloads ----------------------------------------------------------------------------------------


@functools.cache
def tenant_prompts() -> tuple[list[str], list[float]]:
    prompts = [
        f"Tenant {i} instructions. " + words(random.Random(1000 + i), SYSTEM_WORDS) for i in range(TENANTS)
    ]
    return prompts, zipf_weights(TENANTS)


def shared_prefix_body(rng: random.Random, tenants: tuple[list[str], list[float]] | None = None) -> dict:
    prompts, weights = tenants or tenant_prompts()
    return {
        "prompt": rng.choices(prompts, weights)[0] + "\nQuestion: " + words(rng, SUFFIX_WORDS),
        "max_tokens": OUTPUT_TOKENS,
    }


def unique_body(rng: random.Random, key: str) -> dict:
    return {"prompt": f"Request {key}. " + words(rng, SYSTEM_WORDS // 2), "max_tokens": OUTPUT_TOKENS}


# --- held-out families ---------------------------------------------------------------------------------------

# zipf_tenants: many tenants, popularity Zipf(1.0), system prompts of 1,500 to 4,000 tokens: together ~3x what
# the fleet's KV cache holds (8 x 2,048 blocks of 16), so where a tenant goes decides whether it is cached, and
# the popular ones must stay cached somewhere.
MANY_TENANTS = 256


def prompt_corpus(
    title: str, count: int, seed: int, length: tuple[int, int], zipf_s: float
) -> tuple[list[str], list[float]]:
    """``count`` texts ("<title> <i>. " and a number of words drawn in ``length``), with Zipf(zipf_s)
    popularity; text i depends only on ``seed + i``."""
    texts = []
    for i in range(count):
        rng = random.Random(seed + i)
        texts.append(f"{title} {i}. " + words(rng, rng.randint(*length)))
    return texts, zipf_weights(count, zipf_s)


@functools.cache
def many_tenant_prompts() -> tuple[list[str], list[float]]:
    return prompt_corpus("Tenant of many", MANY_TENANTS, 5000, (1500, 4000), 1.0)


def zipf_tenants_body(rng: random.Random, progress: float) -> dict:
    return shared_prefix_body(rng, many_tenant_prompts())


# tenant_surge: today's 48 tenants, until halfway through the run one cold tenant (the 21st most popular) jumps
# to 60% of all requests, as when a customer's batch job starts.
SURGE_TENANT = 20
SURGE_SHARE = 0.6


def tenant_surge_body(rng: random.Random, progress: float) -> dict:
    prompts, _ = tenant_prompts()
    if progress >= 0.5 and rng.random() < SURGE_SHARE:
        return {
            "prompt": prompts[SURGE_TENANT] + "\nQuestion: " + words(rng, SUFFIX_WORDS),
            "max_tokens": OUTPUT_TOKENS,
        }
    return shared_prefix_body(rng)


# long_documents: 24 documents of 5,000 to 9,000 tokens (about two thirds of the fleet's KV cache together: three or
# four fit on one engine), popularity Zipf(0.6), each request a short question about one of them.
DOCUMENTS = 24


@functools.cache
def documents() -> tuple[list[str], list[float]]:
    return prompt_corpus("Document", DOCUMENTS, 9000, (5000, 9000), 0.6)


def long_documents_body(rng: random.Random, progress: float) -> dict:
    docs, weights = documents()
    return {
        "prompt": rng.choices(docs, weights)[0] + "\nQuestion about the document above: " + words(rng, 20),
        "max_tokens": OUTPUT_TOKENS,
    }


# unknown_output: today's tenants, but the reply ends when the model says so: no ignore_eos, max_tokens a loose
# cap of 2,048 (what clients send). The simulated engines end a reply at a heavy-tailed natural length drawn from
# the prompt's hash (log-normal, median 64 tokens, p99 ~660: tokenyard.sim.engine.natural_length). A router sees
# the cap only, and what finished replies teach it.
OUTPUT_CAP = 2048


def unknown_output_body(rng: random.Random, progress: float) -> dict:
    body = shared_prefix_body(rng)
    body.update(max_tokens=OUTPUT_CAP, ignore_eos=False)
    return body


# mixed_lengths: chat traffic as public traces show it (ShareGPT, LMSYS-Chat): nothing shared, every prompt
# unique, its length log-normal (median 300 words, sigma 1.0: p10 ~80, p90 ~1,080, p99 ~3,100; clipped to 20 to
# 6,000; a word is a token on tokenyard.sim), and the reply ending by itself under a loose cap, as in unknown_output. Added on 2026-12-07, after the
# defaults were last chosen: where load must be judged by each prompt's own size, not counted in requests.
MIXED_PROMPT_MEDIAN, MIXED_PROMPT_SIGMA = 300, 1.0
MIXED_PROMPT_RANGE = (20, 6000)


def mixed_lengths_body(rng: random.Random, progress: float) -> dict:
    length = round(MIXED_PROMPT_MEDIAN * math.exp(rng.gauss(0.0, MIXED_PROMPT_SIGMA)))
    length = min(MIXED_PROMPT_RANGE[1], max(MIXED_PROMPT_RANGE[0], length))
    return {
        "prompt": f"Conversation {rng.random():.12f}. " + words(rng, length),
        "max_tokens": OUTPUT_CAP,
        "ignore_eos": False,
    }


# --- the registry ----------------------------------------------------------------------------------------------

BodyMaker = Callable[[random.Random, float], dict]  # (rng, progress through the run in [0, 1)) -> body


def open_loop_seconds(rate: float, run_seconds: float, rounds: int, min_requests: int) -> float:
    """Seconds of open loop per round at ``rate`` requests/s: ``run_seconds`` over the rounds, or longer where that
    would send a policy fewer than ``min_requests`` in all. At a few requests a second, 45 s make the p99 the
    two or three slowest requests of a policy (mixed_lengths on tokenyard.sim sent ~230, on llm-d 108), which
    one unlucky request decides."""
    if rate <= 0:
        raise ValueError(f"the open loop's rate must be positive, got {rate}")
    return max(run_seconds, min_requests / rate) / rounds


@dataclass(frozen=True)
class Workload:
    name: str
    level: float  # the open loop's rate as a share of the capacity measured for it
    tuning: bool  # True: the router's defaults may be chosen on it (see the module's docstring)
    # Completions body for the open and closed loops; None for multi_turn, whose conversations are driven by the
    # benchmark itself.
    body: BodyMaker | None
    # Capacity is measured on one engine with this workload's own requests (False: with shared_prefix's, as the
    # tuning workloads always have been, so that their rates stay comparable run to run).
    own_calibration: bool = False
    closed: bool = True  # run a closed loop after the open one


def _shared(rng: random.Random, progress: float) -> dict:
    return shared_prefix_body(rng)


def _unique(rng: random.Random, progress: float) -> dict:
    return unique_body(rng, f"{rng.random():.12f}")


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("shared_prefix_70", 0.70, True, _shared),
        Workload("shared_prefix_95", 0.95, True, _shared),
        Workload("no_sharing", 0.70, True, _unique),
        Workload("multi_turn", 0.70, True, None),
        Workload("zipf_tenants", 0.70, False, zipf_tenants_body, own_calibration=True),
        Workload("tenant_surge", 0.70, False, tenant_surge_body),
        Workload("long_documents", 0.70, False, long_documents_body, own_calibration=True),
        Workload("unknown_output", 0.70, False, unknown_output_body, own_calibration=True),
        Workload("mixed_lengths", 0.70, False, mixed_lengths_body, own_calibration=True),
    )
}


def open_requests(workload: Workload, rate: float, duration: float, seed: int) -> list[Request]:
    """Poisson arrivals at ``rate`` for ``duration`` seconds, bodies drawn in arrival order."""
    assert workload.body is not None, f"{workload.name} has no completions body"
    rng = random.Random(seed)
    return [
        Request("/v1/completions", workload.body(rng, t / duration), t)
        for t in poisson_times(rng, rate, duration)
    ]
