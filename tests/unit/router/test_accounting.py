import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.router.accounting import (
    EjectionPolicy,
    FailureTracker,
    KvHold,
    LoadLedger,
    PrefillOverlap,
    PrefillRate,
)
from tokenyard.router.learned_sizes import OutputLength


def measure(
    ledger: LoadLedger, replica: str, samples: int = PrefillRate.min_samples, start: float = -100.0
) -> None:
    """Prompts alone on the replica, each 1000 tokens prefilled in 0.5 s (2000 tokens/s), ending long before 0."""
    for i in range(samples):
        probe = ledger.open(replica, 1000, 0, now=start + i)
        ledger.generated(probe, 1, now=start + i + 0.5)
        ledger.close(probe)


def test_ticket_releases_prefill_on_first_token_then_decode_then_rest():
    ledger = LoadLedger()
    ticket = ledger.open("a", prefill_tokens=100, decode_tokens=10)
    assert ledger.load("a").tokens == 110 and ledger.load("a").requests == 1
    ledger.first_token(ticket)
    assert ledger.load("a").tokens == 10
    ledger.generated(ticket, 3)
    assert ledger.load("a").tokens == 7
    ledger.close(ticket)
    assert ledger.load("a").tokens == 0 and ledger.load("a").requests == 0
    ledger.close(ticket)  # idempotent
    assert ledger.load("a").requests == 0
    assert ledger.open_tickets() == 0


def test_a_request_of_n_samples_counts_n_requests_and_recharges_each_samples_decode_by_age():
    lengths = OutputLength()
    for _ in range(20):
        lengths.observe(40)
    ledger = LoadLedger()
    ticket = ledger.open("a", 100, 4 * lengths.remaining(0, 200), output=lengths, output_cap=200, samples=4)
    assert ledger.load("a").requests == 4
    assert ledger.load("a").tokens == 100 + 4 * 40
    ledger.generated(ticket, 40)  # ten tokens from each of the four
    assert ledger.load("a").tokens == 4 * lengths.remaining(10, 200) == 4 * 30
    moved = ledger.move(ticket, "b")
    assert (ledger.load("a").requests, ledger.load("b").requests) == (0, 4)
    ledger.close(moved)
    assert ledger.load("b").requests == 0 and ledger.load("b").tokens == 0


def test_a_prompt_alone_on_its_replica_measures_the_prefill_rate_and_a_queued_or_whole_one_does_not():
    ledger = LoadLedger()
    measure(ledger, "a", PrefillRate.min_samples - 1)
    assert ledger.prefill_rate("a") is None  # not enough samples yet
    alone = ledger.open("a", 1000, 10, now=10.0)
    queued = ledger.open("a", 1000, 10, now=10.1)  # behind `alone`: its time to first token includes the wait
    assert alone.measures_rate and not queued.measures_rate
    ledger.first_token(alone, now=10.5)  # 1000 tokens in 0.5 s
    assert ledger.prefill_rate("a") == 2000.0
    ledger.first_token(queued, now=11.5)
    assert ledger.prefill_rate("a") == 2000.0
    whole = ledger.open("b", 1000, 10, now=0.0)
    ledger.first_token(whole)  # a whole answer: its first token came with its last, no measure of prefill
    assert ledger.prefill_rate("b") is None
    short = ledger.open("c", 8, 10, now=0.0)  # too short: the network and a decode step dominate its time
    ledger.generated(short, 1, now=0.1)
    assert ledger.prefill_rate("c") is None


def test_prefill_done_grows_from_the_oldest_open_prompt_at_the_measured_rate_up_to_what_is_owed():
    ledger = LoadLedger()
    probe = ledger.open("a", 1000, 0, now=0.0)
    assert ledger.prefill_done("a", 0.2) == 0.0  # no measured rate yet: nothing counted as done
    ledger.close(probe)
    measure(ledger, "a")  # 2000 tokens/s
    first = ledger.open("a", 1000, 10, now=1.0)
    second = ledger.open("a", 1000, 10, now=1.2)
    assert ledger.prefill_done("a", 1.0) == 0.0
    assert ledger.prefill_done("a", 1.25) == 500.0  # from the oldest, whoever is behind it
    assert ledger.prefill_done("a", 5.0) == 2000.0  # never more than the two prompts owe
    ledger.first_token(first, now=1.5)
    # the second is the oldest now, but it waited behind the first: the engine began on it at 1.5, not at 1.2
    # when it was sent
    assert ledger.prefill_done("a", 1.5) == 0.0
    assert ledger.prefill_done("a", 1.75) == pytest.approx(500.0)
    ledger.close(second)
    assert ledger.prefill_done("a", 1.75) == 0.0
    assert ledger.prefill_done("elsewhere", 1.5) == 0.0
    # a prompt sent to the idle replica later counts from when it was sent
    third = ledger.open("a", 1000, 10, now=3.0)
    assert ledger.prefill_done("a", 3.1) == pytest.approx(200.0)
    ledger.close(third)


