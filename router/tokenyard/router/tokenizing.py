"""Tokenizers for prefix hashing: from the router's --tokenizer flag or a ModelDeployment's spec.routing.tokenizer.

A spec is ``sim`` or ``sim:VOCAB`` (the simulated engines' tokenizer, ``tokenyard.core.tokenizer``, which needs
no files), or the path of a ``tokenizer.json`` (needs the optional ``tokenizers`` package). Anything else, such
as a Hugging Face hub id, would need a download, which the router never does: such a model is hashed by
character blocks and the router says so once in its log.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from tokenyard.router.prefix import Tokenizer

log = logging.getLogger("tokenyard.router")

LLAMA3_VOCAB = 128_256


class TokenizerUnavailable(ValueError):
    """The tokenizer named by a spec cannot be loaded here; the message says why."""


# A cut goes before a whitespace character that follows a non-whitespace one: where a word ends.
_CUT = re.compile(r"(?<=\S)\s")
SEGMENT_CHARS = 1024
SEGMENT_CACHE_ENTRIES = 4096  # ~1024 characters and their ids each: a few MB, ~4 MB of distinct prefix text


def segment_cuts(text: str, segment_chars: int = SEGMENT_CHARS) -> Iterator[int]:
    """Where ``text`` is cut into segments: at the first word end at least ``segment_chars`` after the
    previous cut. A cut depends only on the text before it, so two prompts that share a prefix are cut alike
    within it (the point of cutting: their shared segments are tokenized once)."""
    start = 0
    while True:
        found = _CUT.search(text, start + segment_chars)
        if found is None:
            return
        start = found.start()
        yield start


class SegmentCachingTokenizer:
    """Tokenizes a prompt segment by segment (cut at word ends, see ``segment_cuts``) and remembers the ids
    of every segment but the last, in an LRU.

    Why: shared-prefix traffic (system prompts, growing chat histories) repeats most of each prompt, and the
    tokenizer was the biggest single cost of a routing decision (bench-router closed loop, py-spy: ~20% of the
    router's CPU with the sim tokenizer). With the cache only the new tail is tokenized.

    Exact for tokenizers that split words before tokenizing them (the sim's; byte-level BPE with a
    GPT-2/Llama-3 pre-tokenizer: a piece never spans a word end followed by whitespace). For others a segment
    boundary may differ by a token from tokenizing the whole text; the ids stay a deterministic function of the
    text, which is all that prefix hashing needs (equal prefixes give equal ids)."""

    def __init__(
        self,
        encode: Callable[[str], Sequence[int]],
        segment_chars: int = SEGMENT_CHARS,
        max_entries: int = SEGMENT_CACHE_ENTRIES,
    ) -> None:
        self.encode = encode
        self.segment_chars = segment_chars
        self.max_entries = max_entries
        self._segments: OrderedDict[str, Sequence[int]] = OrderedDict()

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        for cut in segment_cuts(text, self.segment_chars):
            segment = text[start:cut]
            cached = self._segments.get(segment)
            if cached is None:
                cached = tuple(self.encode(segment))
                self._segments[segment] = cached
                if len(self._segments) > self.max_entries:
                    self._segments.popitem(last=False)
            else:
                self._segments.move_to_end(segment)
            ids.extend(cached)
            start = cut
        # The tail is not cached: it is where prompts differ, and a longer prompt cuts it elsewhere.
        ids.extend(self.encode(text[start:]))
        return ids

    @property
    def cached_segments(self) -> int:  # not __len__: an empty cache must not make the tokenizer falsy
        return len(self._segments)


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer a spec names, wrapped in a ``SegmentCachingTokenizer``."""
    return SegmentCachingTokenizer(_load_encode(spec))


def _load_encode(spec: str) -> Callable[[str], Sequence[int]]:
    if spec == "sim" or spec.startswith("sim:"):
        from tokenyard.core.tokenizer import Tokenizer as SimTokenizer

        _, _, vocab = spec.partition(":")
        try:
            return SimTokenizer(int(vocab) if vocab else LLAMA3_VOCAB).encode
        except ValueError as error:
            raise TokenizerUnavailable(f"tokenizer {spec!r}: {error}") from None
    if not spec.endswith(".json"):
        raise TokenizerUnavailable(
            f"tokenizer {spec!r}: only 'sim', 'sim:VOCAB' or a local tokenizer.json can be loaded "
            "(the router downloads nothing)"
        )
    try:
        from tokenizers import Tokenizer as HfTokenizer  # optional dependency
    except ImportError:
        raise TokenizerUnavailable(f"tokenizer {spec}: the 'tokenizers' package is not installed") from None
    try:
        hf = HfTokenizer.from_file(spec)
    except Exception as error:
        raise TokenizerUnavailable(f"tokenizer {spec}: {error}") from None
    return lambda text: hf.encode(text, add_special_tokens=False).ids


class TokenizerCache:
    """Loads each spec once; a spec that cannot be loaded is remembered as unavailable (logged once), and its
    model is hashed with the router's default (its --tokenizer, or character blocks)."""

    def __init__(self, loader=load_tokenizer) -> None:
        self._loader = loader
        self._loaded: dict[str, Tokenizer | None] = {}

    def get(self, spec: str | None, model: str = "") -> Tokenizer | None:
        if not spec:
            return None
        if spec not in self._loaded:
            try:
                self._loaded[spec] = self._loader(spec)
            except TokenizerUnavailable as error:
                log.warning("model %s: %s; its prompts are hashed as without it", model, error)
                self._loaded[spec] = None
        return self._loaded[spec]
