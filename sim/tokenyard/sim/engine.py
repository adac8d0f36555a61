"""The engine core: continuous batching over a paged KV cache with prefix caching. Pure: time is passed in.

Modelled on vLLM's V1 scheduler (vllm/v1/core/sched/scheduler.py) and block pool (vllm/v1/core/block_pool.py):

- Every step rebuilds the batch under a token budget (`max_num_batched_tokens`): running requests first, in
  arrival order, each asking for all the tokens it has not computed yet (a whole prompt chunk, or the one token
  it sampled last step), then waiting requests, first come first served, while the budget, `max_num_seqs` and
  the KV cache allow. A prompt larger than the remaining budget is prefilled in chunks over several steps.
- The KV cache is a pool of blocks of `block_size` tokens. A full block is identified by a chained hash of its
  tokens (the hash of the previous block and its own token ids), so equal prefixes give equal hashes. Blocks are
  reference-counted; when a request ends, its blocks keep their hash and go to the back of a free queue, from
  which allocation takes the front: least recently used first, and within one request its last block first.
  A new request first looks up its prompt's block hashes; the leading run of hits is reused and skips prefill.
- Admission keeps a watermark of free blocks (a fraction of the pool) so running requests can grow.
- When a running request cannot get a block, the newest running request is preempted: its blocks are released
  and it goes back to the front of the queue to be recomputed later (its prompt and the tokens it had generated),
  which often hits the prefix cache for what has not been evicted yet.

A step returns its modelled duration (from `tokenyard.sim.model`) and what it produced; the adapter sleeps for
that long (times its time scale) and then delivers the tokens. Timestamps on requests are in the caller's clock.

Output tokens are synthetic: the generator picks words deterministically from the prompt's hash. Without
`ignore_eos` a request ends by itself ("stop") after a natural length drawn from the same hash, which stands in
for the model emitting end-of-sequence: log-normal (median NATURAL_LENGTH_MEDIAN tokens, sigma
NATURAL_LENGTH_SIGMA) between `NATURAL_LENGTH_MIN` and `NATURAL_LENGTH_MAX` tokens. Heavy-tailed like real chat
answers (most short, a few very long), so that a router cannot tell a request's length from its cap.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from statistics import NormalDist
from typing import Protocol

from tokenyard.sim.model import Deployment, StepShape

NATURAL_LENGTH_MIN = 16
NATURAL_LENGTH_MAX = 1024
NATURAL_LENGTH_MEDIAN = 64
NATURAL_LENGTH_SIGMA = 1.0  # p90 ~230 tokens, p99 ~660
# vLLM V0's block manager kept 1 percent of the blocks free at admission (BlockSpaceManager watermark=0.01).
WATERMARK_FRACTION = 0.01
_ROOT_HASH = 0


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class TokenSource(Protocol):
    def generated_token(self, seed: int, index: int) -> int: ...


def natural_length(seed: int) -> int:
    """The output length at which a request of this prompt hash ends by itself (see the module's docstring)."""
    quantile = ((seed % 1_000_003) + 0.5) / 1_000_003
    z = NormalDist().inv_cdf(quantile)
    length = round(NATURAL_LENGTH_MEDIAN * math.exp(NATURAL_LENGTH_SIGMA * z))
    return min(NATURAL_LENGTH_MAX, max(NATURAL_LENGTH_MIN, length))


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False


@dataclass(frozen=True)
class SchedulerConfig:
    num_gpu_blocks: int
    max_model_len: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    watermark_fraction: float = WATERMARK_FRACTION
    enable_prefix_caching: bool = True
    # When a prompt's blocks join the prefix cache: as the step that computes them is scheduled (vLLM V1), or
    # after it ran (SGLang: the radix tree takes a prefill's KV in once the batch's forward is done,
    # ``cache_unfinished_req`` in the scheduler's prefill result handling).
    cache_when_scheduled: bool = True

    @classmethod
    def for_deployment(cls, d: Deployment, **overrides) -> SchedulerConfig:
        values = dict(
            num_gpu_blocks=d.num_gpu_blocks,
            max_model_len=d.max_model_len,
            block_size=d.block_size,
            max_num_batched_tokens=d.max_num_batched_tokens,
            max_num_seqs=d.max_num_seqs,
        )
        values.update(overrides)
        return cls(**values)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float
    seed: int
    natural_length: int
    all_ids: list[int] = field(default_factory=list)  # prompt then output
    num_computed: int = 0  # tokens whose KV is in the cache
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the full blocks of all_ids, in order
    num_registered: int = 0  # leading blocks of `blocks` already offered to the prefix cache
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None  # prefix-cache hit at first admission
    num_preemptions: int = 0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.all_ids[len(self.prompt_ids) :]


@dataclass
class StepOutcome:
    start_s: float
    duration_s: float
    shape: StepShape
    tokens: list[tuple[Request, int]]  # (request, token id sampled this step)
    finished: list[Request]
    admitted: list[Request]  # requests that left the queue this step (first time or after a preemption)
    preempted: list[Request]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class BlockPool:
    """Reference-counted KV blocks with a hash -> block prefix cache and LRU eviction."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # The free queue is the never-used blocks (ids from _next_fresh up) followed by released blocks in LRU
        # order. Released blocks always queue behind every never-used one, so the never-used part is kept as a
        # counter: an engine with 50,000 blocks costs nothing until it is used.
        self._next_fresh = 0
        self._free: OrderedDict[int, None] = OrderedDict()  # released blocks, front = evicted first
        self._cached: dict[int, int] = {}  # block hash -> block id

    @property
    def num_free(self) -> int:
        """Blocks nobody references (some still hold a cached prefix and are reused until evicted)."""
        return self.num_blocks - self._next_fresh + len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def lookup(self, hashes: list[int]) -> list[int]:
        """Blocks of the leading run of `hashes` that are cached."""
        hits: list[int] = []
        if not self.enable_caching:
            return hits
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_unreferenced(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        fresh = min(n, self.num_blocks - self._next_fresh)
        out = list(range(self._next_fresh, self._next_fresh + fresh))
        self._next_fresh += fresh
        for b in out:
            self._ref[b] = 1
        for _ in range(n - fresh):
            b, _ = self._free.popitem(last=False)
            h = self._hash[b]
            if h is not None:  # evict the cached prefix this block held
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
            self._ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        # Reverse order: a request's last blocks are the least likely to be shared, so they go first.
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def evict_unreferenced(self) -> int:
        """Forget every cached prefix no running request holds (SGLang's /flush_cache). Returns how many."""
        evicted = 0
        for b in self._free:
            h = self._hash[b]
            if h is not None:
                if self._cached.get(h) == b:
                    del self._cached[h]
                self._hash[b] = None
                evicted += 1
        return evicted

    def register(self, block: int, block_hash: int) -> None:
        """Record that `block` now holds the full block identified by `block_hash`."""
        if not self.enable_caching or self._hash[block] is not None:
            return
        if block_hash not in self._cached:
            self._cached[block_hash] = block
            self._hash[block] = block_hash


class EngineError(ValueError):
    """A request the engine cannot take (empty, too long, bad parameters)."""


class Engine:
    """One engine's scheduler and KV cache. Not thread-safe; one caller drives it."""

    def __init__(
        self,
        config: SchedulerConfig,
        step_seconds: Callable[[StepShape], float],
        tokens: TokenSource,
    ) -> None:
        self.config = config
        self._step_seconds = step_seconds
        self._tokens = tokens
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._requests: dict[str, Request] = {}
        self._watermark_blocks = int(config.watermark_fraction * config.num_gpu_blocks)
        # cumulative counters (the /metrics counters read them)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0

    @classmethod
    def for_deployment(cls, d: Deployment, tokens: TokenSource, **overrides) -> Engine:
        return cls(SchedulerConfig.for_deployment(d, **overrides), d.step_seconds, tokens)

    # --- state ------------------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.pool.usage

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def get(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    # --- requests ---------------------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, now: float, sample: int = 0
    ) -> Request:
        """``sample``: which of a request's ``n`` samples this is; each draws its own words and natural length,
        as sampling with a temperature does (vLLM's children of one request get ``seed + index``)."""
        cfg = self.config
        if not prompt_ids:
            raise EngineError("the prompt is empty")
        if request_id in self._requests:
            raise EngineError(f"request id {request_id!r} is already in use")
        if params.max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if params.min_tokens < 0 or params.min_tokens > params.max_tokens:
            raise EngineError(f"min_tokens must be between 0 and max_tokens, got {params.min_tokens}")
        if len(prompt_ids) + params.max_tokens > cfg.max_model_len:
            raise EngineError(
                f"the context window is {cfg.max_model_len} tokens, but the request needs "
                f"{len(prompt_ids) + params.max_tokens} ({len(prompt_ids)} in the prompt, "
                f"{params.max_tokens} in the completion)"
            )
        seed = hash(tuple(prompt_ids)) & 0xFFFFFFFF  # ints hash the same in every process
        if sample:
            seed = hash((seed, sample)) & 0xFFFFFFFF
        natural = natural_length(seed)
        req = Request(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            params=params,
            arrival_s=now,
            seed=seed,
            natural_length=natural,
            all_ids=list(prompt_ids),
        )
        self._requests[request_id] = req
        self.waiting.append(req)
        return req

    def abort(self, request_id: str, now: float) -> Request | None:
        """End a request early (client gone, stop string seen). Returns it, or None when it already ended."""
        req = self._requests.get(request_id)
        if req is None or req.status is Status.FINISHED:
            return None
        if req.status is Status.WAITING:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        self._finish(req, FinishReason.ABORT, now)
        return req

    # --- one step ---------------------------------------------------------------------------------------------
    def step(self, now: float) -> StepOutcome | None:
        """Schedule and run one step starting at `now`. None when there is nothing to run."""
        if not self.has_work():
            return None
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        admitted: list[Request] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed, budget)
            if self._grow(req, req.num_computed + num_new):
                self._schedule(scheduled, req, num_new)
                budget -= num_new
                i += 1
                continue
            # Out of blocks: preempt the newest running requests until this one fits, or it is the newest.
            while True:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
                if self._grow(req, req.num_computed + num_new):
                    self._schedule(scheduled, req, num_new)
                    budget -= num_new
                    i += 1
                    break
            if victim is req:
                break

        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.waiting[0]
                num_new = self._admit(req, budget)
                if num_new is None:
                    break
                self.waiting.popleft()
                self.running.append(req)
                req.status = Status.RUNNING
                if req.first_scheduled_s is None:
                    req.first_scheduled_s = now
                admitted.append(req)
                self._schedule(scheduled, req, num_new)
                budget -= num_new

        if not scheduled:
            # Nothing fits (cannot happen with max_model_len <= the cache, kept as a guard against a busy loop).
            return None
        return self._run(now, scheduled, admitted, preempted)

    def _schedule(self, scheduled: list[tuple[Request, int]], req: Request, num_new: int) -> None:
        """``req`` computes ``num_new`` more tokens this step. Its blocks that those tokens fill are offered to
        the prefix cache now, before the step runs, as vLLM V1 does (``KVCacheManager.allocate_slots`` caches
        up to ``num_computed_tokens + num_new_tokens`` when it allocates, vllm/v1/core/kv_cache_manager.py): a
        request scheduled after it in the same step, such as the other samples of an ``n > 1`` request or the
        same system prompt arriving twice at once, finds them and skips their prefill. Safe here because a
        request scheduled in a step is never preempted in it (the victims are the newest running requests,
        those not yet scheduled). SGLang's blocks join after the step (``SchedulerConfig.cache_when_scheduled``)."""
        scheduled.append((req, num_new))
        if self.config.cache_when_scheduled:
            self._register_full_blocks(req, req.num_computed + num_new)

    def _run(
        self,
        now: float,
        scheduled: list[tuple[Request, int]],
        admitted: list[Request],
        preempted: list[Request],
    ) -> StepOutcome:
        num_tokens = pairs = kv_read = 0
        sampling: list[Request] = []
        for req, n in scheduled:
            before = req.num_computed
            num_tokens += n
            pairs += n * before + n * (n + 1) // 2
            kv_read += before
            req.num_computed = before + n
            if not self.config.cache_when_scheduled:
                self._register_full_blocks(req, req.num_computed)
            if req.num_computed == req.num_tokens:
                sampling.append(req)
        shape = StepShape(
            num_tokens=num_tokens, num_seqs=len(sampling), attention_pairs=pairs, kv_tokens_read=kv_read
        )
        duration = self._step_seconds(shape)
        end = now + duration
        self.steps += 1

        tokens: list[tuple[Request, int]] = []
        finished: list[Request] = []
        for req in sampling:
            index = req.num_output_tokens
            token = self._tokens.generated_token(req.seed, index)
            req.all_ids.append(token)
            tokens.append((req, token))
            self.generation_tokens += 1
            if index == 0:
                req.first_token_s = end
                self.prompt_tokens += req.num_prompt_tokens
            reason = self._finish_reason(req)
            if reason is not None:
                finished.append(req)
                self._finish(req, reason, end)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
        return StepOutcome(now, duration, shape, tokens, finished, admitted, preempted)

    def _finish_reason(self, req: Request) -> FinishReason | None:
        produced = req.num_output_tokens
        p = req.params
        if produced >= p.max_tokens or req.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        if not p.ignore_eos and produced >= req.natural_length and produced >= p.min_tokens:
            return FinishReason.STOP
        return None

    # --- KV blocks --------------------------------------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.config.block_size)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        """Give `req` enough blocks for `num_tokens` tokens. False (and nothing allocated) when short."""
        needed = self._blocks_for(num_tokens) - len(req.blocks)
        if needed <= 0:
            return True
        new = self.pool.allocate(needed)
        if new is None:
            return False
        req.blocks.extend(new)
        return True

    def _hashes_up_to(self, req: Request, num_blocks: int) -> list[int]:
        return self._ensure_hashes(req, num_blocks)[:num_blocks]

    def _ensure_hashes(self, req: Request, num_blocks: int) -> list[int]:
        """The request's chained block hashes, computed up to at least `num_blocks` (not a copy)."""
        bs = self.config.block_size
        hashes = req.block_hashes
        ids = req.all_ids
        while len(hashes) < num_blocks:
            k = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(hash((parent, tuple(ids[k * bs : (k + 1) * bs]))))
        return hashes

    def _register_full_blocks(self, req: Request, num_tokens: int) -> None:
        # Only the blocks that filled up since the last step: with SGLang's one-token pages a long request has
        # tens of thousands of blocks, and walking them all every step would cost more than the step models.
        if not self.pool.enable_caching:
            return
        full = num_tokens // self.config.block_size
        if full <= req.num_registered:
            return
        hashes = self._ensure_hashes(req, full)
        for i in range(req.num_registered, full):
            self.pool.register(req.blocks[i], hashes[i])
        req.num_registered = full

    def _admit(self, req: Request, budget: int) -> int | None:
        """Reserve blocks for `req`'s first chunk; the number of tokens it computes this step, or None."""
        bs = self.config.block_size
        # At least one token must be computed to sample from, so the last prompt token is never a hit.
        hits = self.pool.lookup(self._hashes_up_to(req, (req.num_tokens - 1) // bs))
        num_cached = len(hits) * bs
        num_new = min(req.num_tokens - num_cached, budget)
        needed = self._blocks_for(num_cached + num_new) - len(hits)
        free_after = self.pool.num_free - self.pool.num_unreferenced(hits) - needed
        if free_after < 0 or (free_after < self._watermark_blocks and self.running):
            return None
        self.pool.touch(hits)
        new = self.pool.allocate(needed)
        assert new is not None  # checked above
        req.blocks = hits + new
        req.num_registered = len(hits)  # cache hits hold their hash already
        req.num_computed = num_cached
        if req.num_cached_tokens is None:
            req.num_cached_tokens = num_cached
        self.prefix_cache_queries += req.num_tokens
        self.prefix_cache_hits += num_cached
        return num_new

    def _release(self, req: Request) -> None:
        self.pool.release(req.blocks)
        req.blocks = []
        req.num_registered = 0

    def _preempt(self, req: Request) -> None:
        self._release(req)
        req.num_computed = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, reason: FinishReason, now: float) -> None:
        self._release(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finished_s = now
        del self._requests[req.request_id]