def long_with_a_short_behind(
    ledger: LoadLedger, replica: str, at: float, short_first_token_after: float, slot_free: bool = True
) -> None:
    """A 4,000-token prompt sent at ``at`` whose first token comes 1 s later, and a 100-token one sent 0.2 s
    behind it whose first token comes ``short_first_token_after`` seconds after it was sent."""
    long = ledger.open(replica, 4000, 10, now=at)
    short = ledger.open(replica, 100, 10, now=at + 0.2, slot_free=slot_free)
    short_first = at + 0.2 + short_first_token_after
    if short_first < at + 1.0:
        ledger.generated(short, 1, now=short_first)
        ledger.generated(long, 1, now=at + 1.0)
    else:
        ledger.generated(long, 1, now=at + 1.0)
        ledger.generated(short, 1, now=short_first)
    ledger.close(long)
    ledger.close(short)


def test_prefills_are_side_by_side_once_short_prompts_are_seen_to_overtake_long_ones():
    ledger = LoadLedger()
    for i in range(PrefillOverlap.min_samples - 1):
        long_with_a_short_behind(ledger, f"r{i % 3}", at=10.0 * i, short_first_token_after=0.03)
    assert not ledger.prefills_side_by_side  # too few samples: prefills queue, as the router always assumed
    long_with_a_short_behind(ledger, "r0", at=100.0, short_first_token_after=0.03)
    assert ledger.prefills_side_by_side  # pooled over the replicas: one engine behind one router
    # then the engines turn out to queue (a short prompt's first token comes with the long one's, or after it)
    for i in range(PrefillOverlap.window):
        long_with_a_short_behind(ledger, "r1", at=200.0 + 10 * i, short_first_token_after=0.8)
    assert not ledger.prefills_side_by_side
    assert (ledger.overlap.samples, ledger.overlap.overtakes) == (PrefillOverlap.window, 0)


def test_only_a_clear_overtake_with_a_slot_free_counts_as_one():
    ledger = LoadLedger()
    # first token within the margin before the long one's (0.1 of its 1 s): the same step, not an overtake
    long_with_a_short_behind(ledger, "a", at=0.0, short_first_token_after=0.75)
    assert (ledger.overlap.samples, ledger.overlap.overtakes) == (1, 0)
    # sent without a free batch slot: it may have waited for a slot, so it is no sample either way
    long_with_a_short_behind(ledger, "a", at=10.0, short_first_token_after=0.03, slot_free=False)
    assert ledger.overlap.samples == 1
    # neither long enough nor short enough: no sample
    for long_tokens, short_tokens in ((1000, 10), (4000, 1000)):
        long = ledger.open("a", long_tokens, 10, now=20.0)
        short = ledger.open("a", short_tokens, 10, now=20.2)
        ledger.generated(short, 1, now=20.25)
        ledger.generated(long, 1, now=21.0)
    assert ledger.overlap.samples == 1
    # sent as the long one was finishing (inside the margin): no sample
    long = ledger.open("a", 4000, 10, now=30.0)
    late = ledger.open("a", 0, 10, now=30.95)
    ledger.generated(late, 1, now=30.96)
    ledger.generated(long, 1, now=31.0)
    # a long one that never streams (an error; a whole answer) judges nothing
    failed = ledger.open("a", 4000, 10, now=40.0)
    behind = ledger.open("a", 0, 10, now=40.1)
    ledger.generated(behind, 1, now=40.15)
    ledger.close(failed)
    assert ledger.overlap.samples == 1


