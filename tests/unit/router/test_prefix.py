import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.router.prefix import (
    PrefixIndex,
    ReplicaPrefixCache,
    hash_prompt,
    private_blocks,
    token_bytes,
)


def test_chained_hashes_share_exactly_the_common_prefix_blocks():
    block = 16 * 4  # block_size tokens * chars per token
    base = "s" * (3 * block)
    a = hash_prompt(base + "a" * block)
    b = hash_prompt(base + "b" * block)
    assert len(a.hashes) == len(b.hashes) == 4
    assert a.hashes[:3] == b.hashes[:3]
    assert a.hashes[3] != b.hashes[3]


def test_same_block_content_at_another_position_hashes_differently():
    block = "x" * 64
    h = hash_prompt(block * 2).hashes
    assert h[0] != h[1]  # chained: block 1's hash covers block 0 as well


def test_partial_trailing_block_is_not_hashed_and_tokens_are_estimated():
    blocks = hash_prompt("y" * 100)
    assert len(blocks.hashes) == 1
    assert blocks.prompt_tokens == 25  # 100 bytes at the default 4 per token


def test_tokenizer_mode_blocks_by_token_ids():
    tokenizer = lambda text: [ord(c) for c in text]  # noqa: E731 - one token per character
    blocks = hash_prompt("abcdefgh" * 4, block_size=8, tokenizer=tokenizer)
    assert len(blocks.hashes) == 4
    assert blocks.prompt_tokens == 32
    assert blocks.tokens_per_block == 8


def _reference_chain(payloads: list[bytes]) -> list[int]:
    """The chained hashes as first defined (what peers on Redis expect): each block's parent as an integer,
    packed back to 8 little-endian bytes before the block's bytes."""
    hashes, parent = [], 0
    for payload in payloads:
        digest = hashlib.blake2b(parent.to_bytes(8, "little") + payload, digest_size=8).digest()
        parent = int.from_bytes(digest, "little")
        hashes.append(parent)
    return hashes


def _reference_token_hashes(ids: list[int], block_size: int) -> list[int]:
    """Token blocks as first defined: each id packed with int.to_bytes."""
    return _reference_chain(
        [
            b"".join(i.to_bytes(4, "little") for i in ids[start : start + block_size])
            for start in range(0, len(ids) - block_size + 1, block_size)
        ]
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.integers(1, 9), st.integers(1, 5))
def test_character_block_hashes_equal_the_first_definition(text, block_size, chars_per_token):
    data = text.encode("utf-8", "surrogatepass")
    width = block_size * chars_per_token
    payloads = [data[start : start + width] for start in range(0, len(data) - width + 1, width)]
    blocks = hash_prompt(text, block_size=block_size, chars_per_token=chars_per_token)
    assert list(blocks.hashes) == _reference_chain(payloads)


def test_block_hashes_are_pinned_across_versions():
    """Routers of two versions share prefix hashes through Redis during a rolling upgrade: a change here is a
    change of the prefix inserts they exchange (shared.py), never a refactoring."""
    assert hash_prompt("tokenyard " * 13, 16).hashes == (9608706877102696835, 17081538581555264916)
    assert hash_prompt("x", 16, lambda _text: list(range(40))).hashes == (
        10251598853290956434,
        14413796365232270483,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=80), st.integers(1, 17))
def test_packed_token_hashes_equal_the_per_id_definition(ids, block_size):
    blocks = hash_prompt("ignored", block_size=block_size, tokenizer=lambda _text: ids)
    assert list(blocks.hashes) == _reference_token_hashes(ids, block_size)
    assert blocks.prompt_tokens == len(ids)


def test_token_ids_outside_u32_are_rejected():
    assert token_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    with pytest.raises(OverflowError):
        token_bytes([2**32])
    with pytest.raises(OverflowError):
        token_bytes([-1])


def test_match_counts_leading_blocks_only():
    cache = ReplicaPrefixCache(capacity_blocks=100)
    cache.insert([1, 2, 3], now=0)
    assert cache.match_blocks([1, 2, 3, 4], now=0) == 3
    assert cache.match_blocks([9, 2, 3], now=0) == 0


