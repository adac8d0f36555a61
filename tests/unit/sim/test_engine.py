"""The engine core: batching, chunked prefill, prefix cache, admission and preemption."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.core.tokenizer import Tokenizer
from tokenyard.sim.engine import BlockPool, Engine, FinishReason, SamplingParams, SchedulerConfig, Status
from tokenyard.sim.model import Deployment, StepShape, gpu_preset, model_preset

BS = 16


class CountingTokens:
    def generated_token(self, seed: int, index: int) -> int:
        return 1_000 + index


def step_seconds(shape: StepShape) -> float:
    return 0.01 + 1e-5 * shape.num_tokens


def make_engine(**config) -> Engine:
    values = dict(
        num_gpu_blocks=1000, max_model_len=4096, block_size=BS, max_num_batched_tokens=512, max_num_seqs=8
    )
    values.update(config)
    return Engine(SchedulerConfig(**values), step_seconds, CountingTokens())


def prompt(n: int, base: int = 0) -> list[int]:
    return [base + i for i in range(n)]


def fixed(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def run(engine: Engine, now: float = 0.0, max_steps: int = 100_000) -> float:
    for _ in range(max_steps):
        outcome = engine.step(now)
        if outcome is None:
            return now
        now = outcome.end_s
    raise AssertionError("the engine did not drain")


def test_a_request_prefills_then_decodes_one_token_per_step():
    e = make_engine()
    r = e.add_request("a", prompt(40), fixed(5), now=0.0)
    first = e.step(0.0)
    assert first.shape.num_tokens == 40 and [t for _, t in first.tokens] == [1000]
    assert r.first_token_s == first.end_s
    second = e.step(first.end_s)
    assert second.shape.num_tokens == 1
    run(e, second.end_s)
    assert r.status is Status.FINISHED and r.finish_reason is FinishReason.LENGTH
    assert r.output_ids == [1000, 1001, 1002, 1003, 1004]
    assert e.pool.num_free == e.pool.num_blocks


def test_a_long_prompt_is_prefilled_in_chunks_under_the_token_budget():
    e = make_engine(max_num_batched_tokens=64)
    r = e.add_request("a", prompt(200), fixed(2), now=0.0)
    steps = []
    now = 0.0
    while r.first_token_s is None:
        outcome = e.step(now)
        steps.append(outcome.shape.num_tokens)
        now = outcome.end_s
    assert steps == [64, 64, 64, 8]


def test_the_batch_is_rebuilt_every_step_and_a_new_request_joins_running_ones():
    e = make_engine()
    e.add_request("a", prompt(20), fixed(50), now=0.0)
    now = e.step(0.0).end_s
    now = e.step(now).end_s
    e.add_request("b", prompt(30, base=500), fixed(5), now=now)
    outcome = e.step(now)
    assert outcome.shape.num_tokens == 1 + 30  # a decodes while b prefills
    assert {r.request_id for r, _ in outcome.tokens} == {"a", "b"}


def test_a_repeated_prompt_hits_the_prefix_cache_and_skips_its_prefill():
    e = make_engine()
    first = e.add_request("a", prompt(100), fixed(1), now=0.0)
    now = run(e)
    second = e.add_request("b", prompt(100), fixed(1), now=now)
    outcome = e.step(now)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 96  # 6 full blocks; the last token is always computed
    assert outcome.shape.num_tokens == 4
    assert e.prefix_cache_queries == 200 and e.prefix_cache_hits == 96


def test_requests_admitted_in_one_step_share_the_prompt_blocks_the_first_one_computes():
    """vLLM V1 offers a prompt's blocks to the prefix cache as their step is scheduled, so the second of two
    identical prompts admitted in the same step finds them (the samples of an n > 1 request arrive so)."""
    e = make_engine()
    first = e.add_request("a", prompt(100), fixed(1), now=0.0)
    second = e.add_request("b", prompt(100), fixed(1), now=0.0)
    outcome = e.step(0.0)
    assert set(outcome.admitted) == {first, second}
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 96
    assert outcome.shape.num_tokens == 100 + 4


def test_sglang_caches_a_prompt_only_after_its_step_ran():
    """SGLang's radix tree takes a prefill in after the forward: two identical prompts in one batch both
    compute it, and a third one, a step later, hits."""
    e = make_engine(cache_when_scheduled=False)
    first = e.add_request("a", prompt(100), fixed(2), now=0.0)
    second = e.add_request("b", prompt(100), fixed(2), now=0.0)
    outcome = e.step(0.0)
    assert first.num_cached_tokens == second.num_cached_tokens == 0
    assert outcome.shape.num_tokens == 200
    third = e.add_request("c", prompt(100), fixed(1), now=outcome.end_s)
    e.step(outcome.end_s)
    assert third.num_cached_tokens == 96


def test_the_samples_of_one_request_draw_their_own_lengths():
    e = make_engine()
    samples = [
        e.add_request(f"s{i}", prompt(20), SamplingParams(max_tokens=4000), 0.0, sample=i) for i in range(8)
    ]
    assert len({r.natural_length for r in samples}) > 1
    again = e.add_request("again", prompt(20), SamplingParams(max_tokens=4000), 0.0)
    assert again.natural_length == samples[0].natural_length  # the first sample is the request as before


def test_a_shared_prefix_hits_up_to_the_first_differing_block():
    e = make_engine()
    e.add_request("a", prompt(64) + [7] * 32, fixed(1), now=0.0)
    now = run(e)
    r = e.add_request("b", prompt(64) + [9] * 32, fixed(1), now=now)
    e.step(now)
    assert r.num_cached_tokens == 64


def test_cached_blocks_are_evicted_least_recently_used_first():
    e = make_engine(num_gpu_blocks=12, watermark_fraction=0.0)
    now = 0.0
    for name, base in (("a", 0), ("b", 1000)):  # 4 blocks each, kept cached after they end
        e.add_request(name, prompt(64, base), fixed(1), now=now)
        now = run(e, now)
    e.add_request("c", prompt(64, 2000), fixed(1), now=now)  # takes the 4 never-used blocks, then a's
    now = run(e, now)
    e.add_request("d", prompt(64, 3000), fixed(1), now=now)  # needs 5 blocks: evicts a's, keeps b's
    now = run(e, now)
    again_b = e.add_request("b2", prompt(64, 1000), fixed(1), now=now)
    now = run(e, now)
    again_a = e.add_request("a2", prompt(64, 0), fixed(1), now=now)
    run(e, now)
    assert again_b.num_cached_tokens == 48
    assert again_a.num_cached_tokens == 0


def test_requests_queue_when_max_num_seqs_is_reached():
    e = make_engine(max_num_seqs=2)
    for i in range(3):
        e.add_request(str(i), prompt(10, 100 * i), fixed(20), now=0.0)
    e.step(0.0)
    assert e.num_running == 2 and e.num_waiting == 1
    run(e)
    assert e.num_running == e.num_waiting == 0


def test_admission_keeps_a_watermark_of_free_blocks_while_others_run():
    e = make_engine(num_gpu_blocks=100, watermark_fraction=0.1, max_num_batched_tokens=4096)
    e.add_request("a", prompt(16 * 60), fixed(100), now=0.0)  # 60 blocks
    e.add_request("b", prompt(16 * 32, 5000), fixed(5), now=0.0)  # 32 more would leave 8 < 10 free
    now = e.step(0.0).end_s
    now = e.step(now).end_s
    assert e.num_running == 1 and e.num_waiting == 1
    e.abort("a", now)
    e.step(now)  # alone, b is admitted whatever the watermark
    assert e.num_running == 1 and e.num_waiting == 0


def test_out_of_blocks_preempts_the_newest_request_which_is_recomputed_later():
    e = make_engine(num_gpu_blocks=10, watermark_fraction=0.0, max_num_batched_tokens=4096)
    old = e.add_request("old", prompt(32), fixed(60), now=0.0)  # grows to 92 tokens: 6 blocks
    new = e.add_request("new", prompt(32, 500), fixed(60), now=0.0)
    run(e)
    assert e.num_preemptions >= 1
    assert new.num_preemptions >= 1 and old.num_preemptions == 0
    assert old.first_token_s < new.finished_s and old.finished_s < new.finished_s
    assert new.num_output_tokens == 60 and new.finish_reason is FinishReason.LENGTH
    assert e.pool.num_free == e.pool.num_blocks


def test_without_ignore_eos_a_request_stops_at_its_natural_length_but_not_before_min_tokens():
    e = make_engine()
    r = e.add_request("a", prompt(20), SamplingParams(max_tokens=2000), now=0.0)
    run(e)
    assert r.finish_reason is FinishReason.STOP and r.num_output_tokens == r.natural_length
    e2 = make_engine()
    r2 = e2.add_request("a", prompt(20), SamplingParams(max_tokens=2000, min_tokens=1000), now=0.0)
    run(e2)
    assert r2.finish_reason is FinishReason.STOP and r2.num_output_tokens == 1000


def test_abort_frees_the_blocks_and_keeps_the_prefix_cached():
    e = make_engine()
    r = e.add_request("a", prompt(64), fixed(100), now=0.0)
    now = e.step(0.0).end_s
    assert e.pool.num_free < e.pool.num_blocks
    assert e.abort("a", now) is r and r.finish_reason is FinishReason.ABORT
    assert e.pool.num_free == e.pool.num_blocks and e.pool.num_cached == 4
    assert e.abort("a", now) is None
    assert e.step(now) is None


def test_requests_that_cannot_fit_the_context_window_are_refused():
    e = make_engine(max_model_len=100)
    for bad in (
        lambda: e.add_request("a", prompt(90), fixed(20), 0.0),
        lambda: e.add_request("b", [], fixed(1), 0.0),
    ):
        try:
            bad()
        except ValueError as err:
            assert "context window" in str(err) or "empty" in str(err)
        else:
            raise AssertionError("accepted")


def test_step_times_come_from_the_deployment():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    e = Engine.for_deployment(d, Tokenizer(d.model.vocab_size))
    e.add_request("a", prompt(2048), fixed(2), now=0.0)
    outcome = e.step(0.0)
    assert outcome.duration_s == d.step_seconds(outcome.shape)
    assert outcome.shape.num_tokens == 2048


def test_block_pool_reference_counts_shared_blocks():
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.register(a[0], 111)
    pool.touch([a[0]])  # a second request shares the first block
    pool.release(a)
    assert pool.num_free == 3 and pool.lookup([111]) == [a[0]]
    pool.release([a[0]])
    assert pool.num_free == 4 and pool.lookup([111]) == [a[0]]
    pool.allocate(4)
    assert pool.lookup([111]) == []


workload = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 40), st.integers(0, 3), st.integers(0, 5)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(workload=workload, blocks=st.integers(30, 120), budget=st.integers(16, 600), seqs=st.integers(1, 6))
def test_invariants_hold_for_any_workload(workload, blocks, budget, seqs):
    e = make_engine(
        num_gpu_blocks=blocks, max_model_len=blocks * BS, max_num_batched_tokens=budget, max_num_seqs=seqs
    )
    requests = []
    now = 0.0
    pending = list(enumerate(workload))
    for _ in range(100_000):
        # prompts share prefixes (family) so the prefix cache is exercised
        while pending and pending[0][1][3] <= e.steps:
            i, (plen, max_tokens, family, _) = pending.pop(0)
            plen = min(plen, blocks * BS - max_tokens)
            if plen < 1:
                continue
            requests.append(e.add_request(str(i), prompt(plen, family * 10_000), fixed(max_tokens), now))
        outcome = e.step(now)
        held = sum(len(r.blocks) for r in e.running)
        assert e.pool.num_free + len({b for r in e.running for b in r.blocks}) == blocks
        assert held >= len({b for r in e.running for b in r.blocks})
        assert e.num_running <= seqs
        for r in e.running:
            assert len(r.blocks) >= math.ceil(r.num_computed / BS)
        if outcome is None:
            if not pending:
                break
            e.steps += 1  # let the next arrivals in
            continue
        assert outcome.shape.num_tokens <= budget
        assert outcome.end_s > now
        now = outcome.end_s
    assert not e.has_work()
    for r in requests:
        assert r.status is Status.FINISHED and r.num_output_tokens == r.params.max_tokens
    assert e.pool.num_free == blocks
    assert 0 <= e.prefix_cache_hits <= e.prefix_cache_queries
