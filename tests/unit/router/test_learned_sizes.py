"""The bytes-per-token ratio the router learns from engines' usage, and what it changes in a decision."""

import pytest
from tokenyard.router import learned_sizes
from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.enginestats import EngineStats
from tokenyard.router.learned_sizes import MIN_ANSWERS, PRIOR_TOKENS, BytesPerToken, OutputLength
from tokenyard.router.prefix import hash_prompt
from tokenyard.router.state import RouterState


def test_the_prior_holds_until_usage_arrives_then_the_observed_ratio_wins():
    ratio = BytesPerToken(prior=4.0)
    assert ratio.value == 4.0
    ratio.observe(prompt_bytes=7_000, prompt_tokens=1_000)
    assert 4.0 < ratio.value < 7.0  # one prompt of 1,000 tokens against a prior worth PRIOR_TOKENS
    for _ in range(40):
        ratio.observe(prompt_bytes=7_000, prompt_tokens=1_000)
    assert abs(ratio.value - 7.0) < 7.0 * PRIOR_TOKENS / 40_000
    ratio.observe(prompt_bytes=0, prompt_tokens=0)  # an answer without usage teaches nothing
    assert ratio.observations == 41


def test_the_ratio_follows_a_change_of_prompt_mix_and_stays_in_bounds():
    ratio = BytesPerToken(prior=4.0)
    for _ in range(100):
        ratio.observe(7_000, 1_000)
    for _ in range(4_000):  # 4M tokens later, at 3 bytes per token: two half-lives
        ratio.observe(3_000, 1_000)
    assert 3.0 < ratio.value < 3.5
    wild = BytesPerToken(prior=4.0)
    wild.observe(10**9, 1)
    assert wild.value == 32.0


def test_character_blocks_count_tokens_by_the_learned_ratio_with_the_same_hashes():
    text = "word " * 400  # 2,000 bytes
    guessed = hash_prompt(text, 16, None, chars_per_token=4)
    learned = hash_prompt(text, 16, None, chars_per_token=4, bytes_per_token=8.0)
    assert guessed.hashes == learned.hashes  # the index keeps working when the estimate moves
    assert (guessed.prompt_tokens, learned.prompt_tokens) == (500, 250)
    assert (guessed.tokens_per_block, learned.tokens_per_block) == (16.0, 8.0)


def test_a_learned_ratio_resizes_the_index_and_the_load_of_a_decision():
    state = RouterState()
    state.set_models({"m": ModelView("m", [Endpoint("a", "http://a")])})
    state.record_stats("a", EngineStats(scraped_at=0.0, block_size=16, num_gpu_blocks=2048))
    prompt = "x" * 8_000
    before = state.route("m", prompt, 10, now=0.0)
    assert before.prompt_tokens == 2_000
    assert state.index.replica("a").capacity_blocks == 2048  # 64-byte blocks of 16 guessed tokens
    state.ledger.close(before.ticket)
    for _ in range(200):
        state.learn_prompt_tokens("m", 8_000, 1_000)  # the engine says: 8 bytes per token
    after = state.route("m", prompt + "y", 10, now=1.0)
    assert 1_000 <= after.prompt_tokens <= 1_050
    # a 64-byte block now stands for ~8 tokens: twice as many of them fit the engine's 32,768 tokens
    assert 4_000 <= state.index.replica("a").capacity_blocks <= 4_200
    learned = state.bytes_per_token["m"].value
    assert 7.8 < learned < 8.0  # the prior still weighs a little
    assert after.prefix_match_tokens == round(125 * 64 / learned)  # all 125 blocks cached, ~8 tokens each


def test_the_cap_is_charged_until_enough_answers_then_their_mean_never_above_the_cap():
    lengths = OutputLength()
    for _ in range(MIN_ANSWERS - 1):
        lengths.observe(300)
    assert lengths.expected(2048) == 2048  # too few answers: the cap
    lengths.observe(300)
    assert lengths.expected(2048) == 300
    assert lengths.expected(24) == 24  # a request's own cap still bounds it
    for _ in range(2000):  # the workload changes: answers of 40 tokens
        lengths.observe(40)
    assert 40 <= lengths.expected(2048) <= 45


def test_a_decision_charges_the_learned_output_length_in_the_ledger():
    state = RouterState()
    state.set_models({"m": ModelView("m", [Endpoint("a", "http://a")])})
    first = state.route("m", "x" * 400, 2048, now=0.0)
    assert first.ticket.decode_left == 2048
    state.ledger.close(first.ticket)
    for _ in range(MIN_ANSWERS):
        state.learn_output_tokens("m", 100)
    second = state.route("m", "y" * 400, 2048, now=1.0)
    assert second.ticket.decode_left == 100


def split_answers(lengths: OutputLength, count: int = 1000) -> None:
    """Answers as llm-d-inference-sim writes them under a cap of 2,048: 70% of 1-60 tokens, 30% of 2,000-2,048."""
    for i in range(count):
        lengths.observe(1 + i % 60 if i % 10 < 7 else 2000 + i % 49)


