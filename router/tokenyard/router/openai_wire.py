"""The OpenAI wire format, read once: a client's request parsed into an ``InferenceRequest``, and an engine's
answer decoded by one ``StreamDecoder`` (server-sent events split at arbitrary points) or ``decode_body`` (a
whole JSON answer).

Both fronts build an ``InferenceRequest`` (the gRPC front from a ``GenerateRequest`` it renders as the OpenAI
body it forwards); the exchange, the shadow comparison and the gRPC front read the engine's answer through the
same ``ResponseEvent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
DONE = b"[DONE]"
# Headers that belong to one connection, not to the request: never forwarded upstream.
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}


class InvalidRequest(ValueError):
    """The client's request cannot be served as given (HTTP 400); the message says what is wrong."""


@dataclass(frozen=True)
class InferenceRequest:
    """One client request as the router sees it, parsed once at the front.

    ``body`` is forwarded upstream byte for byte; ``prompt`` is the text the prefix index hashes (chat
    ``messages`` rendered by ``render_chat``, so that a growing conversation keeps its earlier turns as a
    prefix)."""

    model: str
    path: str  # the engine's path: COMPLETIONS_PATH or CHAT_COMPLETIONS_PATH
    body: bytes
    prompt: str
    expected_output_tokens: int
    # The client's own cap on the answer (max_completion_tokens or max_tokens); None when it named none. An answer
    # that reaches it was cut short: its length is a lower bound (learned_sizes.OutputLength).
    output_cap: int | None = None
    stream: bool = False
    # The answers the client asked for: ``n`` per prompt (a completion may carry a batch of prompts), each a
    # sequence of its own on the engine (vLLM fans a request out into n requests to its scheduler, SGLang runs n
    # after one prefill): one slot of the batch and one answer's decode each.
    samples: int = 1
    prompts: int = 1  # a completion's batch of prompts, hashed as one text (prompt_of)
    messages: tuple[Mapping[str, Any], ...] | None = None  # chat requests only
    greedy: bool = False  # temperature 0: a shadow copy's output is compared with the primary's
    # Seconds the client still waits when the request arrives (a gRPC deadline); None: no deadline. The
    # upstream request is bounded by it, so an engine never generates for a client that gave up.
    deadline_s: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # forwarded upstream
    # The client's own bytes, when the router changed them to ask the engine for the stream's usage the client
    # did not ask for (ask_stream_usage); None: ``body`` is the client's.
    client_body: bytes | None = None

    @property
    def hides_usage(self) -> bool:
        """The router asked for the stream's usage: the relay drops its event before the client sees it
        (UsageEventFilter)."""
        return self.client_body is not None

    def as_client_sent(self) -> InferenceRequest:
        """This request with the client's own body (for an engine that refuses the asked-for usage)."""
        return self if self.client_body is None else replace(self, body=self.client_body, client_body=None)


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    """A stable text rendering of chat messages, so a conversation that grows turn by turn keeps its earlier
    turns as an exact prefix (what the engine's chat template does too)."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
        parts.append(f"<|{message.get('role', '')}|>\n{content or ''}\n")
    return "".join(parts)


def prompt_of(body: Mapping[str, Any]) -> str:
    """The prompt text of an OpenAI completions or chat completions body (raises ValueError if absent)."""
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise InvalidRequest("'messages' must be a list of objects")
        return render_chat(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        return " ".join(map(str, prompt))  # token ids: hash them as text, chained like any other prompt
    if isinstance(prompt, list) and prompt and all(_token_ids(p) for p in prompt):
        return "\n".join(" ".join(map(str, p)) for p in prompt)  # a batch of token-id prompts
    raise InvalidRequest(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids"
    )


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def prompts_in(body: Mapping[str, Any]) -> int:
    """How many prompts the request carries: a completion's ``prompt`` may be a batch (a list of strings or of
    token-id lists), which the engines answer prompt by prompt (vLLM's serving_completion.py makes each a request
    of its own); anything else is one."""
    prompt = body.get("prompt")
    if "messages" in body or not isinstance(prompt, list) or not prompt:
        return 1
    if all(isinstance(p, str) for p in prompt) or all(_token_ids(p) for p in prompt):
        return len(prompt)
    return 1


def max_tokens_of(body: Mapping[str, Any]) -> int | None:
    """The client's own cap on the answer (chat's max_completion_tokens first, then max_tokens); None when it
    named no positive one."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def samples_of(body: Mapping[str, Any]) -> int:
    """``n``, the answers asked for; 1 when it is absent or not a positive integer (the engine then answers its
    own error, which the router passes on as it came)."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def is_greedy(body: Mapping[str, Any]) -> bool:
    """Temperature 0 given explicitly (OpenAI's default is 1, so an absent temperature samples)."""
    temperature = body.get("temperature")
    return isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}