def test_where_prefills_run_side_by_side_the_prefill_owed_is_no_load():
    ledger = LoadLedger()
    first = ledger.open("a", 3000, 10, now=0.0)
    ledger.open("a", 500, 10, now=0.1)
    assert ledger.prefill_owed("a") == 3500
    ledger.first_token(first, now=0.5)
    assert ledger.prefill_owed("a") == 500
    assert ledger.prefill_owed("b") == 0


def test_a_replica_forgotten_is_measured_afresh():
    ledger = LoadLedger()
    measure(ledger, "a")
    assert ledger.prefill_rate("a") == 2000.0
    ledger.forget("a")
    assert ledger.prefill_rate("a") is None
    ledger.open("a", 1000, 10, now=1.0)
    assert ledger.prefill_done("a", 1.5) == 0.0  # no rate for the new pod of that name yet


def test_prefill_rate_is_a_low_quantile_of_its_recent_samples_so_wild_high_ones_do_not_move_it():
    rate = PrefillRate(window=8, min_samples=3)
    # a router started beside engines that hold their prefixes: most first samples are many times the real rate
    rate.observe(1000, 0.01)
    rate.observe(1000, 0.02)
    assert rate.tokens_per_s is None  # too few samples to trust
    rate.observe(1000, 0.5)  # 2000 tokens/s, the real rate
    rate.observe(1000, 0.5)
    rate.observe(1000, 0.01)
    assert rate.tokens_per_s == 2000.0  # 3 of 5 samples are wild, the median would be 50,000
    rate.observe(1000, 0.0)  # no time: no sample
    rate.observe(10, 0.001)  # too short to measure prefill
    assert rate.tokens_per_s == 2000.0
    for _ in range(8):  # the replica really got faster: the window follows
        rate.observe(1000, 0.25)
    assert rate.tokens_per_s == 4000.0


def test_generating_more_than_expected_never_goes_negative():
    ledger = LoadLedger()
    ticket = ledger.open("a", 5, 2)
    ledger.generated(ticket, 50)
    assert ledger.load("a").tokens == 0
    ledger.close(ticket)
    assert ledger.load("a").tokens == 0