def test_an_answer_that_outlasts_the_short_ones_is_charged_as_a_long_one():
    lengths = OutputLength()
    split_answers(lengths)
    at_start = lengths.remaining(0, 2048)
    assert abs(at_start - lengths.expected(2048)) <= 1  # sent: the mean
    assert 600 <= at_start <= 650
    # 100 tokens in, only the long answers ran this long: it owes ~1,900 more, where the mean counted down to 500
    assert 1_850 <= lengths.remaining(100, 2048) <= 1_950
    assert lengths.remaining(100, 2048) > lengths.remaining(30, 2048) > at_start  # dearer with age, then...
    assert lengths.remaining(2_040, 2048) <= 8  # ...cheaper as it nears the longest
    assert lengths.remaining(5_000, 8192) == 0  # outlived every answer seen
    assert lengths.remaining(100, 512) == 412  # never more than its own cap leaves


def test_where_every_answer_has_one_length_the_charge_counts_down_from_it():
    lengths = OutputLength()
    for _ in range(MIN_ANSWERS - 1):
        lengths.observe(24)
    assert [lengths.remaining(age, 2048) for age in (0, 10)] == [2048, 2038]  # too few answers: the cap's
    lengths.observe(24)
    assert [lengths.remaining(age, 2048) for age in range(30)] == [max(0, 24 - age) for age in range(30)]


def mixed_caps(lengths: OutputLength, mark_capped: bool) -> float:
    """Answers whose own length is 1..1,000 tokens (mean 500.5), half asked with a cap of 200 (cut there when
    longer) and half with a cap of 4,096; returns their true mean."""
    true = []
    for i in range(2000):
        length = 1 + (i * 7919) % 1000
        true.append(length)
        cap = 200 if i % 2 else 4096
        lengths.observe(min(length, cap), reached_cap=mark_capped and length >= cap)
    return sum(true) / len(true)


def test_answers_cut_at_their_cap_count_as_longer_not_as_short():
    marked, unmarked = OutputLength(), OutputLength()
    true_mean = mixed_caps(marked, mark_capped=True)
    mixed_caps(unmarked, mark_capped=False)
    # counted as written, the answers cut at 200 pull the mean a request with a cap of 4,096 is charged to 340
    assert unmarked.expected(4096) < 0.7 * true_mean
    # handed on to the longer answers seen, the estimate is the answers' own (within the decay's recency bias)
    assert abs(marked.expected(4096) - true_mean) < 0.05 * true_mean
    assert marked.remaining(0, 4096) == marked.expected(4096)
    # an answer 511 tokens in is charged by the answers that ran longer (512-1,000: mean 756), ~245 more; the
    # capped ones ran 200 at most here, so both estimates agree
    assert abs(marked.remaining(511, 4096) - 245) <= 15
    assert abs(unmarked.remaining(511, 4096) - 245) <= 15
    assert (
        marked.remaining(0, 200) == unmarked.remaining(0, 200) == 200
    )  # a request's own cap still bounds it
    assert marked.answers == pytest.approx(unmarked.answers)  # the weights move; none is lost


def test_capped_answers_with_none_longer_count_at_their_cap():
    """The tuning workloads (ignore_eos, one max_tokens): every answer is cut at the cap, none is longer, so the
    charge is the count-down from it, as before the mark."""
    capped, plain = OutputLength(), OutputLength()
    for _ in range(MIN_ANSWERS + 5):
        capped.observe(24, reached_cap=True)
        plain.observe(24)
    assert [capped.remaining(age, 2048) for age in range(30)] == [
        plain.remaining(age, 2048) for age in range(30)
    ]
    assert capped.expected(2048) == plain.expected(2048) == 24


def test_a_longer_answer_long_since_decayed_does_not_speak_for_the_capped_ones():
    lengths = OutputLength()
    lengths.observe(3000)  # one long answer, then thousands of answers cut at 100
    for _ in range(3000):
        lengths.observe(100, reached_cap=True)
    assert lengths.expected(4096) == 100  # its weight (~0.016 now) is below one fresh answer's
    for _ in range(2):
        lengths.observe(3000)  # fresh long answers: the capped ones are now taken to run as long
    assert lengths.expected(4096) > 2900


def test_answers_decay_by_their_age_across_a_fold_of_the_growing_unit(monkeypatch):
    """Old answers weigh OUTPUT_DECAY^age of a new one, and every estimate is the same whether or not the
    growing unit was folded into the buckets on the way."""
    observed = [(10 + (i * 37) % 500, i % 7 == 0) for i in range(400)]

    def learn() -> OutputLength:
        lengths = OutputLength()
        for tokens, capped in observed:
            lengths.observe(tokens, reached_cap=capped)
        return lengths

    unfolded = learn()
    monkeypatch.setattr(learned_sizes, "RESCALE_AT", 1.05)  # fold every ~35 answers
    folded = learn()
    weights = [learned_sizes.OUTPUT_DECAY**age for age in range(len(observed) - 1, -1, -1)]
    for lengths in (unfolded, folded):
        assert lengths.answers == pytest.approx(sum(weights))
        assert lengths.capped_answers == pytest.approx(
            sum(w for w, (_, c) in zip(weights, observed, strict=True) if c)
        )
    assert folded.total_tokens == pytest.approx(unfolded.total_tokens)
    assert [folded.remaining(age, 2048) for age in range(0, 520, 13)] == [
        unfolded.remaining(age, 2048) for age in range(0, 520, 13)
    ]