def request_from_body(
    path: str,
    body: Mapping[str, Any],
    raw: bytes,
    default_max_tokens: int,
    headers: Mapping[str, str] | None = None,
    deadline_s: float | None = None,
) -> InferenceRequest:
    """The ``InferenceRequest`` of an OpenAI body (``raw`` is its encoding, forwarded as is); raises
    InvalidRequest."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string")
    prompt = prompt_of(body)
    messages = body.get("messages")
    cap = max_tokens_of(body)
    prompts = prompts_in(body)
    return InferenceRequest(
        model=model,
        path=path,
        body=raw,
        prompt=prompt,
        expected_output_tokens=cap or default_max_tokens,
        output_cap=cap,
        stream=body.get("stream") is True,
        samples=prompts * samples_of(body),
        prompts=prompts,
        messages=tuple(messages) if isinstance(messages, list) else None,
        greedy=is_greedy(body),
        deadline_s=deadline_s,
        headers=dict(headers or {}),
    )


def parse_request(
    path: str,
    raw: bytes,
    default_max_tokens: int,
    headers: Mapping[str, str] | None = None,
    ask_usage: bool = False,
) -> InferenceRequest:
    """The ``InferenceRequest`` of an OpenAI request body as the HTTP front received it; raises
    InvalidRequest. ``ask_usage``: a stream whose client did not ask for its usage asks for it anyway
    (``ask_stream_usage``)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InvalidRequest(f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    request = request_from_body(path, body, raw, default_max_tokens, headers)
    if ask_usage and request.stream:
        request = ask_stream_usage(request, body)
    return request


# --- a stream's usage, asked for on the client's behalf -----------------------------------------------------
#
# The router learns how many bytes of text make one of the engine's tokens, and how many tokens the engine
# found cached, from ``usage`` (learned_sizes, RouterState.learn_cached_tokens). A whole answer always carries
# it; a stream only when the request says ``"stream_options": {"include_usage": true}``. The OpenAI SDKs'
# users and several load generators do not, and a router that learns nothing from them guesses 4 bytes a token
# for ever (on bench-router's long_documents that guess lost two thirds of the closed-loop tokens/s). So the
# router asks for it and removes the one event it adds before the client sees the stream. That event is the
# one OpenAI's API reference documents for ``stream_options.include_usage`` ("an additional chunk will be
# streamed before the data: [DONE] message ... the choices field will always be an empty array"), and the one
# vLLM v0.13.0 (entrypoints/openai/serving_chat.py and serving_completion.py, ``if include_usage``: a last
# chunk with ``choices=[]`` and ``usage``) and SGLang v0.5's OpenAI adapter send. ``--no-stream-usage`` turns
# this off for an engine that refuses the member.

_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'
# What a usage report carries and no other event does, found without decoding JSON. Not ``"usage"``: OpenAI's
# reference says that with include_usage "all other chunks will also include a usage field, but with a null
# value", so every token's chunk has that key, and a search for it would decode every chunk.
USAGE_MARK = b'"prompt_tokens"'


def ask_stream_usage(request: InferenceRequest, body: Mapping[str, Any]) -> InferenceRequest:
    """``request`` (a stream, ``body`` its decoded JSON) with its usage asked of the engine when the client did
    not ask for it, marked ``hides_usage``; unchanged when the client asked, or asked something of the usage
    this would change (``continuous_usage_stats``, vLLM's usage on every chunk, needs ``include_usage``)."""
    options = body.get("stream_options")
    if "stream_options" in body and not isinstance(options, Mapping | None):
        return request  # malformed: the engine says what is wrong with it
    if isinstance(options, Mapping) and (
        options.get("include_usage") or options.get("continuous_usage_stats")
    ):
        return request
    start = request.body.find(b"{")
    if "stream_options" not in body and start >= 0 and b"\x00" not in request.body[:4]:
        # The client's bytes stay as they were: one member spliced in after the opening brace (the body has a
        # 'model' member, so a comma always follows). Not for UTF-16/32 bodies, which JSON also allows.
        raw = request.body[: start + 1] + _INCLUDE_USAGE + request.body[start + 1 :]
    else:
        raw = json.dumps({**body, "stream_options": {**(options or {}), "include_usage": True}}).encode()
    return replace(request, body=raw, client_body=request.body)


# What an engine answers when it does not know the member: vLLM before v0.5.0 (pydantic, extra="forbid") said
# 400 with "'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not permitted'", and a FastAPI server of
# that kind 422; an error that names the member is taken to be about it.
USAGE_REFUSAL_STATUSES = (400, 422)


def refuses_stream_usage(status: int, error_body: bytes) -> bool:
    """Whether an engine's error answer refuses the ``stream_options`` member the router added."""
    return status in USAGE_REFUSAL_STATUSES and b"stream_options" in error_body


class UsageEventFilter:
    """Removes the usage event the router asked for (``ask_stream_usage``) from the stream it relays, leaving
    every other byte as the engine sent it. Lines are passed on whole: a line cut by the network waits for its
    end (engines write one event per write, so this holds nothing back in practice)."""

    def __init__(self) -> None:
        self._pending = b""
        self._dropping = False  # a usage event was dropped; the blank line that ends it goes too

    def feed(self, chunk: bytes) -> bytes:
        """What to relay of ``chunk`` (b'' when it only began a line)."""
        if self._pending:
            chunk = self._pending + chunk
        end = chunk.rfind(b"\n")
        if end < 0:
            self._pending = chunk
            return b""
        self._pending = chunk[end + 1 :]
        if USAGE_MARK not in chunk and not self._dropping:
            return chunk[: end + 1]
        kept: list[bytes] = []
        for line in chunk[:end].split(b"\n"):  # whole lines, without their ends
            if self._dropping:
                self._dropping = False
                if not line.strip():
                    continue
            if line[:5] == b"data:" and USAGE_MARK in line and _is_usage_only(line[5:].strip()):
                self._dropping = True
                continue
            kept.append(line)
        return b"".join(line + b"\n" for line in kept)

    def flush(self) -> bytes:
        """What is left when the stream ends (an unterminated last line, relayed as it came)."""
        rest, self._pending = self._pending, b""
        return rest


def _is_usage_only(data: bytes) -> bool:
    """Whether an event is a usage report and nothing else: no choice in it (the last chunk of a stream asked
    for its usage)."""
    try:
        payload = json.loads(data)
    except ValueError:
        return False
    return isinstance(payload, Mapping) and bool(payload.get("usage")) and not payload.get("choices")


# --- the engine's answer ----------------------------------------------------------------------------------


class StreamDecodeError(ValueError):
    """An event of the engine's answer is not a JSON object."""


_TEXT_KEYS = (b'"text":', b'"content":')


def carries_token(data: bytes) -> bool:
    """Whether an event (or a chunk) of an OpenAI stream carries generated text (a non-empty "text" or
    "content" string), read from its bytes without decoding the JSON: the relay asks this of every event, and
    decoding each one would cost the router CPU its engines then lack.

    The first such event ends the prefill: a chat stream may open with an empty role-only delta before it
    (tokenyard.sim sends it at once; vLLM with the first token), and that is not a token."""
    for key in _TEXT_KEYS:
        start = data.find(key)
        while start >= 0:
            rest = data[start + len(key) : start + len(key) + 3].lstrip(b" ")
            if rest[:1] == b'"' and rest[1:2] not in (b'"', b""):
                return True
            start = data.find(key, start + 1)
    return False


class ResponseEvent:
    """One ``data:`` event of an OpenAI stream, or a whole non-streamed answer. The JSON is decoded on first
    use only (see ``carries_token``)."""

    __slots__ = ("data", "_payload")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._payload: Mapping[str, Any] | None = None

    @property
    def done(self) -> bool:
        """The stream's closing ``data: [DONE]``."""
        return self.data == DONE

    @property
    def carries_token(self) -> bool:
        return carries_token(self.data)

    @property
    def payload(self) -> Mapping[str, Any]:
        """The decoded event; raises StreamDecodeError when it is not a JSON object."""
        if self._payload is None:
            try:
                payload = json.loads(self.data)
            except ValueError as error:
                raise StreamDecodeError(f"event is not JSON: {error}") from None
            if not isinstance(payload, Mapping):
                raise StreamDecodeError(f"event is a JSON {type(payload).__name__}, not an object")
            self._payload = payload
        return self._payload

    def choice_texts(self) -> list[tuple[int, str]]:
        """(choice index, generated text) of each choice that carries text: completions' ``text``, chat's
        ``delta.content`` (streamed) or ``message.content`` (whole)."""
        texts = []
        for position, choice in enumerate(self.payload.get("choices") or ()):
            if not isinstance(choice, Mapping):
                continue
            message = choice.get("delta") or choice.get("message") or {}
            text = choice.get("text")
            if not isinstance(text, str):
                text = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(text, str) and text:
                index = choice.get("index", position)
                texts.append((index if isinstance(index, int) else position, text))
        return texts

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.choice_texts())

    @property
    def finish_reason(self) -> str:
        """The last choice's finish reason, '' while the choices are unfinished."""
        reason = ""
        for choice in self.payload.get("choices") or ():
            if isinstance(choice, Mapping) and isinstance(choice.get("finish_reason"), str):
                reason = choice["finish_reason"] or reason
        return reason

    @property
    def usage(self) -> Mapping[str, Any] | None:
        usage = self.payload.get("usage")
        return usage if isinstance(usage, Mapping) and usage else None