operations = st.lists(
    st.tuples(st.sampled_from(["open", "first", "gen", "close"]), st.integers(0, 5), st.integers(0, 500)),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(operations)
def test_ledger_never_negative_and_returns_to_zero_when_every_ticket_closes(ops):
    ledger = LoadLedger(decode_horizon=100)
    lengths = OutputLength()  # half the tickets are recharged by age (their decode may grow)
    for i in range(50):
        lengths.observe(3 + 97 * (i % 2))
    tickets = []
    for op, which, amount in ops:
        if op == "open":
            by_age = (lengths, 200) if which % 2 else (None, 0)
            tickets.append(
                ledger.open(f"r{which % 3}", amount, amount // 2, output=by_age[0], output_cap=by_age[1])
            )
        elif tickets:
            ticket = tickets[which % len(tickets)]
            if op == "first":
                ledger.first_token(ticket)
            elif op == "gen":
                ledger.generated(ticket, amount)
            else:
                ledger.close(ticket)
        for name in ("r0", "r1", "r2"):
            load = ledger.load(name)
            assert load.tokens >= 0 and load.requests >= 0
            assert load.tokens == sum(t.tokens_left for t in tickets if t.replica == name and not t.closed)
            beyond = sum(max(0, t.decode_left - 100) for t in tickets if t.replica == name and not t.closed)
            assert ledger.decode_beyond(name) == beyond
    for ticket in tickets:
        ledger.close(ticket)
    assert ledger.snapshot() == {} and all(ledger.decode_beyond(name) == 0 for name in ("r0", "r1", "r2"))


def test_ejection_after_consecutive_failures_with_backoff():
    tracker = FailureTracker(EjectionPolicy(consecutive_failures=2, base_s=10, max_s=15))
    assert not tracker.record_failure("a", now=0)
    assert tracker.record_failure("a", now=1)
    assert tracker.is_ejected("a", now=5) and not tracker.is_ejected("a", now=11.5)
    tracker.record_failure("a", now=12)
    assert tracker.record_failure("a", now=13)  # second ejection in a row: doubled, capped at 15
    assert tracker.is_ejected("a", now=27) and not tracker.is_ejected("a", now=28.5)
    tracker.record_success("a")
    assert not tracker.is_ejected("a", now=14)


def test_success_resets_the_failure_count():
    tracker = FailureTracker(EjectionPolicy(consecutive_failures=2))
    tracker.record_failure("a", now=0)
    tracker.record_success("a")
    assert not tracker.record_failure("a", now=1)


def test_kv_footprint_counts_a_prefix_shared_in_flight_once_and_empties_when_the_requests_end():
    ledger = LoadLedger()
    tenant_a = ledger.open("r", 100, 10, KvHold((1, 2, 3), private_blocks=1, tokens_per_block=16.0))
    tenant_a_again = ledger.open("r", 10, 10, KvHold((1, 2, 3), private_blocks=2, tokens_per_block=16.0))
    assert ledger.kv_held_tokens("r") == (3 + 1 + 2) * 16  # the prefix once, each request's private blocks
    # A third request of the same tenant adds only its private blocks; one of another tenant, all of its own.
    assert ledger.kv_new_tokens("r", (1, 2, 3), 1, 16.0) == 16
    assert ledger.kv_new_tokens("r", (7, 8, 9), 1, 16.0) == 4 * 16
    assert ledger.kv_new_tokens("elsewhere", (1, 2, 3), 1, 16.0) == 4 * 16
    ledger.close(tenant_a)
    assert ledger.kv_held_tokens("r") == (3 + 2) * 16  # the prefix stays while a holder is in flight
    ledger.close(tenant_a_again)
    ledger.close(tenant_a_again)  # idempotent, as for the load
    assert ledger.kv_held_tokens("r") == 0 and ledger.kv_new_tokens("r", (1, 2, 3), 0, 16.0) == 3 * 16


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["open", "close"]), st.lists(st.integers(0, 6), max_size=5), st.integers(0, 3)
        ),
        max_size=40,
    )
)
def test_kv_footprint_is_the_union_of_the_open_tickets_blocks(ops):
    ledger = LoadLedger()
    open_tickets = []
    for op, blocks, private in ops:
        if op == "open":
            open_tickets.append(ledger.open("r", 1, 1, KvHold(tuple(blocks), private, 2.5)))
        elif open_tickets:
            ledger.close(open_tickets.pop(0))
        union = {block for ticket in open_tickets for block in ticket.kv.blocks}
        private_total = sum(ticket.kv.private_blocks for ticket in open_tickets)
        assert abs(ledger.kv_held_tokens("r") - (len(union) + private_total) * 2.5) < 1e-6


def test_a_ticket_moved_to_another_replica_takes_its_load_and_kv_along():
    ledger = LoadLedger()
    ticket = ledger.open("primary", 100, 10, KvHold((1, 2), private_blocks=1, tokens_per_block=16.0))
    moved = ledger.move(ticket, "fallback")
    assert ticket.closed and ledger.load("primary").requests == 0 and ledger.kv_held_tokens("primary") == 0
    assert ledger.load("fallback").tokens == 110 and ledger.kv_held_tokens("fallback") == 3 * 16
    ledger.close(moved)
    assert ledger.open_tickets() == 0 and ledger.kv_held_tokens("fallback") == 0


def test_a_ticket_with_the_models_answer_lengths_is_recharged_by_its_age():
    lengths = OutputLength()
    for i in range(1000):  # 70% of answers end within 60 tokens, 30% run to ~2,000
        lengths.observe(1 + i % 60 if i % 10 < 7 else 2000 + i % 49)
    ledger = LoadLedger()
    by_age = ledger.open("a", 100, lengths.remaining(0, 2048), output=lengths, output_cap=2048)
    counted_down = ledger.open("b", 100, lengths.expected(2048))
    for _ in range(200):
        ledger.generated(by_age, 1)
        ledger.generated(counted_down, 1)
    assert by_age.generated == 200
    assert ledger.load("a").tokens == by_age.decode_left == lengths.remaining(200, 2048) > 1_700
    assert ledger.load("b").tokens == lengths.expected(2048) - 200  # the mean, counted down
    moved = ledger.move(by_age, "c")  # a gateway fell back: the age and the lengths go along
    ledger.generated(moved, 1)
    assert ledger.load("c").tokens == lengths.remaining(201, 2048) and ledger.load("a").requests == 0
    ledger.close(moved)
    ledger.close(counted_down)
    assert ledger.snapshot() == {}
