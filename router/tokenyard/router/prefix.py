"""Prefix-cache locality: chained block hashes of a prompt and a per-replica LRU index of them.

An engine with automatic prefix caching (vLLM, SGLang) keeps full KV blocks keyed by the hash of the block's
tokens chained with the hash of every block before it, and evicts the least recently used free blocks when it
needs room. The router mirrors that: it hashes the prompt the same way (tokens when a tokenizer is configured,
fixed-size character blocks otherwise) and remembers, per replica, which chained hashes it has sent there,
in an LRU whose capacity is the replica's KV capacity in blocks (vLLM's ``vllm:cache_config_info``
num_gpu_blocks; SGLang's ``sglang:max_total_num_tokens`` over the routing block, see state.routing_block_size).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Without a tokenizer one block of `block_size` tokens is approximated by block_size * CHARS_PER_TOKEN
# characters; ~4 characters per token is the usual figure for English BPE vocabularies (OpenAI's tokenizer
# guide quotes "one token is roughly 4 characters of English text").
DEFAULT_CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA
# Used until a replica has reported its KV capacity; an 8B model on one 80 GB GPU holds ~30k blocks of 16.
DEFAULT_CAPACITY_BLOCKS = 4096

Tokenizer = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class PromptBlocks:
    """The chained hashes of a prompt's full blocks, and how many tokens one block stands for."""

    hashes: tuple[int, ...]
    # Exact with a tokenizer; without one, a block of characters stands for block chars / bytes per token
    # tokens (the learned ratio, see learned_sizes), which need not be a whole number.
    tokens_per_block: float
    prompt_tokens: int  # the whole prompt, full blocks or not


def chained_block_hashes(data: bytes, block_bytes: int) -> tuple[int, ...]:
    """The chained hash of each full ``block_bytes`` block of ``data``: block i's is the 8-byte blake2b of block
    i-1's digest (8 zero bytes for the first) and block i's bytes, read as a little-endian integer.

    Why the plain loop with the digest carried as bytes: it runs on every request's prompt (~140 blocks for
    bench-router's 1,500-word system prompts), and chaining on the digest itself spares the integer round trip
    per block the first version made, for the same hashes (peers sharing them through Redis still agree:
    test_block_hashes_are_pinned_across_versions)."""
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    hashes: list[int] = []
    parent = bytes(8)
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = blake2b(parent + data[start : start + block_bytes], digest_size=8).digest()
        hashes.append(from_bytes(parent, "little"))
    return tuple(hashes)


# A 4-byte unsigned array typecode: token ids are packed as 4 little-endian bytes each.
_U32 = next(code for code in "IL" if array(code).itemsize == 4)