class StreamDecoder:
    """Splits an OpenAI stream (server-sent events, cut at arbitrary points by the network) into its events.
    OpenAI-compatible engines send each event as one ``data:`` line; comments and other fields are skipped."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[ResponseEvent]:
        """The events ``chunk`` completes. Runs for every read the router relays, hence the plain loop."""
        if self._pending:
            chunk = self._pending + chunk
        end = chunk.rfind(b"\n")
        if end < 0:
            self._pending = chunk
            return []
        self._pending = chunk[end + 1 :]  # an unfinished line waits for the next chunk
        return [ResponseEvent(line[5:].strip()) for line in chunk[:end].split(b"\n") if line[:5] == b"data:"]


def decode_body(body: bytes) -> ResponseEvent:
    """A non-streamed answer, read like one event that holds the whole output."""
    return ResponseEvent(body)


class OutputText:
    """The generated text of an answer, fed event by event (``add``), as a raw stream (``feed_stream``) or
    whole (``feed_body``). Choices are kept apart by index and joined in index order; events that do not
    decode are skipped (what is compared is what was generated)."""

    def __init__(self) -> None:
        self._parts: dict[int, list[str]] = {}
        self._decoder: StreamDecoder | None = None

    def feed_stream(self, chunk: bytes) -> None:
        if self._decoder is None:
            self._decoder = StreamDecoder()
        for event in self._decoder.feed(chunk):
            self.add(event)

    def feed_body(self, body: bytes) -> None:
        self.add(decode_body(body))

    def add(self, event: ResponseEvent) -> None:
        if event.done:
            return
        try:
            texts = event.choice_texts()
        except StreamDecodeError:
            return
        for index, text in texts:
            self._parts.setdefault(index, []).append(text)

    def text(self) -> str:
        return "\x1e".join("".join(self._parts[index]) for index in sorted(self._parts))
