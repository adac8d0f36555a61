"""Tokenizers for prefix hashing: from the router's --tokenizer flag or a ModelDeployment's spec.routing.tokenizer.

A spec is ``sim`` or ``sim:VOCAB`` (tokenyard.sim's tokenizer, which needs no files), or the path of a
``tokenizer.json`` (needs the optional ``tokenizers`` package). Anything else, such as a Hugging Face hub id,
would need a download, which the router never does: such a model is hashed by character blocks and the router
says so once in its log.
"""

from __future__ import annotations

import logging

from tokenyard.router.prefix import Tokenizer

log = logging.getLogger("tokenyard.router")

LLAMA3_VOCAB = 128_256


class TokenizerUnavailable(ValueError):
    """The tokenizer named by a spec cannot be loaded here; the message says why."""


def load_tokenizer(spec: str) -> Tokenizer:
    if spec == "sim" or spec.startswith("sim:"):
        from tokenyard.sim.tokenizer import Tokenizer as SimTokenizer

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