def token_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as 4 little-endian bytes each (raises OverflowError outside 0..2**32-1).

    Why an array: packing one id at a time with ``int.to_bytes`` was 40% of hash_prompt and ~12% of the
    router's CPU under bench-router's closed loop (py-spy); the array packs a whole prompt in C. The bytes are
    the same on every machine, so peers sharing prefix hashes through Redis agree."""
    packed = array(_U32, ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def hash_prompt(
    text: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
    tokenizer: Tokenizer | None = None,
    chars_per_token: int = DEFAULT_CHARS_PER_TOKEN,
    bytes_per_token: float | None = None,
) -> PromptBlocks:
    """Chained hashes of the full blocks of ``text``; block i's hash covers blocks 0..i, so equal hashes mean
    equal prefixes. A trailing partial block is not hashed: engines cache full blocks only.

    Without a tokenizer a block is ``block_size * chars_per_token`` bytes (a fixed geometry: the hashes, and
    the index built from them, must not change with an estimate), and the prompt's tokens are its bytes over
    ``bytes_per_token`` (the learned ratio; ``chars_per_token`` when not given)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if tokenizer is not None:
        data = token_bytes(tokenizer(text))
        return PromptBlocks(chained_block_hashes(data, block_size * 4), block_size, len(data) // 4)
    block_chars = block_size * chars_per_token
    data = text.encode("utf-8", "surrogatepass")
    ratio = float(bytes_per_token or chars_per_token)
    return PromptBlocks(
        chained_block_hashes(data, block_chars), block_chars / ratio, math.ceil(len(data) / ratio)
    )


def private_blocks(full_prompt_blocks: int, prompt_tokens: int, output_tokens: int, block_size: float) -> int:
    """Blocks a request fills beyond its prompt's full blocks: ceil((prompt + output) / block size) minus them
    (``block_size`` in tokens, a fraction for character blocks)."""
    total = math.ceil((prompt_tokens + output_tokens) / block_size)
    return max(0, total - full_prompt_blocks)


class ReplicaPrefixCache:
    """What one replica most likely still caches: an LRU of chained block hashes with a capacity in blocks
    and an optional maximum age (seconds since the block was last sent there)."""

    def __init__(self, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS, max_age_s: float | None = None):
        self.capacity_blocks = max(1, capacity_blocks)
        self.max_age_s = max_age_s
        self._last_used: OrderedDict[int, float] = OrderedDict()
        # Keys of blocks no prompt can match (see insert): negative, so never equal to a chained hash.
        self._private_keys = itertools.count(-1, -1)

    def __len__(self) -> int:
        return len(self._last_used)

    def resize(self, capacity_blocks: int) -> None:
        self.capacity_blocks = max(1, capacity_blocks)
        self._evict_over_capacity()

    def _evict_over_capacity(self) -> None:
        while len(self._last_used) > self.capacity_blocks:
            self._last_used.popitem(last=False)

    def expire(self, now: float) -> None:
        if self.max_age_s is not None:  # a block exactly max_age_s old stays
            self.forget_used_until(math.nextafter(now - self.max_age_s, -math.inf))

    def match_blocks(self, hashes: Sequence[int], now: float) -> int:
        """How many leading blocks of the prompt this replica still holds (a chain breaks at the first miss,
        exactly as the engine's lookup does)."""
        self.expire(now)
        matched = 0
        for block_hash in hashes:
            if block_hash not in self._last_used:
                break
            matched += 1
        return matched

    def insert(self, hashes: Sequence[int], now: float, private_blocks: int = 0) -> None:
        """Record that the prompt's blocks were sent here at ``now``. Leading blocks are touched last-first so
        that under pressure the tail of a prompt goes before its head, as in the engine (a head block is
        shared by more prompts).

        ``private_blocks``: the other blocks the request fills on the engine (the prompt's partial last block,
        the output), which no later prompt matches. The engine keeps them in the same LRU once the request
        ends, where they push older prefixes out; left uncounted, the index believes prefixes are cached
        after the engine evicted them, and the router sends requests to a replica for a prefix it no longer
        holds (a full prefill). They enter behind the request's own prefix blocks, as the engine releases a
        request's last blocks first."""
        for _ in range(private_blocks):
            self._last_used[next(self._private_keys)] = now
        for block_hash in reversed(hashes):
            self._last_used[block_hash] = now
            self._last_used.move_to_end(block_hash)
        self._evict_over_capacity()

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._last_used

    def last_used(self, hashes: Sequence[int]) -> tuple[float, ...]:
        """When each of these blocks was last sent here, for as long as the chain is held (read before a new
        insert touches them: see RouterState.learn_cached_tokens)."""
        times: list[float] = []
        for block_hash in hashes:
            used_at = self._last_used.get(block_hash)
            if used_at is None:
                break
            times.append(used_at)
        return tuple(times)

    def forget_used_until(self, horizon: float) -> int:
        """Drop every block last sent here at or before ``horizon``; returns how many went. The LRU is in the
        order blocks were last used, so they are the oldest ones."""
        dropped = 0
        while self._last_used:
            oldest_hash, used_at = next(iter(self._last_used.items()))
            if used_at > horizon:
                break
            del self._last_used[oldest_hash]
            dropped += 1
        return dropped


class PrefixIndex:
    """Per-replica prefix caches, keyed by replica name."""

    def __init__(
        self, default_capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS, max_age_s: float | None = None
    ):
        self.default_capacity_blocks = default_capacity_blocks
        self.max_age_s = max_age_s
        self._replicas: dict[str, ReplicaPrefixCache] = {}

    def replica(self, name: str) -> ReplicaPrefixCache:
        cache = self._replicas.get(name)
        if cache is None:
            cache = ReplicaPrefixCache(self.default_capacity_blocks, self.max_age_s)
            self._replicas[name] = cache
        return cache

    def set_capacity(self, name: str, capacity_blocks: int) -> None:
        cache = self.replica(name)
        if cache.capacity_blocks != capacity_blocks:
            cache.resize(capacity_blocks)

    def match_blocks(self, name: str, hashes: Sequence[int], now: float) -> int:
        cache = self._replicas.get(name)
        return 0 if cache is None else cache.match_blocks(hashes, now)

    def insert(self, name: str, hashes: Sequence[int], now: float, private_blocks: int = 0) -> None:
        if hashes or private_blocks:
            self.replica(name).insert(hashes, now, private_blocks)

    def last_used(self, name: str, hashes: Sequence[int]) -> tuple[float, ...]:
        cache = self._replicas.get(name)
        return () if cache is None else cache.last_used(hashes)

    def forget_used_until(self, name: str, horizon: float) -> int:
        cache = self._replicas.get(name)
        return 0 if cache is None else cache.forget_used_until(horizon)

    def forget(self, name: str) -> None:
        self._replicas.pop(name, None)

    def names(self) -> list[str]:
        return list(self._replicas)
