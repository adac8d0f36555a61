import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.router.grpc_front import inference_request
from tokenyard.router.openai_wire import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    InvalidRequest,
    StreamDecodeError,
    StreamDecoder,
    UsageEventFilter,
    carries_token,
    decode_body,
    parse_request,
    refuses_stream_usage,
    render_chat,
)
from tokenyard.v1 import router_pb2


def sse(events) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_a_request_is_parsed_once_into_its_typed_form():
    raw = json.dumps(
        {"model": "m", "prompt": "hi", "max_tokens": 7, "stream": True, "temperature": 0}
    ).encode()
    request = parse_request(COMPLETIONS_PATH, raw, 256, {"X-Request-Id": "r1"})
    assert (request.model, request.prompt, request.expected_output_tokens) == ("m", "hi", 7)
    assert request.stream and request.greedy and request.messages is None and request.deadline_s is None
    assert request.body == raw and request.headers == {"X-Request-Id": "r1"}

    messages = [{"role": "user", "content": "hello"}]
    chat = parse_request(
        CHAT_COMPLETIONS_PATH, json.dumps({"model": "m", "messages": messages}).encode(), 256
    )
    assert chat.prompt == render_chat(messages) and chat.messages == tuple(messages)
    assert chat.expected_output_tokens == 256 and not chat.stream and not chat.greedy


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"prompt": "x"}', "'model' is required"),
        (b'{"model": "m"}', "'prompt' must be"),
        (b'{"model": "m", "messages": "hi"}', "'messages' must be a list"),
    ],
)
def test_a_bad_request_says_what_is_wrong(raw, message):
    with pytest.raises(InvalidRequest, match=message):
        parse_request(COMPLETIONS_PATH, raw, 256)


def test_a_grpc_generate_request_becomes_the_same_typed_request():
    generate = router_pb2.GenerateRequest(
        model="m",
        chat=router_pb2.ChatMessages(messages=[router_pb2.ChatMessage(role="user", content="hi")]),
        sampling=router_pb2.SamplingParams(max_tokens=5, temperature=0),
    )
    request = inference_request(generate, 256, "req-1", deadline_s=2.5)
    assert request.path == CHAT_COMPLETIONS_PATH and request.prompt == render_chat(
        [{"role": "user", "content": "hi"}]
    )
    assert (
        request.stream
        and request.greedy
        and request.expected_output_tokens == 5
        and request.deadline_s == 2.5
    )
    assert request.headers["X-Request-Id"] == "req-1"
    assert json.loads(request.body)["stream_options"] == {"include_usage": True}


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=12), st.data())
def test_the_decoder_finds_the_same_events_however_the_stream_is_split(pieces, data):
    events = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in pieces]
    events.append(
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 3}}
    )
    stream = sse(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = StreamDecoder()
    decoded = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    assert decoded[-1].done and not any(event.done for event in decoded[:-1])
    assert "".join(event.text for event in decoded[:-1]) == "".join(pieces)
    assert [event.carries_token for event in decoded[:-1]] == [True] * len(pieces) + [False]
    assert decoded[-2].finish_reason == "length" and decoded[-2].usage == {"completion_tokens": 3}


def test_an_event_that_is_no_json_object_fails_to_decode_and_a_whole_body_reads_like_one_event():
    (event,) = StreamDecoder().feed(b"data: {broken\n\n")
    with pytest.raises(StreamDecodeError):
        _ = event.text
    body = decode_body(
        json.dumps({"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}]}).encode()
    )
    assert body.text == "whole" and body.finish_reason == "stop" and body.usage is None


def test_first_token_detection_skips_empty_role_chunks():
    assert not carries_token(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    assert carries_token(b'data: {"choices":[{"delta":{"content":" hi"}}]}\n\n')
    assert carries_token(b'data: {"choices": [{"text": "x", "index": 0}]}\n\n')
    assert not carries_token(b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n\n')


# --- a stream's usage, asked for on the client's behalf ----------------------------------------------------


def stream_request(body: dict, raw: bytes | None = None):
    return parse_request(COMPLETIONS_PATH, raw or json.dumps(body).encode(), 256, ask_usage=True)


def test_a_stream_whose_client_did_not_ask_for_usage_asks_for_it_and_keeps_the_clients_bytes():
    raw = b'  {"model": "m", "prompt": "caf\xc3\xa9", "stream": true}'
    request = stream_request({}, raw)
    assert request.hides_usage
    assert json.loads(request.body) == {
        "model": "m",
        "prompt": "caf\u00e9",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert request.body.replace(b'"stream_options":{"include_usage":true},', b"") == raw
    # for an engine that refuses the member, the client's own bytes
    as_sent = request.as_client_sent()
    assert as_sent.body == raw and not as_sent.hides_usage and as_sent.as_client_sent() is as_sent

    # other stream options are kept; a null member is replaced
    kept = stream_request({"model": "m", "prompt": "x", "stream": True, "stream_options": {"other": 1}})
    assert json.loads(kept.body)["stream_options"] == {"other": 1, "include_usage": True} and kept.hides_usage
    null = stream_request({"model": "m", "prompt": "x", "stream": True, "stream_options": None})
    assert json.loads(null.body)["stream_options"] == {"include_usage": True} and null.hides_usage


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
        # vLLM's usage on every chunk needs include_usage: adding it would show the client what it did not ask
        {"model": "m", "prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}},
        {
            "model": "m",
            "prompt": "x",
            "stream": True,
            "stream_options": "yes",
        },  # the engine refuses it itself
        {"model": "m", "prompt": "x"},  # a whole answer always carries its usage
    ],
)
def test_a_request_that_asked_for_usage_or_streams_nothing_is_forwarded_as_it_came(body):
    raw = json.dumps(body).encode()
    request = stream_request(body, raw)
    assert request.body == raw and not request.hides_usage
    assert parse_request(COMPLETIONS_PATH, raw, 256).body == raw  # and nothing is asked unless the front asks


USAGE_EVENT = {"id": "c1", "object": "text_completion", "choices": [], "usage": {"prompt_tokens": 9}}


@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=8), st.data())
def test_the_usage_event_is_dropped_and_every_other_byte_kept_however_the_stream_is_split(pieces, data):
    events = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in pieces]
    # usage that rides on a chunk with choices is not the router's to drop
    events.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": None})
    without = sse(events)
    with_usage = without.replace(
        b"data: [DONE]", b"data: " + json.dumps(USAGE_EVENT).encode() + b"\n\ndata: [DONE]"
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(with_usage)), max_size=6)))
    relay = UsageEventFilter()
    relayed = b"".join(
        relay.feed(with_usage[start:end])
        for start, end in zip([0, *cuts], [*cuts, len(with_usage)], strict=True)
    )
    assert relayed + relay.flush() == without


