"""The router's state and the one call every routed request makes: ``RouterState.route``.

It joins the discovery view, the load ledger (local, plus peers' loads when Redis shares them), the engines'
scraped stats and the prefix index into replica snapshots, runs the pipeline, and records the decision (a
ticket in the ledger, the prompt's blocks in the index). No I/O, no clock: ``now`` and the random source come
from the caller.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tokenyard.router.accounting import (
    EjectionPolicy,
    FailureTracker,
    KvHold,
    LoadLedger,
    ReplicaLoad,
    Ticket,
)
from tokenyard.router.core import DEFAULT_FILTERS, DEFAULT_MISS_PENALTY, Pipeline
from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.enginestats import EngineStats
from tokenyard.router.framework import ReplicaSnapshot, RoutingDecision, RoutingRequest
from tokenyard.router.learned_sizes import BytesPerToken, ConcurrencyCap, OutputLength
from tokenyard.router.plugins.free_slot import has_free_slot
from tokenyard.router.plugins.kv_fits import KvFitsFilter
from tokenyard.router.plugins.not_saturated import SaturationLimits
from tokenyard.router.plugins.prefix_cache import HotSpotGuard
from tokenyard.router.plugins.revision import choose_revision
from tokenyard.router.prefix import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CAPACITY_BLOCKS,
    DEFAULT_CHARS_PER_TOKEN,
    PrefixIndex,
    PromptBlocks,
    Tokenizer,
    hash_prompt,
    private_blocks,
)
from tokenyard.router.tokenizing import TokenizerCache

# The smallest block the prefix index hashes. vLLM's blocks (8, 16, 32, ... tokens) are used as they are;
# SGLang's radix cache matches single tokens (its default page is 1 token), and hashing every token would make
# the index as large as the prompts, so a smaller page is grouped into whole pages of at least
# DEFAULT_BLOCK_SIZE tokens (a match is then at most one such block shorter than the engine's).
MIN_ROUTING_BLOCK_TOKENS = 8


DEFAULT_CAPACITY_TOKENS = DEFAULT_CAPACITY_BLOCKS * DEFAULT_BLOCK_SIZE  # until a replica reports its own
# A request of n answers teaches at most this many answers of their mean length (learn_output_tokens).
MAX_ANSWERS_LEARNED_AT_ONCE = 8

# An engine's report and the router's prediction differ a little even when the index is right: the engine
# matches whole blocks of its own size, the router counts its own blocks (character blocks whose size in tokens
# is an estimate without a tokenizer). A shortfall within these is not taken as an eviction.
FEEDBACK_TOLERANCE_BLOCKS = 2
FEEDBACK_TOLERANCE_SHARE = 0.1


def routing_block_size(engine_block: int | None) -> int:
    """Tokens per block of the prefix index for an engine whose KV block (page) holds ``engine_block``
    tokens: the engine's block itself, or a whole number of small pages; DEFAULT_BLOCK_SIZE when unknown."""
    if not engine_block or engine_block <= 0:
        return DEFAULT_BLOCK_SIZE
    if engine_block >= MIN_ROUTING_BLOCK_TOKENS:
        return engine_block
    return engine_block * -(-DEFAULT_BLOCK_SIZE // engine_block)


class RoutingError(Exception):
    """No replica for this request; ``status`` is the HTTP status the client gets."""

    def __init__(
        self, status: int, message: str, retry_after_s: int | None = None, attempted: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        # True when a replica was actually tried and failed (not merely: none was available to try).
        self.attempted = attempted


@dataclass
class RouterSettings:
    default_max_tokens: int = 256  # expected decode tokens when the request names none
    chars_per_token: int = DEFAULT_CHARS_PER_TOKEN
    metrics_max_age_s: float = 5.0  # older engine stats are unknown, not zero
    prefix_max_age_s: float | None = 600.0
    guard: HotSpotGuard = field(default_factory=HotSpotGuard)
    saturation: SaturationLimits = field(default_factory=SaturationLimits)
    ejection: EjectionPolicy = field(default_factory=EjectionPolicy)
    filters: tuple[str, ...] = DEFAULT_FILTERS
    weights: Mapping[str, float] | None = None  # None = core.DEFAULT_WEIGHTS; a ModelView's weights win
    retry_after_s: int = 1
    miss_penalty: float = DEFAULT_MISS_PENALTY  # see plugins.outstanding_tokens.expected_load
    prefill_interference: bool = False  # likewise
    batch_stretch: bool = True  # plugins.outstanding_tokens.expected_load's batch_cap; likewise
    guarded_load: bool = False  # the load guard also judges replicas with no configured batch size (core.py)
    # Count the prefill a replica has likely done on our oldest open prompt there (accounting.LoadLedger.prefill_done).
    # Off by default: on bench-router's tuning workloads (one run, 3 rounds, 2026-12-04, BENCH_VARIANTS) it removed
    # no_sharing's burst tail (TTFT p99 0.320 -> 0.270 s, rounds 0.31/0.41/0.30 -> 0.27/0.27/0.27; round robin
    # 0.265) with shared_prefix_70 unchanged, but shared_prefix_95's p99 rose 0.471 -> 0.559 and multi_turn's
    # 0.217 -> 0.243 (one round each), so by the rule next to core.DEFAULT_WEIGHTS it is not a default yet.
    # With the rate as a lower quartile from 5 samples (accounting.PrefillRate; 2026-12-06, same workloads,
    # bench/results/router-progress-quartile-2026-12-06.txt), defaults -> progress: no_sharing 0.335 -> 0.304
    # (round robin 0.266), shared_prefix_70 0.458 -> 0.459, shared_prefix_95 0.473 -> 0.470 (the harm gone),
    # multi_turn 0.209 -> 0.220 (p90 0.167 -> 0.179, worse in two rounds of three): still mixed, still off.
    # Trusted from the first sample instead, no_sharing's burst goes (0.332 -> 0.268) and shared_prefix_95's
    # pooled p99 comes back (0.467 -> 0.558, decided by a fresh router's first-round cold burst): README.
    prefill_progress: bool = False
    # Learn whether the engines prefill side by side (accounting.PrefillOverlap) and, where they do, count no
    # prefill owed as a replica's load. A default since 2026-12-07 (figures next to core.DEFAULT_WEIGHTS).
    prefill_overlap: bool = True
    # Charge a request's decode by its age: what the model's answers that ran as long still wrote
    # (learned_sizes.OutputLength.remaining), not a mean counted down. A default since 2026-12-07: on the tuning
    # workloads every answer has one length and it charges exactly the count-down (figures next to
    # core.DEFAULT_WEIGHTS).
    output_by_age: bool = True
    # An experiment, off by default: count at most this many of each request's remaining decode tokens as its
    # replica's load (None: all of them). A new prompt's first token waits for the steps its prefill takes, in
    # which each running request writes a token or so; the rest of a long answer is later work, which delays
    # nobody's first token. Peers' loads (Redis) are still counted whole. At 1 (2026-12-07): llm-d unknown_output's
    # hit rate 0.387 -> 0.441 (sglang-router's) with TTFT p90 / p99 unchanged, but tokenyard.sim multi_turn p99
    # 0.217 -> 0.240 and -1.7% tokens/s (bench/results/router-decode-horizon-*-2026-12-07.txt): not a default.
    decode_horizon: int | None = None
    # Correct the prefix index from the cached tokens engines report per request (learn_cached_tokens).
    prefix_feedback: bool = False
    # Ask the engine for a stream's usage when its client did not (openai_wire.ask_stream_usage), and hide it.
    stream_usage: bool = True


@dataclass
class Route:
    model: str
    endpoint: Endpoint
    ticket: Ticket
    decision: RoutingDecision
    prompt_tokens: int
    prefix_match_tokens: int
    shadow: bool = False
    namespace: str = ""  # the ModelDeployment's namespace; '' for static backends
    # When each block of the predicted match was last sent to the replica before this request (head first),
    # and how many tokens one block stands for: what learn_cached_tokens compares the engine's report with.
    match_last_used: tuple[float, ...] = ()
    tokens_per_block: float = 0.0
    # The prompt's blocks and its private ones, as indexed for the replica (a fallback that serves takes them).
    blocks: tuple[int, ...] = ()
    private_blocks: int = 0

    @property
    def revision(self) -> str:
        return self.endpoint.revision


class RouterState:
    def __init__(
        self,
        settings: RouterSettings | None = None,
        tokenizer: Tokenizer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings or RouterSettings()
        self.tokenizer = tokenizer  # the router's default; a model's spec.routing.tokenizer wins
        self.tokenizers = TokenizerCache()
        self.rng = rng or random.Random()
        self.models: dict[str, ModelView] = {}
        self.ledger = LoadLedger(self.settings.decode_horizon)
        self.failures = FailureTracker(self.settings.ejection)
        self.index = PrefixIndex(DEFAULT_CAPACITY_BLOCKS, self.settings.prefix_max_age_s)
        # KV capacity in tokens per replica, as its /metrics report it; the index's capacity in its own blocks
        # follows from it at each decision (a character block's size in tokens is learned, see learned_sizes).
        self.kv_capacity_tokens: dict[str, int] = {}
        self.bytes_per_token: dict[str, BytesPerToken] = {}  # per model: its tokenizer is its own
        self.output_lengths: dict[str, OutputLength] = {}  # per model
        self.stats: dict[str, EngineStats] = {}
        # Replicas whose health probes failed (scrape.EngineProber: /health and nothing else; /metrics never
        # makes a replica unreachable). The "healthy" filter drops them.
        self.unreachable: set[str] = set()
        self.peer_loads: dict[str, ReplicaLoad] = {}  # other routers' loads, summed (Redis)
        # inserts to publish to peers: replica, prompt block hashes, private blocks
        self.prefix_outbox: list[tuple[str, tuple[int, ...], int]] = []
        self.publish_prefixes = False
        self.prefix_corrections = 0  # times an engine's cached-token report corrected the index
        # Replicas (by URL) that refused the stream_options member the router adds to a stream
        # (openai_wire.refuses_stream_usage): their requests go as the client sent them.
        self.usage_refused: set[str] = set()
        # How many requests each replica runs at once, learned from its /metrics (record_stats): filter freeSlot.
        self.concurrency: dict[str, ConcurrencyCap] = {}
        self.fleet_concurrency = ConcurrencyCap.of_fleet()  # the same, judged over every replica's scrapes
        self.peer_caps: dict[str, int] = {}  # caps any router confirmed, shared through Redis (shared.py)
        self.running_seen = 0  # the most requests any replica here was scraped running (_note_running_seen)
        self.batch_sizes: dict[str, int] = {}  # replica -> its configured batch size (ModelView.batch_size)
        self._pipelines: dict[tuple[tuple[str, float], ...] | None, Pipeline] = {}

    # --- views -----------------------------------------------------------------------------------------

    def set_models(self, views: Mapping[str, ModelView]) -> list[Endpoint]:
        """Replace the model views; returns the endpoints that went away (their state is dropped)."""
        before = {e.name: e for e in self.endpoints()}
        self.models = dict(views)
        after = {e.name for e in self.endpoints()}
        self.batch_sizes = {
            endpoint.name: view.batch_size
            for view in self.models.values()
            if view.batch_size is not None
            for endpoint in view.endpoints
        }
        gone = [endpoint for name, endpoint in before.items() if name not in after]
        for endpoint in gone:
            self.index.forget(endpoint.name)
            self.failures.forget(endpoint.name)
            self.ledger.forget(endpoint.name)
            self.stats.pop(endpoint.name, None)
            self.kv_capacity_tokens.pop(endpoint.name, None)
            self.concurrency.pop(endpoint.name, None)
            self.fleet_concurrency.forget(endpoint.name)
            self.unreachable.discard(endpoint.name)
        if gone:
            self._note_running_seen()
        return gone

    def namespace_of(self, model: str) -> str:
        view = self.models.get(model)
        return view.namespace if view else ""

    def tokenizer_for(self, view: ModelView) -> Tokenizer | None:
        return self.tokenizers.get(view.tokenizer, view.served_name) or self.tokenizer

    def endpoints(self) -> list[Endpoint]:
        seen: dict[str, Endpoint] = {}
        for view in self.models.values():
            for endpoint in view.endpoints:
                seen.setdefault(endpoint.name, endpoint)
        return list(seen.values())

    def record_stats(self, replica: str, stats: EngineStats) -> None:
        self.stats[replica] = stats
        if stats.waiting is not None and stats.running is not None:
            self.concurrency.setdefault(replica, ConcurrencyCap()).observe(
                stats.running, stats.waiting, replica
            )
            self.fleet_concurrency.observe(stats.running, stats.waiting, replica)
            self._note_running_seen()
        if stats.kv_capacity_tokens:
            self.kv_capacity_tokens[replica] = stats.kv_capacity_tokens
        elif stats.num_gpu_blocks:
            self.kv_capacity_tokens[replica] = stats.num_gpu_blocks * routing_block_size(stats.block_size)

    def ratio_for(self, model: str) -> BytesPerToken:
        ratio = self.bytes_per_token.get(model)
        if ratio is None:
            ratio = self.bytes_per_token[model] = BytesPerToken(float(self.settings.chars_per_token))
        return ratio

    def output_length_for(self, model: str) -> OutputLength:
        return self.output_lengths.setdefault(model, OutputLength())

    def learn_output_tokens(
        self, model: str, output_tokens: int, reached_cap: bool = False, samples: int = 1
    ) -> None:
        """A request of ``model`` ended well after ``output_tokens`` output tokens (``reached_cap``: it stopped
        at the cap its client set, so the model would have written on). ``samples``: the answers those tokens
        were spread over (its ``n``; the engines' usage sums them); each is learned as one answer of their mean
        length, capped only when all of them reached the cap, and at most MAX_ANSWERS_LEARNED_AT_ONCE of them:
        their mean is one figure, and a thousand copies of it would crowd out every length seen before."""
        lengths = self.output_length_for(model)
        mean = round(output_tokens / samples)
        for _ in range(min(samples, MAX_ANSWERS_LEARNED_AT_ONCE)):
            lengths.observe(mean, reached_cap)

    def learn_prompt_tokens(self, model: str, prompt_bytes: int, prompt_tokens: int) -> None:
        """An engine counted ``prompt_tokens`` for a prompt of ``prompt_bytes`` bytes (its answer's usage)."""
        self.ratio_for(model).observe(prompt_bytes, prompt_tokens)

    def learn_cached_tokens(self, route: Route, cached_tokens: int) -> int:
        """The engine reports that ``cached_tokens`` of the routed prompt were in its prefix cache (vLLM's and
        SGLang's ``usage.prompt_tokens_details.cached_tokens``). Returns how many blocks the index dropped.

        Far fewer than the index predicted means the engine evicted the first block it lacked, and an LRU
        cache evicts its least recently used blocks first: everything the index last sent there no later
        than that block is gone too. Left in, those entries draw requests to a replica that then prefills
        them in full, while the router counts them as cheap. The blocks of this request itself were sent
        again just now and stay (the engine has just computed them).

        What engines send: vLLM 0.13 adds ``prompt_tokens_details`` only with --enable-prompt-tokens-details
        and only when some tokens were cached (entrypoints/openai/serving_completion.py: ``if
        self.enable_prompt_tokens_details and num_cached_tokens``), so a total miss reaches the router as no
        report at all and only a partial hit corrects the index; tokenyard.sim always reports, 0 included."""
        if not self.settings.prefix_feedback or route.tokens_per_block <= 0:
            return 0
        predicted_blocks = len(route.match_last_used)
        engine_blocks = math.floor(max(0, cached_tokens) / route.tokens_per_block)
        tolerance = FEEDBACK_TOLERANCE_BLOCKS + FEEDBACK_TOLERANCE_SHARE * predicted_blocks
        if predicted_blocks - engine_blocks <= tolerance:
            return 0
        dropped = self.index.forget_used_until(route.endpoint.name, route.match_last_used[engine_blocks])
        self.prefix_corrections += 1
        return dropped

    def forget_signals(self, replica: str) -> None:
        """The replica's /metrics could not be read: its scraped signals are unknown from now on, exactly as
        if they were stale; the cache geometry it reported before (block size, capacity) still holds."""
        stats = self.stats.get(replica)
        if stats is not None and stats.scraped_at != -math.inf:
            self.stats[replica] = replace(stats, scraped_at=-math.inf)

    def load(self, replica: str) -> ReplicaLoad:
        local = self.ledger.load(replica)
        peer = self.peer_loads.get(replica)
        if peer is None:
            return local
        return ReplicaLoad(local.tokens + peer.tokens, local.requests + peer.requests)

    def snapshot(self, endpoint: Endpoint, now: float) -> ReplicaSnapshot:
        load = self.load(endpoint.name)
        stats = self.stats.get(endpoint.name)
        fresh = stats is not None and stats.fresh(now, self.settings.metrics_max_age_s)
        return ReplicaSnapshot(
            name=endpoint.name,
            url=endpoint.url,
            revision=endpoint.revision,
            healthy=endpoint.name not in self.unreachable,
            ejected=self.failures.is_ejected(endpoint.name, now),
            # What the replica owes, less the prefill it has likely done since our oldest open prompt there was
            # sent (accounting.LoadLedger.prefill_done; requests of peer routers are counted whole).
            outstanding_tokens=max(
                0,
                round(
                    load.tokens
                    - self._prefill_done(endpoint.name, now)
                    - self.ledger.decode_beyond(endpoint.name)
                ),
            ),
            outstanding_requests=max(0, load.requests),
            kv_usage=stats.kv_usage if fresh and stats else None,
            queue_waiting=stats.waiting if fresh and stats else None,
            block_size=routing_block_size(stats.block_size if stats else None),
            kv_held_tokens=self.ledger.kv_held_tokens(endpoint.name),
            kv_capacity_tokens=self.kv_capacity_tokens.get(endpoint.name),  # only a reported figure
            concurrency=self.concurrency_of(endpoint.name),
            batch_size=self.batch_sizes.get(endpoint.name),
            running_seen=self.running_seen,
        )

    def _note_running_seen(self) -> None:
        """Once per scrape and per change of replicas, not per decision: snapshots are taken per request."""
        self.running_seen = max((learned.most_running for learned in self.concurrency.values()), default=0)

    def concurrency_of(self, replica: str) -> int | None:
        """Requests ``replica`` runs at once: the cap this router confirmed for it, else the one its peers
        confirmed (unless this router has seen it run more), else the fleet's, else unknown. Learned only; the
        configured batch size is ``batch_sizes`` (free_slot.slot_caps weighs the two)."""
        own = self.concurrency.get(replica)
        if own is not None and own.cap is not None:
            return own.cap
        peer = self.peer_caps.get(replica)
        if peer is not None and (own is None or own.most_running <= peer):
            return peer
        return self.fleet_concurrency.cap

    def cap_of(self, replica: str) -> int | None:
        """Requests ``replica`` runs at once as far as anything says: learned, else configured (for /metrics)."""
        learned = self.concurrency_of(replica)
        return learned if learned is not None else self.batch_sizes.get(replica)

    def confirmed_caps(self) -> dict[str, int]:
        """The caps this router has confirmed itself, by replica (what it shares with its peers)."""
        return {name: learned.cap for name, learned in self.concurrency.items() if learned.cap is not None}

    def contradicted_peer_caps(self) -> list[str]:
        """Replicas whose shared cap this router has seen exceeded: an engine restarted with a larger one."""
        return [
            name
            for name, cap in self.peer_caps.items()
            if name in self.concurrency and self.concurrency[name].most_running > cap
        ]

    def _prefill_done(self, replica: str, now: float) -> float:
        """Of the prefill the replica owes us, what no request sent there now would wait for: all of it where
        the engines prefill side by side (accounting.PrefillOverlap), else what it has likely done already."""
        if self.settings.prefill_overlap and self.ledger.prefills_side_by_side:
            return float(self.ledger.prefill_owed(replica))
        return self.ledger.prefill_done(replica, now) if self.settings.prefill_progress else 0.0

    def pipeline_for(self, view: ModelView) -> Pipeline:
        weights = view.weights if view.weights is not None else self.settings.weights
        key = tuple(sorted(weights.items())) if weights is not None else None
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            pipeline = Pipeline.from_config(
                weights,
                self.settings.filters,
                self.settings.guard,
                self.settings.saturation,
                self.settings.miss_penalty,
                self.settings.prefill_interference,
                self.settings.guarded_load,
                self.settings.batch_stretch,
            )
            self._pipelines[key] = pipeline
        return pipeline

    # --- the decision ----------------------------------------------------------------------------------

    def route(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        now: float,
        exclude: Iterable[str] = (),
        shadow: bool = False,
        samples: int = 1,
    ) -> Route:
        """``samples``: the request's ``n``, the answers it asks for; the ledger charges each its decode and a
        place in the replica's batch."""
        view = self.models.get(model)
        if view is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise RoutingError(404, f"model {model!r} is not served here (served models: {known})")
        excluded = set(exclude)
        endpoints = [e for e in view.endpoints if e.name not in excluded]
        if shadow:
            if view.shadow is None:
                raise RoutingError(503, f"model {model!r} has no shadow revision")
            endpoints = [e for e in endpoints if e.revision == view.shadow.revision]
        elif view.shadow is not None and not view.traffic:
            # the shadow revision serves only copies unless the traffic split names it
            endpoints = [e for e in endpoints if e.revision != view.shadow.revision]
        if not endpoints:
            raise RoutingError(
                503, f"model {model!r} has no ready replica" + (" left to try" if excluded else "")
            )
        snapshots = [self.snapshot(e, now) for e in endpoints]
        # What the ledger charges for the decode: the cap, or less once answers showed how long they really are.
        output_lengths = self.output_length_for(model)
        if self.settings.output_by_age:
            expected_output = output_lengths.remaining(0, max_tokens)
        else:
            expected_output = output_lengths.expected(max_tokens)
        expected_output *= samples
        request = RoutingRequest(
            model=model, prompt_tokens=0, expected_output_tokens=expected_output, samples=samples
        )
        if not shadow:
            available = {s.revision for s in snapshots if s.healthy and not s.ejected}
            revision = choose_revision(view.traffic, available, self.rng.random())
            if revision is not None:
                request.state.revision = revision

        blocks_by_size: dict[int, PromptBlocks] = {}
        matches: dict[str, int] = {}
        kv_new: dict[str, float] = {}
        # The KV footprint in flight costs a pass over the prompt's blocks per replica and per ticket: only kept
        # when a filter reads it (kvFits is not a default).
        judge_kv = KvFitsFilter.name in self.settings.filters

        def private_of(blocks: PromptBlocks) -> int:
            return private_blocks(
                len(blocks.hashes), blocks.prompt_tokens, expected_output, blocks.tokens_per_block
            )

        tokenizer = self.tokenizer_for(view)
        bytes_per_token = None if tokenizer else self.ratio_for(model).value
        for snap in snapshots:
            blocks = blocks_by_size.get(snap.block_size)
            if blocks is None:
                blocks = hash_prompt(
                    prompt, snap.block_size, tokenizer, self.settings.chars_per_token, bytes_per_token
                )
                blocks_by_size[snap.block_size] = blocks
            capacity_tokens = self.kv_capacity_tokens.get(snap.name, DEFAULT_CAPACITY_TOKENS)
            self.index.set_capacity(snap.name, round(capacity_tokens / blocks.tokens_per_block))
            matched_blocks = self.index.match_blocks(snap.name, blocks.hashes, now)
            matches[snap.name] = min(blocks.prompt_tokens, round(matched_blocks * blocks.tokens_per_block))
            if judge_kv:
                kv_new[snap.name] = self.ledger.kv_new_tokens(
                    snap.name, blocks.hashes, private_of(blocks), blocks.tokens_per_block
                )
        any_blocks = next(iter(blocks_by_size.values()))
        request.prompt_tokens = any_blocks.prompt_tokens
        request.prefix_match_tokens = matches
        request.kv_new_tokens = kv_new

        decision = self.pipeline_for(view).decide(request, snapshots, self.rng)
        if decision.replica is None:
            if request.state.saturated:
                raise RoutingError(
                    429,
                    f"every replica of model {model!r} is saturated; retry later",
                    self.settings.retry_after_s,
                )
            raise RoutingError(503, f"model {model!r}: {decision.reason}")
        chosen = decision.replica
        endpoint = next(e for e in endpoints if e.name == chosen.name)
        match = matches[chosen.name]
        chosen_blocks = blocks_by_size[chosen.block_size]
        hashes, private = chosen_blocks.hashes, private_of(chosen_blocks)
        kv = KvHold(tuple(hashes), private, chosen_blocks.tokens_per_block) if judge_kv else None
        # whether it starts at once there, as freeSlot judges (accounting.PrefillOverlap samples only those; with
        # the overlap off nothing is sampled, and the per-request pass over the candidates is skipped)
        slot_free = (
            self.settings.prefill_overlap and has_free_slot(snapshots, samples)[snapshots.index(chosen)]
        )
        ticket = self.ledger.open(
            chosen.name,
            max(0, request.prompt_tokens - match),
            expected_output,
            kv,
            now,
            slot_free,
            output_lengths if self.settings.output_by_age else None,
            max_tokens,
            samples,
        )
        # read before the insert below touches them
        match_last_used = self.index.last_used(chosen.name, hashes) if self.settings.prefix_feedback else ()
        self.index.insert(chosen.name, hashes, now, private)
        if self.publish_prefixes and (hashes or private):
            self.prefix_outbox.append((chosen.name, hashes, private))
        return Route(
            model,
            endpoint,
            ticket,
            decision,
            request.prompt_tokens,
            match,
            shadow,
            view.namespace,
            match_last_used,
            chosen_blocks.tokens_per_block,
            hashes,
            private,
        )

    def served_elsewhere(self, route: Route, endpoint: Endpoint, now: float) -> Route:
        """A gateway fell back from ``route``'s replica to ``endpoint``: the work is there, so the ticket (load
        and KV held) moves, and the prompt's blocks are recorded in the prefix index (and for peers) as that
        replica's, which computed them. The predicted match was the primary's: nothing to compare it with."""
        ticket = self.ledger.move(route.ticket, endpoint.name)
        self.index.insert(endpoint.name, route.blocks, now, route.private_blocks)
        if self.publish_prefixes and (route.blocks or route.private_blocks):
            self.prefix_outbox.append((endpoint.name, route.blocks, route.private_blocks))
        return dataclasses.replace(route, endpoint=endpoint, ticket=ticket, match_last_used=())

    def shadow_wanted(self, model: str) -> bool:
        view = self.models.get(model)
        return bool(view and view.shadow and self.rng.random() < view.shadow.fraction)

    # --- outcomes --------------------------------------------------------------------------------------

    def record_failure(self, replica: str, now: float) -> bool:
        return self.failures.record_failure(replica, now)

    def record_success(self, replica: str) -> None:
        self.failures.record_success(replica)