def test_lru_eviction_drops_least_recent_prompt_tail_first():
    cache = ReplicaPrefixCache(capacity_blocks=4)
    cache.insert([1, 2, 3], now=0)
    cache.insert([10, 11], now=1)
    assert len(cache) == 4
    # the tail of the older prompt went first; its head survives
    assert cache.contains(1) and cache.contains(2) and not cache.contains(3)
    assert cache.match_blocks([1, 2, 3], now=1) == 2


def test_touching_a_prefix_protects_it_from_eviction():
    cache = ReplicaPrefixCache(capacity_blocks=3)
    cache.insert([1, 2], now=0)
    cache.insert([3], now=1)
    cache.insert([1], now=2)  # 1 is now the most recent
    cache.insert([4], now=3)  # evicts 2 (oldest), not 1
    assert cache.contains(1) and not cache.contains(2)


def test_a_request_fills_blocks_beyond_its_full_prompt_blocks():
    # 40 prompt tokens in blocks of 16: 2 full blocks hashed, then the partial third and the output
    assert private_blocks(2, prompt_tokens=40, output_tokens=24, block_size=16) == 2  # 64 tokens = 4 blocks
    assert private_blocks(2, prompt_tokens=32, output_tokens=0, block_size=16) == 0
    assert private_blocks(2, prompt_tokens=32, output_tokens=1, block_size=16) == 1


def test_private_blocks_push_older_prefixes_out_as_in_the_engine():
    def index_after(private: int) -> ReplicaPrefixCache:
        cache = ReplicaPrefixCache(capacity_blocks=8)
        cache.insert([1, 2, 3, 4], now=0, private_blocks=private)
        cache.insert([10, 11], now=1, private_blocks=private)
        cache.insert([20, 21], now=2, private_blocks=private)
        return cache

    # counting only prompt blocks, the first prompt looks cached still; the engine filled 8 more blocks
    # (2 per request beyond the prompts) and evicted it
    assert index_after(private=0).match_blocks([1, 2, 3, 4], now=2) == 4
    churned = index_after(private=2)
    assert churned.match_blocks([1, 2, 3, 4], now=2) == 0
    assert len(churned) == 8
    # a request's private blocks go before its own prompt: the newest prompt is intact
    assert churned.match_blocks([20, 21], now=2) == 2


def test_entries_age_out():
    cache = ReplicaPrefixCache(capacity_blocks=10, max_age_s=5)
    cache.insert([1, 2], now=0)
    assert cache.match_blocks([1, 2], now=4) == 2
    assert cache.match_blocks([1, 2], now=6) == 0
    assert len(cache) == 0


def test_capacity_follows_the_replica_report():
    index = PrefixIndex(default_capacity_blocks=10)
    index.insert("r", list(range(10)), now=0)
    index.set_capacity("r", 4)
    assert len(index.replica("r")) == 4
    assert index.match_blocks("unknown", [1], now=0) == 0


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 20),
    prompts=st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=12), max_size=25),
)
def test_index_never_exceeds_capacity_and_the_last_prompt_matches_within_capacity(capacity, prompts):
    cache = ReplicaPrefixCache(capacity_blocks=capacity)
    for t, prompt in enumerate(prompts):
        hashes = list(dict.fromkeys(prompt))  # chained hashes of one prompt are distinct
        cache.insert(hashes, now=t, private_blocks=t % 3)
        assert len(cache) <= capacity
        # right after insertion the prompt's head (up to the capacity) is present
        assert cache.match_blocks(hashes, now=t) == min(len(hashes), capacity)


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=400), st.text(max_size=400))
def test_common_prefix_blocks_are_shared(a, b):
    ha, hb = hash_prompt(a), hash_prompt(b)
    common = 0
    for x, y in zip(a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass"), strict=False):
        if x != y:
            break
        common += 1
    full_common_blocks = common // 64
    assert ha.hashes[:full_common_blocks] == hb.hashes[:full_common_blocks]


def test_last_used_follows_the_held_chain_and_forget_used_until_drops_the_oldest():
    cache = ReplicaPrefixCache(capacity_blocks=10)
    cache.insert([1, 2], now=0)
    cache.insert([3], now=1)
    cache.insert([1, 4], now=2)
    assert cache.last_used([1, 2, 9, 3]) == (2, 0)  # the chain breaks at the first block not held
    assert cache.forget_used_until(1) == 2  # blocks 2 and 3, the least recently sent
    assert cache.match_blocks([1, 4], now=3) == 2 and cache.match_blocks([3], now=3) == 0
    assert cache.forget_used_until(-1) == 0
