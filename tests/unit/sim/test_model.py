"""The performance model against hand-computed figures."""

from dataclasses import replace

import pytest
from tokenyard.sim.model import (
    BANDWIDTH_EFFICIENCY,
    GIB,
    GPUS,
    MODELS,
    PER_SEQUENCE_STEP_S,
    STEP_OVERHEAD_S,
    Deployment,
    PresetError,
    StepShape,
    gpu_preset,
    model_preset,
)


def test_llama_70b_bf16_kv_bytes_per_token():
    # 80 layers x 8 KV heads x 128 head_dim x 2 (K and V) x 2 bytes
    assert model_preset("llama-3.1-70b").kv_bytes_per_token() == 327_680


def test_kv_heads_split_by_tp_and_replicated_beyond_their_number():
    m = model_preset("llama-3.1-70b")
    assert m.kv_bytes_per_token(tp=4) == 327_680 // 4
    assert m.kv_bytes_per_token(tp=8) == 327_680 // 8
    assert m.kv_bytes_per_token(tp=16) == 327_680 // 8  # 8 KV heads: each GPU keeps one


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.6),
        ("llama-3.1-405b", 405.9),
        ("qwen2.5-72b", 72.7),
        ("mixtral-8x7b", 46.7),
    ],
)
def test_parameter_counts_match_the_model_cards(name, published_billions):
    assert model_preset(name).total_params / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_mixtral_activates_about_13b_parameters_per_token():
    assert model_preset("mixtral-8x7b").active_params_per_token / 1e9 == pytest.approx(12.9, rel=0.03)


def _batch_one_weight_bytes(d: Deployment) -> float:
    """Bytes of weights a batch-1 decode step must read per GPU: all of them for a dense model; for a
    mixture of experts, the shared layers and the experts one token is routed to."""
    m = d.model
    if not m.is_moe:
        return d.weight_bytes_per_gpu
    return m.active_params_per_token * m.dtype_bytes / d.tp


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("gpu", list(GPUS))
def test_decode_at_batch_one_is_no_faster_than_reading_the_weights(model, gpu):
    for tp in (1, 2, 4, 8):
        try:
            d = Deployment(model_preset(model), gpu_preset(gpu), tp=tp)
        except PresetError:
            continue
        floor = _batch_one_weight_bytes(d) / d.gpu.hbm_bytes_per_s
        step = d.decode_step_seconds(batch=1, context_tokens=1)
        assert step >= floor
        # and the weights dominate it: within the bandwidth efficiency, overheads and communication
        assert step <= floor / BANDWIDTH_EFFICIENCY * 1.3 + 0.002
        break


def test_llama_8b_decode_step_on_h100_by_hand():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    # every weight but the input embedding (a lookup): 8.03e9 - 128256 x 4096 parameters, bf16
    weights = (8.03e9 - 128_256 * 4096) * 2
    hand = weights / (3.35e12 * BANDWIDTH_EFFICIENCY)  # about 5.6 ms
    assert d.decode_step_seconds(1, 1) == pytest.approx(
        hand + STEP_OVERHEAD_S + PER_SEQUENCE_STEP_S, rel=0.01
    )
    assert d.decode_step_seconds(1, 1) >= 8.03e9 * 2 / 3.35e12  # the floor: all weights at peak


def test_each_sequence_of_a_step_adds_the_per_sequence_cost_and_nothing_else_does():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    one, sixteen = (d.step_cost(StepShape(n, n, n * 100, n * 100)) for n in (1, 16))
    assert one.overhead_s == pytest.approx(STEP_OVERHEAD_S + PER_SEQUENCE_STEP_S)
    assert sixteen.overhead_s - one.overhead_s == pytest.approx(15 * PER_SEQUENCE_STEP_S)
    without = replace(d, per_sequence_step_s=0.0)
    added = d.decode_step_seconds(16, 100) - without.decode_step_seconds(16, 100)
    assert added == pytest.approx(16 * PER_SEQUENCE_STEP_S)


def test_the_per_sequence_cost_bounds_an_engines_decode_rate_whatever_the_batch():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    rates = [b / d.decode_step_seconds(b, 1) for b in (1, 16, 64, 256, 1024)]
    assert rates == sorted(rates)  # batching still pays
    assert rates[-1] < 1 / PER_SEQUENCE_STEP_S


def test_a_negative_per_sequence_cost_is_refused_by_name():
    with pytest.raises(PresetError, match="per-sequence step cost must be >= 0 s, got -1e-06"):
        Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"), per_sequence_step_s=-1e-6)


