"""The deterministic tokenizer."""

from hypothesis import given
from hypothesis import strategies as st
from tokenyard.core.tokenizer import WORDS, Tokenizer

tok = Tokenizer(128_256)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300))
def test_pieces_concatenate_back_to_the_text(text):
    assert "".join(Tokenizer.pieces(text)) == text


def test_round_trip_and_stable_ids():
    text = "The quick brown fox, internationalization!\n\tdone  "
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert Tokenizer(128_256).encode(text) == ids  # no per-process salt
    assert all(0 <= i < 128_256 for i in ids)


def test_equal_prefixes_give_equal_ids_and_counts_are_word_like():
    a = tok.encode("You are a helpful assistant. Tell me about cats")
    b = tok.encode("You are a helpful assistant. Tell me about dogs")
    assert a[:-1] == b[:-1] and a[-1] != b[-1]
    assert len(tok.encode(" ".join(["word"] * 100))) == 100


def test_generated_tokens_always_detokenise_to_words():
    text = tok.decode([tok.generated_token(seed=42, index=i) for i in range(50)])
    assert all(w in WORDS for w in text.split())


def test_ids_never_seen_detokenise_to_a_placeholder():
    fresh = Tokenizer(1_000_003)  # a vocabulary size nothing else in this process uses
    unseen = next(i for i in range(100) if i not in fresh.generation_ids)
    assert fresh.decode([unseen]) == f"<|{unseen}|>"
