"""What the router learns of request sizes from the engines' answers: how many bytes of prompt text make one of
the engine's tokens (``BytesPerToken``), and how long answers really are (``OutputLength``); and, from their
/metrics, how many requests an engine runs at once (``ConcurrencyCap``).

Bytes per token
---------------

Without a tokenizer the router hashes prompts in fixed character blocks and guesses their length at
``--chars-per-token`` (4, the usual figure for English BPE). A guess that is off misjudges two things at once: a
prompt's prefill work (the outstanding tokens that balance load) and how many of the router's blocks fit in an
engine's KV cache (the prefix index's capacity). With 7 bytes per token (the simulated engines' word
tokenizer) the index believed an engine held 40% of what it did, forgot documents the engine still had, and
sent their questions elsewhere: bench-router long_documents, engine prefix hit rate 0.66 at the guess of 4
against 0.79 told the truth (--chars-per-token 7), closed-loop tokens/s 370 against 1,026.

Every answer that reports ``usage.prompt_tokens`` (non-streamed answers always; streams when the client asks
``stream_options.include_usage``, as the OpenAI SDKs do for token accounting) gives one exact pair (bytes the
router saw, tokens the engine counted). The estimate is the ratio of the two sums, each decayed so that
recent traffic counts most, starting from the configured guess held with the weight of PRIOR_TOKENS tokens.

Output length
-------------
A request's ``max_tokens`` is a cap, not a forecast: clients send 2,048 or more and get a few hundred tokens
when the model stops by itself. Charged at the cap, every request weighs the same in the ledger whatever its
prompt, and the prefill a cache hit saves (the part of the load a router can choose) is lost under a constant.
The router counts the tokens each finished answer streamed; the expected output of a new request is the mean
of those counts (decayed, per model), never more than its own cap, and the cap itself until MIN_ANSWERS
answers have been seen.

A mean is the right charge for a request just sent, not for one already answering. Answer lengths are heavy-
tailed or split in two (a model stops after a sentence, or writes to the cap): an answer that has run past the
short ones is most likely a long one, so the tokens it still owes grow with its age where a mean counted down
says it is nearly done. llm-d-inference-sim v0.9.2 draws 70% of its answers from 1-60 tokens and 25% at or near
the cap (pkg/dataset/histogram_helper.go, respLenBucketsProbabilities): a request 100 tokens in owes about 1,900
more, while the mean (~580) counts it down to nothing by token 580 and the replica running four such answers
looks empty. So ``remaining`` charges what answers that ran at least this long went on to write: the decayed
lengths are kept in buckets (four per doubling), and a request ``a`` tokens in owes the mean length of the answers
longer than ``a``, less ``a`` (0 once it outlived every answer seen). Where every answer has one length (bench-
router's tuning workloads ask ``ignore_eos``) that is exactly the length less its age, as a count-down charged.

Concurrency
-----------
An engine runs at most so many requests at once (vLLM's --max-num-seqs, SGLang's --max-running-requests), and a
request beyond that waits in its queue for a running one to end: a whole request's time, however few tokens
the engine owes. The cap is not in any engine's /metrics, but it shows there: the running count never exceeds
it, and whenever requests wait the running count sits at it. A vLLM-like scheduler also makes requests wait for
other reasons (a step's token budget spent on other prompts, a full KV cache), with the running count anywhere
below its largest; so the largest running count ever scraped is taken as a cap only once CAP_CONFIRMATIONS
scrapes found requests waiting with exactly that many running. The same is judged over all the replicas the
router scrapes at once (the largest count on any of them, confirmed by scrapes of several of them): the
replicas of a deployment run the same engine with the same flags, and the fleet confirms a cap some times
faster than one replica does (each is scraped every 2 s), which is the time a new router routes without it.
Routers that share Redis also share the caps they confirm (shared.py). The fleet needs
FLEET_CAP_REPLICAS different replicas to have shown requests waiting at that count, rather than three scrapes
of any: a vLLM-like running count that wanders while requests wait can touch its own largest value twice in a
row, but two engines rarely wait at the same largest count unless that count is their limit; and the first
saturated replicas show it within about one scrape interval of each other. A fleet of mixed caps confirms only
the largest, which weakens the filter on the smaller ones until each has its own.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

PRIOR_TOKENS = 4096.0  # the guess counts as this many observed tokens: a few requests outweigh it
# Each observation scales the earlier sums by exp(-tokens / HALF_LIFE_TOKENS * ln 2): a change of prompt mix
# (another language, another tenant's documents) shows after about this many prompt tokens.
HALF_LIFE_TOKENS = 2_000_000.0
MIN_BYTES_PER_TOKEN, MAX_BYTES_PER_TOKEN = 1.0, 32.0


@dataclass
class BytesPerToken:
    """The learned ratio for one model; ``value`` is always usable (the prior until evidence arrives)."""

    prior: float
    observed_bytes: float = 0.0
    observed_tokens: float = 0.0
    observations: int = 0

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> None:
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return  # an empty prompt, or an engine that reports no usage: nothing to learn
        keep = 0.5 ** (prompt_tokens / HALF_LIFE_TOKENS)
        self.observed_bytes = self.observed_bytes * keep + prompt_bytes
        self.observed_tokens = self.observed_tokens * keep + prompt_tokens
        self.observations += 1

    @property
    def value(self) -> float:
        ratio = (self.observed_bytes + self.prior * PRIOR_TOKENS) / (self.observed_tokens + PRIOR_TOKENS)
        return min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, ratio))


MIN_ANSWERS = 20
OUTPUT_HALF_LIFE_ANSWERS = 500.0  # a change of workload shows after a few hundred answers
OUTPUT_DECAY = 0.5 ** (1.0 / OUTPUT_HALF_LIFE_ANSWERS)  # an answer's weight, relative to the next one's
RESCALE_AT = 1e100  # ~166,000 answers of growth; floats hold 1e308
# Answer-length buckets: [edge, next edge), four per doubling up to 2^20 tokens (each at most ~19% wide, so an
# answer's age and the lengths in its own bucket differ by little), then one open bucket.
OUTPUT_BUCKET_EDGES: tuple[int, ...] = tuple(sorted({0} | {round(2 ** (i / 4)) for i in range(0, 81)}))


# Capped answers' weight goes to longer answers only where those weigh at least one fresh answer: a few answers
# long since decayed would otherwise take all of it, and one outlier would speak for every capped answer.
MIN_LONGER_WEIGHT = 1.0


def _empty_buckets() -> list[float]:
    return [0.0] * len(OUTPUT_BUCKET_EDGES)


@dataclass
class OutputLength:
    """How long one model's finished answers are, decayed: their mean (``expected``) and, by length bucket,
    what an answer still owes at a given age (``remaining``).

    An answer that stopped at its request's ``max_tokens`` (``reached_cap``) is only a lower bound: the model
    would have written on. Clients of one model send different caps (a summariser 256, a chat client 4,096), and
    counted as whole, the short caps' answers would make every answer look short. So each capped answer's weight
    is handed on to the answers seen running longer than it, in proportion to theirs (Efron's redistribution to
    the right, the Kaplan-Meier estimate of the lengths), and counts as written only where no longer answer was
    seen: then its cap is the best estimate there is. Where every answer has one length, all of them capped (the
    tuning workloads ask ``ignore_eos``), nothing is longer, and the estimate is what it was without the mark."""

    observations: int = 0
    # Per length bucket, the decayed count and token sum of the answers that ended there by themselves ...
    _weights: list[float] = field(default_factory=_empty_buckets)
    _lengths: list[float] = field(default_factory=_empty_buckets)
    # ... and of those cut there by their cap.
    _capped_weights: list[float] = field(default_factory=_empty_buckets)
    _capped_lengths: list[float] = field(default_factory=_empty_buckets)
    # Decay without touching every bucket: the buckets hold each answer at the weight a new one had when it came,
    # and that weight grows by 1 / OUTPUT_DECAY per answer, so an older answer weighs OUTPUT_DECAY^age of a new
    # one, as if every bucket were decayed on each answer. A bucket's decayed value is its stored one / _unit.
    _unit: float = 1.0
    # per bucket, the estimated count and token sum of the answers in it or a longer one, in fresh answers
    # (None: to recompute)
    _tails: tuple[list[float], list[float]] | None = None

    def observe(self, output_tokens: int, reached_cap: bool = False) -> None:
        if output_tokens < 0:
            return
        self.observations += 1
        self._unit /= OUTPUT_DECAY
        if self._unit > RESCALE_AT:  # fold the growth into the buckets before it overflows
            for buckets in (self._weights, self._lengths, self._capped_weights, self._capped_lengths):
                for i in range(len(buckets)):
                    buckets[i] /= self._unit
            self._unit = 1.0
        bucket = bisect.bisect_right(OUTPUT_BUCKET_EDGES, output_tokens) - 1
        if reached_cap:
            self._capped_weights[bucket] += self._unit
            self._capped_lengths[bucket] += self._unit * output_tokens
        else:
            self._weights[bucket] += self._unit
            self._lengths[bucket] += self._unit * output_tokens
        self._tails = None

    def _tail_sums(self) -> tuple[list[float], list[float]]:
        if self._tails is None:
            weights, lengths = _redistribute_capped(
                self._weights, self._lengths, self._capped_weights, self._capped_lengths, self._unit
            )
            per_unit = 1.0 / self._unit
            self._tails = (_suffix_sums(weights, per_unit), _suffix_sums(lengths, per_unit))
        return self._tails

    @property
    def answers(self) -> float:
        """The answers seen, decayed."""
        return self._tail_sums()[0][0]

    @property
    def capped_answers(self) -> float:
        """The answers seen cut at their cap, decayed (their weight before it is handed on)."""
        return sum(self._capped_weights) / self._unit

    @property
    def total_tokens(self) -> float:
        """Their tokens, decayed alike."""
        return self._tail_sums()[1][0]

    def expected(self, max_tokens: int) -> int:
        """Decode tokens to charge a new request whose cap is ``max_tokens``: the mean answer, never above it."""
        if self.observations < MIN_ANSWERS or self.answers <= 0:
            return max_tokens
        return max(1, min(max_tokens, round(self.total_tokens / self.answers)))

    def remaining(self, generated: int, max_tokens: int) -> int:
        """Decode tokens still to charge a request that has streamed ``generated`` tokens under its cap
        ``max_tokens``: the mean length of the answers seen that ran longer, less ``generated``; never more
        than the cap leaves. Before MIN_ANSWERS answers, what the cap leaves."""
        left_by_cap = max(0, max_tokens - generated)
        if self.observations < MIN_ANSWERS:
            return left_by_cap
        tail_weights, tail_lengths = self._tail_sums()
        # the answers longer than ``generated``: those in the bucket of generated + 1 and beyond (the bucket's
        # shorter ones too, a bias of at most its width)
        bucket = bisect.bisect_right(OUTPUT_BUCKET_EDGES, generated + 1) - 1
        if tail_weights[bucket] <= 1e-9:
            return 0  # it outlived every answer seen
        longer_mean = tail_lengths[bucket] / tail_weights[bucket]
        return min(left_by_cap, max(0, round(longer_mean) - generated))


def _redistribute_capped(
    weights: list[float],
    lengths: list[float],
    capped_weights: list[float],
    capped_lengths: list[float],
    unit: float,
) -> tuple[list[float], list[float]]:
    """Per bucket, the answers' estimated weight and token sum once every capped answer's weight has gone to the
    answers in longer buckets (capped or not), in proportion to theirs; a capped answer with none longer keeps
    its weight at its own length. Walking from the shortest bucket, every answer beyond the current one has
    been scaled by the same factor so far, so one running factor carries it (the bucket's own answers, capped
    or not, share their bucket: a bias of at most its width). ``unit``: the weight of one fresh answer in the
    buckets given (the result is in the same units)."""
    beyond = _suffix_sums([w + c for w, c in zip(weights, capped_weights, strict=True)])
    scale = 1.0
    estimated_weights, estimated_lengths = [0.0] * len(weights), [0.0] * len(weights)
    for i, capped in enumerate(capped_weights):
        estimated_weights[i] = weights[i] * scale
        estimated_lengths[i] = lengths[i] * scale
        if capped <= 0.0:
            continue
        longer = beyond[i + 1] if i + 1 < len(beyond) else 0.0
        if longer >= MIN_LONGER_WEIGHT * unit:
            scale *= 1.0 + capped / longer
        else:
            estimated_weights[i] += capped * scale
            estimated_lengths[i] += capped_lengths[i] * scale
    return estimated_weights, estimated_lengths


def _suffix_sums(values: list[float], factor: float = 1.0) -> list[float]:
    """sums[i] = factor x (values[i] + values[i + 1] + ...)."""
    sums = [0.0] * len(values)
    running = 0.0
    for i in range(len(values) - 1, -1, -1):
        running += values[i]
        sums[i] = running * factor
    return sums


CAP_CONFIRMATIONS = 3  # scrapes of one replica
FLEET_CAP_REPLICAS = 2  # replicas of the fleet, one scrape each


@dataclass
class ConcurrencyCap:
    """One replica's running and waiting counts as scraped, or a fleet's (see Concurrency above)."""

    most_running: int = 0
    confirmations: int = 0  # scrapes with requests waiting and ``most_running`` running
    witnesses: set[str] = field(default_factory=set)  # the replicas those scrapes came from
    needed: int = CAP_CONFIRMATIONS
    needed_replicas: int = 1

    @classmethod
    def of_fleet(cls) -> ConcurrencyCap:
        return cls(needed=FLEET_CAP_REPLICAS, needed_replicas=FLEET_CAP_REPLICAS)

    def observe(self, running: float, waiting: float, replica: str = "") -> None:
        count = round(running)
        if count > self.most_running:
            self.most_running, self.confirmations, self.witnesses = count, 0, set()
        if waiting > 0 and count == self.most_running and count >= 1:
            self.confirmations += 1
            self.witnesses.add(replica)

    def forget(self, replica: str) -> None:
        """The replica left. Once every replica that showed the cap has gone, it is learned anew: the replicas
        that replace them may run another engine version, with a smaller cap that would never confirm under
        the old ``most_running``."""
        self.witnesses.discard(replica)
        if not self.witnesses:
            self.most_running, self.confirmations = 0, 0

    @property
    def cap(self) -> int | None:
        """Requests the replica runs at once; None until confirmed."""
        confirmed = self.confirmations >= self.needed and len(self.witnesses) >= self.needed_replicas
        return self.most_running if confirmed else None
