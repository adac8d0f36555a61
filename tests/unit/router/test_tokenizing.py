from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.core.tokenizer import Tokenizer as SimTokenizer
from tokenyard.router.tokenizing import SegmentCachingTokenizer, load_tokenizer, segment_cuts

WORDS = ["alpha", "beta", "gamma", "invoice", "supercalifragilistic", "x", "42", ",", ".", "?"]
SPACES = [" ", "  ", "\n", "\t", " \n "]


def texts(min_size: int = 0):
    """Prose-like text: words and punctuation joined by assorted whitespace (what prompts are made of)."""
    return st.lists(
        st.tuples(st.sampled_from(WORDS), st.sampled_from(SPACES)), min_size=min_size, max_size=60
    ).map(lambda parts: "".join(word + space for word, space in parts))


@settings(max_examples=200, deadline=None)
@given(texts(), st.integers(1, 40))
def test_cuts_fall_on_word_ends_at_least_a_segment_apart(text, segment_chars):
    previous = 0
    for cut in segment_cuts(text, segment_chars):
        assert cut - previous >= segment_chars
        assert not text[cut - 1].isspace() and text[cut].isspace()
        previous = cut


@settings(max_examples=200, deadline=None)
@given(texts(), texts(), texts(), st.integers(1, 40))
def test_prompts_sharing_a_prefix_are_cut_alike_inside_it(prefix, a, b, segment_chars):
    inside = [cut for cut in segment_cuts(prefix + a, segment_chars) if cut < len(prefix)]
    assert inside == [cut for cut in segment_cuts(prefix + b, segment_chars) if cut < len(prefix)]


@settings(max_examples=200, deadline=None)
@given(st.lists(texts(), min_size=1, max_size=4), st.integers(1, 40))
def test_segmented_ids_equal_the_sim_tokenizer_on_the_whole_text(prompts, segment_chars):
    sim = SimTokenizer(200_000)
    segmented = SegmentCachingTokenizer(sim.encode, segment_chars=segment_chars)
    for text in prompts + prompts:  # the second pass is served from the cache
        assert segmented(text) == sim.encode(text)


def test_a_repeated_prefix_is_tokenized_once_and_only_the_tail_again():
    encoded: list[str] = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return [len(piece) for piece in text.split(" ")]

    tokenizer = SegmentCachingTokenizer(encode, segment_chars=20)
    system = "word " * 40
    tokenizer(system + "first question")
    first = len(encoded)
    tokenizer(system + "second question")
    again = encoded[first:]
    # Only what follows the last cut inside the shared part is tokenized again: at most one segment (20
    # characters and the rest of a word) and the new text.
    assert sum(map(len, again)) <= len("second question") + 20 + len(" word")
    assert "".join(again).endswith("second question")


def test_the_segment_cache_is_bounded_and_forgets_the_least_recently_used():
    tokenizer = SegmentCachingTokenizer(lambda text: [len(text)], segment_chars=4, max_entries=3)
    tokenizer("aaaa bbbb cccc dddd tail")  # four cacheable segments, one over the bound
    assert tokenizer.cached_segments == 3


def test_a_loaded_tokenizer_is_truthy_before_its_first_use():
    # RouterState picks a model's tokenizer with `cache.get(...) or default`: an empty cache must not read as None.
    assert load_tokenizer("sim")
