"""Load accounting (outstanding tokens per replica) and passive failure ejection. Pure: no I/O, and no clock of
its own (the caller passes the time).

A request adds its prompt tokens the replica has not cached (work still to prefill) plus its expected decode
tokens when it is routed. The prefill part is released when the first token arrives, decode tokens as they
stream (or, for a ticket opened with the model's ``OutputLength``, recharged at each token as what answers of its
age still wrote: learned_sizes), and whatever remains when the request ends - on success, error, timeout or
client disconnect alike (a counter that is only released on success drifts; see skypilot-org/skypilot#10444).

For tickets opened with a ``KvHold`` (the router gives one when the kvFits filter is configured), the ledger
also counts each replica's KV footprint in flight: the distinct prompt blocks its open tickets hold
(a prefix shared by several requests on one replica is held once, as the engine's paged cache holds it) plus
each request's private blocks (the prompt's tail and its output). An engine admits a waiting request only when
its blocks fit beside the running ones (vLLM's scheduler, SGLang's alike), so a request sent where its new
blocks do not fit waits for others to finish however little compute that replica owes.

A replica's prefill debt is not all still ahead: an engine prefills the prompts it has in arrival order, so the
oldest open prefill on a replica has been worked on since it was sent. ``prefill_done`` estimates how much, from
the time since then and the replica's prefill rate as this router has measured it (``PrefillRate``: a low
quantile of prompt tokens over time to first token, from requests that found no other prefill of ours ahead of
them). Without it,
two replicas owing one prompt each look alike though one is about to finish it and the other has just begun:
the load score then sends the next request of a burst to the one that began last, where round robin's rotation
sends it to the one that began first (bench/policy_replay.py: the load score's TTFT p99.7 30.1 ms against round
robin's 27.6, 27.6 with the progress counted; bench-router's no_sharing rounds of a few hundred requests put
such a burst at p99). Until a replica has a measured rate, nothing is counted as done (today's behaviour).

Whether prompts in flight on a replica are load at all depends on how the engine prefills them. vLLM and SGLang
spend one compute budget per step on the prefills they hold (chunked prefill), so a prompt sent behind another
long one waits for most of it: what the replica owes in prefill is time every new request pays. An engine that
prefills each request on its own clock (llm-d-inference-sim v0.9.2: a request's time to first token is its own
uncached tokens times the per-token time, stretched by the running count only; pkg/llm-d-inference-sim/
latencies.go) makes a short prompt sent behind a long one finish long before it, and there the prefill owed is
no cost to the next request. ``PrefillOverlap`` learns which of the two the engines are from exactly that: short
prompts sent behind a long prefill of ours (with a batch slot free, so a slot wait cannot pass for it), and
whether their first token came well before the long one's. Until it has seen enough, prefills queue.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenyard.router.learned_sizes import OutputLength


@dataclass(frozen=True)
class KvHold:
    """The KV cache a request takes on its replica: its prompt's full blocks (chained hashes, shared with the
    other requests in flight there that carry the same prefix) and its private blocks, ``tokens_per_block``
    tokens each (a fraction for character blocks)."""

    blocks: tuple[int, ...]
    private_blocks: int
    tokens_per_block: float


@dataclass
class Ticket:
    """One routed request's share of a replica's load."""

    id: int
    replica: str
    prefill_left: int
    decode_left: int
    closed: bool = False
    kv: KvHold | None = None  # the KV blocks the request holds on its replica while in flight
    opened_at: float = 0.0  # the router's clock when the request was sent
    # Whether no other prefill of ours was open on the replica when it was sent: its time to first token then
    # measures the replica's prefill rate (a queued one would understate it).
    measures_rate: bool = False
    prefill_sent: int = 0  # the prompt tokens it owed when it was sent
    first_token_at: float | None = None  # when its first token came, if that was timed
    # short prompts sent behind this one's prefill while a batch slot was free (PrefillOverlap's samples)
    followers: list[Ticket] = field(default_factory=list)
    generated: int = 0  # output tokens streamed so far
    # Given, decode_left is recharged at each token as what the model's answers of this age still wrote, under
    # the request's cap (OutputLength.remaining); else it counts down from what was charged at the start.
    output: OutputLength | None = None
    output_cap: int = 0
    # The sequences the request runs on its replica (its ``n``): each holds a batch slot and writes its own answer,
    # and decode_left covers all of them.
    samples: int = 1

    @property
    def tokens_left(self) -> int:
        return self.prefill_left + self.decode_left


@dataclass
class PrefillRate:
    """A replica's prefill rate in prompt tokens per second: the lower quartile of the last ``window`` samples
    it showed, once it has shown ``min_samples``. Samples come from prompts of at least ``min_tokens`` (below
    that, the network and the engine's step dominate the time).

    A low quantile, because the two errors are not alike. A sample is the tokens the router expected to be
    prefilled over the time to first token; where the engine held more of the prompt than the router's index
    knew (a prefix it kept that the index had evicted, or that another router or an earlier client sent), the
    time is short for the tokens and the sample is many times the real rate. A rate set too high makes every
    prompt in flight on the replica look nearly done, and the replica takes a burst it cannot serve; a rate set
    too low only counts less progress, which is the router without progress. A moving average moved a fifth of
    the way to one wild sample, and a median of 15 is still the wild value while most of its first samples are
    wild (a router started beside engines that hold their prefixes); the lower quartile of 15 ignores up to 11
    high ones, and nothing is trusted before 5 samples."""

    window: int = 15
    min_samples: int = 5
    min_tokens: int = 64
    _samples: deque[float] = field(default_factory=deque)

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < self.min_tokens or seconds <= 0:
            return
        self._samples.append(tokens / seconds)
        while len(self._samples) > self.window:
            self._samples.popleft()

    @property
    def tokens_per_s(self) -> float | None:
        if len(self._samples) < self.min_samples:
            return None
        return sorted(self._samples)[len(self._samples) // 4]


@dataclass
class PrefillOverlap:
    """Whether the engines prefill the prompts they hold side by side (each on its own clock) rather than one
    after another, learned from overtakes: a short prompt (at most ``short_share`` of a long one's tokens) sent
    to a replica while that long prompt (``long_tokens`` or more) was still prefilling there, with a batch slot
    free. Where prefills queue, the short one's first token comes with the long one's or after it; where they
    run side by side, well before (by ``margin_share`` of the long one's time to first token, at least
    ``min_margin_s``: a step's jitter is not an overtake). Side by side once at least half of the last
    ``window`` samples overtook, from ``min_samples`` on; before that, prefills queue (vLLM's and SGLang's
    chunked prefill: the router as it was).

    One verdict for the router, not per replica: the replicas behind one router run one engine as a rule, and a
    burst of long prompts, which is when the verdict matters, shows few samples per replica."""

    window: int = 32
    min_samples: int = 8
    long_tokens: int = 2048
    short_share: float = 0.125
    margin_share: float = 0.1
    min_margin_s: float = 0.05
    _samples: deque[bool] = field(default_factory=deque)

    def follows(self, long: Ticket, short: Ticket) -> bool:
        """Whether ``short``, sent while ``long`` prefilled on the same replica, is a sample of ``long``."""
        return (
            long.prefill_sent >= self.long_tokens
            and short.prefill_sent <= self.short_share * long.prefill_sent
        )

    def judge(self, long: Ticket, now: float) -> None:
        """``long``'s first token came at ``now``: score the short prompts that were sent behind it."""
        margin = max(self.min_margin_s, self.margin_share * (now - long.opened_at))
        for short in long.followers:
            if short.opened_at > now - margin:  # sent as it was finishing: neither outcome says anything
                continue
            overtook = short.first_token_at is not None and short.first_token_at <= now - margin
            self._samples.append(overtook)
            while len(self._samples) > self.window:
                self._samples.popleft()
        long.followers.clear()

    @property
    def samples(self) -> int:
        return len(self._samples)

    @property
    def overtakes(self) -> int:
        return sum(self._samples)

    @property
    def side_by_side(self) -> bool:
        return self.samples >= self.min_samples and 2 * self.overtakes >= self.samples


@dataclass
class ReplicaLoad:
    tokens: int = 0
    requests: int = 0


class LoadLedger:
    """Outstanding tokens and requests per replica, counted by this router."""

    def __init__(self, decode_horizon: int | None = None) -> None:
        self._ids = itertools.count(1)
        self._loads: dict[str, ReplicaLoad] = defaultdict(ReplicaLoad)
        # Given, ``decode_beyond`` sums per replica each open ticket's decode past its first ``decode_horizon``
        # tokens (an experiment: see RouterSettings.decode_horizon).
        self.decode_horizon = decode_horizon
        self._decode_beyond: dict[str, int] = defaultdict(int)
        self._open: dict[int, Ticket] = {}
        # replica -> block hash -> open tickets holding it; replica -> KV tokens those tickets hold
        self._held_blocks: dict[str, Counter[int]] = defaultdict(Counter)
        self._held_tokens: dict[str, float] = defaultdict(float)
        self._kv_holders: Counter[str] = Counter()  # replica -> open tickets with a KvHold
        # replica -> its open tickets still owing prefill, oldest first (dicts keep insertion order)
        self._prefilling: dict[str, dict[int, Ticket]] = defaultdict(dict)
        self._rates: dict[str, PrefillRate] = defaultdict(PrefillRate)
        # replica -> when its latest prefill of ours ended (its first token came): the engine turns to the next
        # prompt in line only then, so progress on a queued prompt counts from there, not from when it was sent
        self._prefill_ended_at: dict[str, float] = {}
        self.overlap = PrefillOverlap()

    def open(
        self,
        replica: str,
        prefill_tokens: int,
        decode_tokens: int,
        kv: KvHold | None = None,
        now: float = 0.0,
        slot_free: bool = True,
        output: OutputLength | None = None,
        output_cap: int = 0,
        samples: int = 1,
    ) -> Ticket:
        """``decode_tokens``: what all ``samples`` answers are charged (the request's ``n``; each also counts
        as a request in flight). ``slot_free``: the replica had a batch slot free for it as far as the router
        knew (False: it may wait for one, and its time to first token says nothing about how the engine
        prefills). ``output`` and ``output_cap``: the model's answer lengths and the request's max_tokens, to
        recharge its decode by age (Ticket.output)."""
        if prefill_tokens < 0 or decode_tokens < 0:
            raise ValueError(
                f"token counts must be >= 0, got prefill={prefill_tokens} decode={decode_tokens}"
            )
        ticket = Ticket(
            next(self._ids),
            replica,
            prefill_tokens,
            decode_tokens,
            kv=kv,
            opened_at=now,
            prefill_sent=prefill_tokens,
            output=output,
            output_cap=output_cap,
            samples=samples,
        )
        if slot_free:
            for ahead in self._prefilling.get(replica, {}).values():
                if self.overlap.follows(ahead, ticket):
                    ahead.followers.append(ticket)
        if prefill_tokens:
            prefilling = self._prefilling[replica]
            ticket.measures_rate = not prefilling
            prefilling[ticket.id] = ticket
        load = self._loads[replica]
        load.tokens += ticket.tokens_left
        load.requests += samples
        self._count_beyond(ticket, 0, decode_tokens)
        self._open[ticket.id] = ticket
        if kv is not None:
            self._hold(replica, kv, +1)
        return ticket

    def _hold(self, replica: str, kv: KvHold, sign: int) -> None:
        held = self._held_blocks[replica]
        for block in kv.blocks:
            before = held[block]
            held[block] = before + sign
            if before == 0 or held[block] == 0:  # the first holder brings the block, the last takes it away
                self._held_tokens[replica] += sign * kv.tokens_per_block
            if held[block] == 0:
                del held[block]
        self._held_tokens[replica] += sign * kv.private_blocks * kv.tokens_per_block
        self._kv_holders[replica] += sign
        if self._kv_holders[replica] == 0:  # nothing in flight: exactly zero, no float residue left behind
            del self._kv_holders[replica], self._held_blocks[replica], self._held_tokens[replica]

    def kv_held_tokens(self, replica: str) -> float:
        """KV tokens the open tickets on ``replica`` hold (shared prefix blocks counted once)."""
        return max(0.0, self._held_tokens.get(replica, 0.0))

    def kv_new_tokens(
        self, replica: str, blocks: Sequence[int], private_blocks: int, tokens_per_block: float
    ) -> float:
        """KV tokens a request with these blocks would add on ``replica``: the blocks no open ticket there holds
        yet, and its private ones."""
        held = self._held_blocks.get(replica)
        shared = sum(1 for block in blocks if block in held) if held else 0
        return (len(blocks) - shared + private_blocks) * tokens_per_block

    def first_token(self, ticket: Ticket, now: float | None = None) -> None:
        """The prompt is prefilled: release its prefill share. ``now``: when its first token came, if it came
        as soon as the engine made it (a stream; not the end of a whole answer), which measures the rate."""
        if ticket.closed:
            return
        if now is not None and ticket.first_token_at is None:
            ticket.first_token_at = now
        if ticket.prefill_left == 0:
            return
        if now is not None:
            self.overlap.judge(ticket, now)
            if ticket.measures_rate:
                self._rates[ticket.replica].observe(ticket.prefill_left, now - ticket.opened_at)
            ended = self._prefill_ended_at.get(ticket.replica)
            self._prefill_ended_at[ticket.replica] = now if ended is None else max(ended, now)
        self._loads[ticket.replica].tokens -= ticket.prefill_left
        ticket.prefill_left = 0
        self._end_prefill(ticket)

    def _end_prefill(self, ticket: Ticket) -> None:
        ticket.followers.clear()  # judged at its first token, or never timed (an error, a whole answer)
        prefilling = self._prefilling.get(ticket.replica)
        if prefilling is not None and prefilling.pop(ticket.id, None) is not None and not prefilling:
            del self._prefilling[ticket.replica]

    def prefill_rate(self, replica: str) -> float | None:
        """The replica's measured prefill rate (prompt tokens per second), None before any measure."""
        rate = self._rates.get(replica)
        return rate.tokens_per_s if rate else None

    def prefill_owed(self, replica: str) -> int:
        """Prompt tokens of the replica's open prefills (ours), done or not."""
        return sum(ticket.prefill_left for ticket in self._prefilling.get(replica, {}).values())

    @property
    def prefills_side_by_side(self) -> bool:
        """The engines prefill the prompts they hold side by side (PrefillOverlap): owed prefill is no wait."""
        return self.overlap.side_by_side

    def prefill_done(self, replica: str, now: float) -> float:
        """Prompt tokens of the replica's open prefills that it has likely prefilled by ``now``: its measured
        rate times the time the engine has been on them, never more than they owe (the engine works through
        them in order). That time starts when the oldest was sent or, if a prefill ahead of it ended later,
        then: a prompt queued behind another is not worked on while it waits. 0 before the replica's rate is
        measured."""
        prefilling = self._prefilling.get(replica)
        rate = self.prefill_rate(replica)
        if not prefilling or not rate:
            return 0.0
        oldest = next(iter(prefilling.values()))
        began = max(oldest.opened_at, self._prefill_ended_at.get(replica, oldest.opened_at))
        owed = sum(ticket.prefill_left for ticket in prefilling.values())
        return min(float(owed), rate * max(0.0, now - began))

    def generated(self, ticket: Ticket, tokens: int, now: float | None = None) -> None:
        """``tokens`` more output tokens streamed (the first one also ends the prefill; ``now`` as for
        first_token)."""
        if ticket.closed or tokens <= 0:
            return
        self.first_token(ticket, now)
        ticket.generated += tokens
        if ticket.output is None:
            left = max(0, ticket.decode_left - tokens)
        else:  # the samples stream side by side, so each has written about its share so far
            per_sample = ticket.generated // ticket.samples
            left = ticket.samples * ticket.output.remaining(per_sample, ticket.output_cap)
        self._loads[ticket.replica].tokens += left - ticket.decode_left
        self._count_beyond(ticket, ticket.decode_left, left)
        ticket.decode_left = left

    def _count_beyond(self, ticket: Ticket, before: int, after: int) -> None:
        """The ticket's decode went from ``before`` to ``after`` tokens: keep ``decode_beyond`` in step."""
        horizon = self.decode_horizon
        if horizon is None:
            return
        change = max(0, after - horizon) - max(0, before - horizon)
        if change:
            beyond = self._decode_beyond[ticket.replica] + change
            if beyond:
                self._decode_beyond[ticket.replica] = beyond
            else:
                del self._decode_beyond[ticket.replica]

    def decode_beyond(self, replica: str) -> int:
        """The open tickets' decode tokens past each one's first ``decode_horizon`` (0 without a horizon)."""
        return self._decode_beyond.get(replica, 0)

    def close(self, ticket: Ticket) -> None:
        """The request ended, however it ended; safe to call more than once."""
        if ticket.closed:
            return
        load = self._loads[ticket.replica]
        load.tokens -= ticket.tokens_left
        load.requests -= ticket.samples
        self._count_beyond(ticket, ticket.decode_left, 0)
        if ticket.kv is not None:
            self._hold(ticket.replica, ticket.kv, -1)
        self._end_prefill(ticket)
        ticket.prefill_left = ticket.decode_left = 0
        ticket.closed = True
        del self._open[ticket.id]
        if load.requests == 0 and load.tokens == 0:
            del self._loads[ticket.replica]

    def move(self, ticket: Ticket, replica: str) -> Ticket:
        """The request is served by ``replica`` after all (a gateway fell back to it): what it still owes and
        the KV blocks it holds move there; the old ticket is closed, the new one returned."""
        moved = self.open(
            replica,
            ticket.prefill_left,
            ticket.decode_left,
            ticket.kv,
            ticket.opened_at,
            output=ticket.output,
            output_cap=ticket.output_cap,
            samples=ticket.samples,
        )
        moved.generated = ticket.generated
        self.close(ticket)
        return moved

    def load(self, replica: str) -> ReplicaLoad:
        found = self._loads.get(replica)
        return ReplicaLoad(found.tokens, found.requests) if found else ReplicaLoad()

    def snapshot(self) -> dict[str, ReplicaLoad]:
        return {name: ReplicaLoad(load.tokens, load.requests) for name, load in self._loads.items()}

    def open_tickets(self) -> int:
        return len(self._open)

    def forget(self, replica: str) -> None:
        """The replica went away: drop what was measured on it (a replica of the same name later is a new pod,
        and must be measured afresh). Its open tickets still close as they end."""
        self._rates.pop(replica, None)
        self._prefill_ended_at.pop(replica, None)


@dataclass
class EjectionPolicy:
    """Eject a replica after ``consecutive_failures`` failures in a row, for ``base_s`` doubling on each
    ejection in a row up to ``max_s``; one success resets both counts."""

    consecutive_failures: int = 3
    base_s: float = 5.0
    max_s: float = 60.0


@dataclass
class _FailureState:
    consecutive: int = 0
    ejections_in_a_row: int = 0
    ejected_until: float = 0.0


@dataclass
class FailureTracker:
    policy: EjectionPolicy = field(default_factory=EjectionPolicy)
    _states: dict[str, _FailureState] = field(default_factory=dict)

    def record_success(self, replica: str) -> None:
        self._states.pop(replica, None)

    def record_failure(self, replica: str, now: float) -> bool:
        """Counts a failure; returns True when this failure ejects the replica."""
        state = self._states.setdefault(replica, _FailureState())
        state.consecutive += 1
        if state.consecutive < self.policy.consecutive_failures or state.ejected_until > now:
            return False
        state.ejections_in_a_row += 1
        duration = min(self.policy.max_s, self.policy.base_s * 2 ** (state.ejections_in_a_row - 1))
        state.ejected_until = now + duration
        state.consecutive = 0
        return True

    def is_ejected(self, replica: str, now: float) -> bool:
        state = self._states.get(replica)
        return state is not None and state.ejected_until > now

    def forget(self, replica: str) -> None:
        self._states.pop(replica, None)
