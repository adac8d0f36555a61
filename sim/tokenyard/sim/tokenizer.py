"""The simulated engines' tokenizer: the one in `tokenyard.core.tokenizer`, which the router shares for prefix
hashing (so both cut prompts the same way). Re-exported here for the simulator's own imports."""

from tokenyard.core.tokenizer import MAX_PIECE_CHARS, WORDS, Tokenizer

__all__ = ["MAX_PIECE_CHARS", "WORDS", "Tokenizer"]
