"""A deterministic tokenizer that needs no vocabulary file: the simulated engines' (tokenyard.sim) and the
router's default for prefix hashing (``--tokenizer sim``), which must cut prompts exactly as those engines do.

Why this and not a real BPE: the simulator must not download tokenizer files, and what the control plane cares
about is that token counts are of the right order (English prose runs at about 1.3 tokens per word with BPE
tokenizers; this one gives 1 per word plus 1 per punctuation mark) and that equal prefixes give equal token ids
(prefix caching and prefix-aware routing depend on that).

- Text is cut into pieces, each piece carrying the whitespace before it: a run of letters/digits (cut every
  `MAX_PIECE_CHARS` characters, as BPE splits long words) or one other character. Concatenating the pieces gives
  the text back exactly.
- A piece's token id is a stable hash (BLAKE2b, not Python's salted `hash`) of its text modulo the model's
  vocabulary size, so the same text gets the same ids in every process.
- Detokenising needs the piece for an id: a process-wide table remembers the pieces it has seen (bounded; the
  oldest entries go first). Ids never seen in this process detokenise to `<|id|>`. Two pieces can share an id (hash
  collision); the table keeps the first, so detokenize(tokenize(text)) == text except for a colliding piece.
- Generated text is drawn from `WORDS` so that it always detokenises.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict

MAX_PIECE_CHARS = 8
_PIECE = re.compile(rf"\s*(?:[^\W_]{{1,{MAX_PIECE_CHARS}}}|[^\s])|\s+")
_TABLE_LIMIT = 1_000_000

# Words generated text is made of (common English words, so streamed text reads as text).
WORDS = tuple(
    (
        "the of and to in is that it for was on are as with be at by this have from or one had not but what all "
        "were when we there can an your which their said if do will each about how up out them then she many some "
        "so these would other into has more her two like him see time could no make than first been its who now "
        "people my made over did down only way find use may water long little very after words called just where "
        "most know get through back much before go good new write our used me man too any day same right look "
        "think also around another came come work three word must because does part even place well such here take "
        "why things help put years different away again off went old number great tell men say small every found "
        "still between name should home big give air line set own under read last never us left end along while "
        "might next sound below saw something thought both few those always looked show large often together asked "
        "house world going want school important until form food keep children feet land side without boy once "
        "animals life enough took sometimes four head above kind began almost live page got earth need far hand "
        "high year mother light parts country father let night following picture being study second eyes soon "
        "times story boys since white days ever paper hard near sentence better best across during today others "
        "however sure means knew try told young miles sun ways thing whole hear example heard several change "
        "answer room sea against top turned learn point city play toward five using himself usually"
    ).split()
)


class _PieceTable:
    """id -> piece for detokenising, bounded, oldest first out."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pieces: OrderedDict[tuple[int, int], str] = OrderedDict()

    def remember(self, vocab_size: int, token_id: int, piece: str) -> None:
        key = (vocab_size, token_id)
        if key in self._pieces:
            return
        self._pieces[key] = piece
        if len(self._pieces) > self._limit:
            self._pieces.popitem(last=False)

    def lookup(self, vocab_size: int, token_id: int) -> str | None:
        return self._pieces.get((vocab_size, token_id))


_TABLE = _PieceTable(_TABLE_LIMIT)


def _piece_id(piece: str, vocab_size: int) -> int:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


class Tokenizer:
    """Tokenizer for one vocabulary size (the model's)."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < len(WORDS):
            raise ValueError(f"vocab_size must be at least {len(WORDS)}, got {vocab_size}")
        self.vocab_size = vocab_size
        self._id_cache: dict[str, int] = {}
        # Generated tokens: " word" pieces (a leading space, as they follow other text).
        self.generation_ids = tuple(self._id_of(" " + w) for w in WORDS)
        # Kept outside the bounded table so that generated text always detokenises.
        self._generated_pieces = {self._id_of(" " + w): " " + w for w in reversed(WORDS)}

    def _id_of(self, piece: str) -> int:
        token_id = self._id_cache.get(piece)
        if token_id is None:
            token_id = _piece_id(piece, self.vocab_size)
            if len(self._id_cache) < 200_000:
                self._id_cache[piece] = token_id
            _TABLE.remember(self.vocab_size, token_id, piece)
        return token_id

    @staticmethod
    def pieces(text: str) -> list[str]:
        return _PIECE.findall(text)

    def encode(self, text: str) -> list[int]:
        return [self._id_of(p) for p in _PIECE.findall(text)]

    def token_str(self, token_id: int) -> str:
        piece = self._generated_pieces.get(token_id) or _TABLE.lookup(self.vocab_size, token_id)
        return piece if piece is not None else f"<|{token_id}|>"

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.token_str(t) for t in token_ids)

    def generated_token(self, seed: int, index: int) -> int:
        """The `index`-th generated token of a sequence whose prompt hashes to `seed` (deterministic)."""
        return self.generation_ids[(seed * 2654435761 + index * 40503) % len(self.generation_ids)]