def test_an_unterminated_last_line_is_relayed_at_the_end():
    relay = UsageEventFilter()
    assert relay.feed(b"data: [DO") == b""
    assert relay.flush() == b"data: [DO"


# The two shapes engines stream once include_usage is asked. OpenAI's API reference (stream_options): every chunk
# carries "usage": null and one more chunk, before [DONE], has "choices": [] and the usage. vLLM v0.13.0
# (serving_chat.py, model_dump_json(exclude_unset=True)) leaves the key out of the token chunks.
OPENAI_STYLE = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},'
    b'"finish_reason":null}],"usage":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}],"usage":null}\n\n'
)
VLLM_STYLE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}\n\n'
)
USAGE_CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":12,"total_tokens":14,"completion_tokens":2}}\n\n'
)


@pytest.mark.parametrize("tokens", [OPENAI_STYLE, VLLM_STYLE], ids=["openai-sglang", "vllm"])
def test_engine_streams_lose_only_the_usage_chunk_and_only_it_is_decoded(tokens, monkeypatch):
    import tokenyard.router.openai_wire as wire

    decoded: list[bytes] = []
    real = wire._is_usage_only
    monkeypatch.setattr(wire, "_is_usage_only", lambda data: decoded.append(data) or real(data))
    relay = UsageEventFilter()
    # one event per read, as engines write them
    out = b"".join(relay.feed(event + b"\n\n") for event in (tokens + USAGE_CHUNK).split(b"\n\n") if event)
    assert out + relay.flush() == tokens
    assert len(decoded) == 1  # the token chunks pass on a byte search, undecoded


def test_only_an_error_that_names_the_member_is_a_refusal_of_it():
    old_vllm = b"{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not permitted'}"
    assert refuses_stream_usage(400, old_vllm) and refuses_stream_usage(422, old_vllm)
    assert not refuses_stream_usage(400, b'{"message": "max_tokens must be at least 1, got -1."}')
    assert not refuses_stream_usage(500, old_vllm)  # a server error is the replica's, not the member's


def test_the_clients_own_cap_is_kept_apart_from_the_routers_guess():
    def parsed(**fields):
        body = {"model": "m", "prompt": "p", **fields}
        return parse_request("/v1/completions", json.dumps(body).encode(), default_max_tokens=256)

    assert (parsed(max_tokens=40).output_cap, parsed(max_tokens=40).expected_output_tokens) == (40, 40)
    assert parsed(max_completion_tokens=50, max_tokens=40).output_cap == 50
    assert (parsed().output_cap, parsed().expected_output_tokens) == (None, 256)
    assert parsed(max_tokens=0).output_cap is None  # no cap (vLLM refuses it: at least 1)


@pytest.mark.parametrize(
    ("n", "samples"), [(None, 1), (3, 3), (1, 1), (0, 1), (-2, 1), ("3", 1), (True, 1), (2.0, 1)]
)
def test_the_answers_asked_for_are_n_when_it_is_a_positive_integer(n, samples):
    body = {"model": "m", "prompt": "p", **({} if n is None else {"n": n})}
    request = parse_request(COMPLETIONS_PATH, json.dumps(body).encode(), default_max_tokens=16)
    assert request.samples == samples


@pytest.mark.parametrize(
    ("prompt", "n", "prompts", "samples"),
    [(["a", "b", "c"], None, 3, 3), ([[1, 2], [3]], 2, 2, 4), ([1, 2, 3], 2, 1, 2), ("one", 3, 1, 3)],
)
def test_a_batch_of_prompts_asks_n_answers_for_each(prompt, n, prompts, samples):
    body = {"model": "m", "prompt": prompt, **({} if n is None else {"n": n})}
    request = parse_request(COMPLETIONS_PATH, json.dumps(body).encode(), default_max_tokens=16)
    assert (request.prompts, request.samples) == (prompts, samples)


def test_a_batch_mixing_strings_and_token_ids_is_refused_with_what_a_prompt_may_be():
    body = {"model": "m", "prompt": ["a", [1]]}
    with pytest.raises(InvalidRequest, match="a list of lists of token ids"):
        parse_request(COMPLETIONS_PATH, json.dumps(body).encode(), default_max_tokens=16)
