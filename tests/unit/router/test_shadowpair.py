import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.router.openai_wire import OutputText, is_greedy
from tokenyard.router.shadowpair import PRIMARY, SHADOW, ShadowPair, pair_outcome


def sse(events) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("primary_ok", "shadow_ok", "outcome"),
    [
        (True, True, "both_ok"),
        (True, False, "shadow_only_error"),
        (False, True, "primary_only_error"),
        (False, False, "both_error"),
    ],
)
def test_the_pair_is_recorded_by_whichever_side_ends_last(primary_ok, shadow_ok, outcome):
    for first, second in ((PRIMARY, SHADOW), (SHADOW, PRIMARY)):
        pair = ShadowPair(greedy=False)
        oks = {PRIMARY: primary_ok, SHADOW: shadow_ok}
        assert pair.end(first, oks[first], "x") is None
        result = pair.end(second, oks[second], "x")
        assert result is not None and result.outcome == outcome
        assert result.outputs_match is None  # sampled: never compared
        assert pair.end(second, oks[second]) is None  # counted once


@pytest.mark.parametrize("shadow_ok", [True, False])
def test_a_primary_whose_client_went_away_makes_no_pair(shadow_ok):
    for first, second in ((PRIMARY, SHADOW), (SHADOW, PRIMARY)):
        pair = ShadowPair(greedy=True)
        oks = {PRIMARY: None, SHADOW: shadow_ok}
        assert pair.end(first, oks[first], "x") is None
        assert pair.end(second, oks[second], "x") is None


def test_greedy_pairs_compare_full_outputs_only_when_both_succeeded():
    same = ShadowPair(greedy=True)
    same.end(PRIMARY, True, "the answer")
    assert same.end(SHADOW, True, "the answer").outputs_match is True
    different = ShadowPair(greedy=True)
    different.end(SHADOW, True, "the answer")
    assert different.end(PRIMARY, True, "the answer!").outputs_match is False
    failed = ShadowPair(greedy=True)
    failed.end(SHADOW, False, "")
    assert failed.end(PRIMARY, True, "the answer").outputs_match is None
    with pytest.raises(ValueError, match="side"):
        ShadowPair(greedy=True).end("tertiary", True)


def test_only_an_explicit_temperature_zero_is_greedy():
    assert is_greedy({"temperature": 0}) and is_greedy({"temperature": 0.0})
    assert not is_greedy({}) and not is_greedy({"temperature": 0.7}) and not is_greedy({"temperature": False})
    assert pair_outcome(True, True) == "both_ok"


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=12), st.data())
def test_streamed_text_is_the_same_however_the_stream_is_split(pieces, data):
    events = [{"choices": [{"index": 0, "text": piece}]} for piece in pieces]
    events.append({"choices": [], "usage": {"completion_tokens": len(pieces)}})
    stream = sse(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    text = OutputText()
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        text.feed_stream(stream[start:end])
    assert text.text() == "".join(pieces)


def test_chat_deltas_and_whole_bodies_give_the_output_text():
    chat = OutputText()
    chat.feed_stream(
        sse(
            [
                {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                {"choices": [{"index": 0, "delta": {"content": "Hello"}}]},
                {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}]},
            ]
        )
    )
    assert chat.text() == "Hello there"
    body = OutputText()
    body.feed_body(json.dumps({"choices": [{"index": 0, "message": {"content": "whole"}}]}).encode())
    assert body.text() == "whole"
    garbage = OutputText()
    garbage.feed_body(b"not json")
    garbage.feed_stream(b"data: {broken\n\n")
    assert garbage.text() == ""
