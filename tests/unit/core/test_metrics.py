"""vLLM's KV cache size from the labels of `vllm:cache_config_info`, in both shapes found in the field."""

import pytest
from tokenyard.core.metrics import vllm_kv_capacity_tokens, whole_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2048", 2048),
        ("2048.0", 2048),
        ("0", None),
        ("-16", None),
        ("None", None),
        ("", None),
        (None, None),
        ("16.5", None),
        ("nan", None),
        ("inf", None),
        ("x", None),
    ],
)
def test_a_label_is_a_size_only_when_it_is_a_positive_whole_number(text, expected):
    assert whole_number(text) == expected


def test_the_stated_capacity_wins_over_blocks_times_block_size():
    # vLLM 0.13: only blocks and their size
    assert vllm_kv_capacity_tokens({"num_gpu_blocks": "2048", "block_size": "16", "engine": "0"}) == 32768
    # a hybrid model on a release with vllm-project/vllm#42206: block_size is the smallest group's block, the
    # product means nothing, the stated size is the capacity
    hybrid = {"num_gpu_blocks": "320", "block_size": "8", "kv_cache_size_tokens": "463459"}
    assert vllm_kv_capacity_tokens(hybrid) == 463459
    # "None" (no KV cache: encoder-only, attention-free) is not replaced by the product
    assert (
        vllm_kv_capacity_tokens({"num_gpu_blocks": "320", "block_size": "8", "kv_cache_size_tokens": "None"})
        is None
    )
    # not profiled yet, or missing pieces
    assert vllm_kv_capacity_tokens({"num_gpu_blocks": "None", "block_size": "16"}) is None
    assert vllm_kv_capacity_tokens({"block_size": "16"}) is None
    assert vllm_kv_capacity_tokens({}) is None