def test_prefill_time_per_token_falls_as_the_batch_fills_until_compute_bound():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    # batches of 64-token prompts, from 64 to 8192 tokens (the default token budget)
    counts = [1, 2, 4, 8, 16, 32, 64, 128]
    per_token = [d.prefill_step_seconds(64, k) / (64 * k) for k in counts]
    assert all(a > b for a, b in zip(per_token, per_token[1:], strict=False)), per_token
    costs = [d.step_cost(StepShape(64 * k, k, k * 64 * 65 // 2, 0)) for k in counts]
    assert costs[0].memory_s > costs[0].compute_s  # 64 tokens: bandwidth-bound
    assert costs[-1].compute_s > costs[-1].memory_s  # a full budget: compute-bound
    # the fall is steep while bandwidth-bound and flat once compute-bound
    assert per_token[0] / per_token[2] > 3
    assert per_token[-2] / per_token[-1] < 1.02


def test_decode_throughput_grows_with_batch():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    tok_s = [b / d.decode_step_seconds(b, 1024) for b in (1, 16, 64, 256)]
    assert tok_s == sorted(tok_s)
    assert tok_s[-1] > 30 * tok_s[0]


def test_tensor_parallel_adds_all_reduce_time():
    m, g = model_preset("llama-3.1-70b"), gpu_preset("h100-sxm")
    shape = StepShape(num_tokens=4096, num_seqs=1, attention_pairs=4096 * 2048, kv_tokens_read=0)
    assert Deployment(m, g, tp=2).step_cost(shape).comm_s > 0
    assert Deployment(m, g, tp=4).step_cost(shape).comm_s > Deployment(m, g, tp=2).step_cost(shape).comm_s
    l40s = Deployment(m, gpu_preset("l40s"), tp=4)
    assert l40s.step_cost(shape).comm_s > Deployment(m, g, tp=4).step_cost(shape).comm_s  # PCIe, not NVLink


def test_moe_reads_more_experts_as_the_batch_grows():
    d = Deployment(model_preset("mixtral-8x7b"), gpu_preset("h200"))
    assert d.expected_experts_touched(1) == pytest.approx(2.0)
    assert d.expected_experts_touched(64) == pytest.approx(8.0, rel=1e-3)


def test_num_gpu_blocks_from_memory_left_after_weights():
    d = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"))
    usable = 81559 * 1024**2 * 0.9
    left = usable - 8.03e9 * 2 - d.activation_bytes_per_gpu
    assert d.num_gpu_blocks == pytest.approx(left / (16 * 131_072), rel=0.01)
    assert 20_000 < d.num_gpu_blocks < 30_000  # about 54 GiB of KV: 420k+ tokens
    more = Deployment(model_preset("llama-3.1-8b"), gpu_preset("h100-sxm"), gpu_memory_utilization=0.95)
    assert more.num_gpu_blocks > d.num_gpu_blocks


def test_a_model_that_does_not_fit_is_refused_with_a_reason():
    with pytest.raises(PresetError, match="does not fit.*raise --tp"):
        Deployment(model_preset("llama-3.1-70b"), gpu_preset("a100-80gb"), tp=1)
    assert (
        Deployment(model_preset("llama-3.1-70b"), gpu_preset("a100-80gb"), tp=2).weight_bytes_per_gpu
        < 80 * GIB
    )


def test_presets_resolve_by_name_hf_id_and_gpu_product_label():
    assert model_preset("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    assert model_preset("Llama-3.1-70B-Instruct").name == "llama-3.1-70b"
    assert gpu_preset("NVIDIA-H100-80GB-HBM3").name == "h100-sxm"
    assert gpu_preset("NVIDIA-A100-SXM4-80GB").name == "a100-80gb"
    with pytest.raises(PresetError, match="unknown GPU preset 'tpu'"):
        gpu_preset("tpu")


def test_llama_405b_shapes_from_its_config_json():
    m = model_preset("llama-3.1-405b")
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (
        126,
        16384,
        128,
        8,
        128,
    )
    assert (m.intermediate_size, m.vocab_size, m.max_position_embeddings) == (53248, 128256, 131072)


def test_pipeline_stages_split_weights_and_kv_but_not_the_step():
    m, g = model_preset("llama-3.1-70b"), gpu_preset("h100-sxm")
    tp4, tp2pp2 = Deployment(m, g, tp=4), Deployment(m, g, tp=2, pp=2)
    assert tp2pp2.weight_bytes_per_gpu == tp4.weight_bytes_per_gpu
    assert m.kv_bytes_per_token(tp=2, pp=2) == m.kv_bytes_per_token(tp=4)
    assert m.kv_bytes_per_token(pp=3) == 27 * 8 * 128 * 2 * 2  # 80 layers: the first stages hold 27
    # one step runs all layers on 2 GPUs at a time: slower than on 4
    assert tp2pp2.decode_step_seconds(64, 1000) > tp4.decode_step_seconds(64, 1000)
    with pytest.raises(PresetError, match="pipeline parallel size 81 exceeds the 80 layers"):
        Deployment(m, g, tp=1, pp=81)
