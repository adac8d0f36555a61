"""Sending one request upstream: route, connect, retry once elsewhere, and keep the ledger honest.

``Forwarder.open`` returns an ``UpstreamCall`` holding the engine's response (headers read, body not yet) and
the route's ticket; the fronts stream the body through it and ``finish`` it in ``finally`` with how the
stream ended, which releases the accounting whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tokenyard.router.shadowpair import PRIMARY, SHADOW, OutputText, PairResult, ShadowPair
from tokenyard.router.state import Route, RouterState, RoutingError
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")

RETRYABLE_STATUS = 503
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}


class SseTokenCounter:
    """Counts server-sent events in a byte stream split at arbitrary points (one event ~ one token as vLLM
    streams), so that decode tokens are released as the stream advances."""

    def __init__(self) -> None:
        self._last = b""

    def feed(self, chunk: bytes) -> int:
        joined = self._last + chunk
        events = joined.count(b"\n\n")
        self._last = joined[-1:] if not joined.endswith(b"\n\n") else b""
        return events


_TEXT_KEYS = (b'"text":', b'"content":')


def carries_token(chunk: bytes) -> bool:
    """Whether a chunk of an OpenAI stream carries generated text (a non-empty "text" or "content" string).
    The first such chunk ends the prefill: a chat stream may open with an empty role-only delta before it
    (tokenyard.sim sends it at once; vLLM with the first token), and that is not a token."""
    for key in _TEXT_KEYS:
        start = chunk.find(key)
        while start >= 0:
            rest = chunk[start + len(key) : start + len(key) + 3].lstrip(b" ")
            if rest[:1] == b'"' and rest[1:2] not in (b'"', b""):
                return True
            start = chunk.find(key, start + 1)
    return False


@dataclass
class UpstreamCall:
    route: Route
    response: aiohttp.ClientResponse
    started: float  # monotonic time the client's request arrived
    attempts: int
    first_byte_at: float | None = None
    last_token_at: float | None = None
    outcome: str = "ok"
    # Set when the request was shadowed: the pair this side belongs to, and its output text when compared.
    pair: ShadowPair | None = None
    text: OutputText | None = None
    _counter: SseTokenCounter = field(default_factory=SseTokenCounter)
    _inter_token: Any = None  # the labelled inter-token histogram, looked up once per call


class Forwarder:
    def __init__(
        self,
        state: RouterState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        clock=time.monotonic,
        max_attempts: int = 2,
        shadow_concurrency: int = 64,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.session = session
        self.clock = clock
        self.max_attempts = max_attempts
        self._shadow_slots = asyncio.Semaphore(shadow_concurrency)
        self._shadow_tasks: set[asyncio.Task] = set()

    def _route(self, model: str, prompt: str, max_tokens: int, exclude: list[str], shadow: bool) -> Route:
        began = time.perf_counter()
        try:
            route = self.state.route(model, prompt, max_tokens, self.clock(), exclude=exclude, shadow=shadow)
        finally:
            self.metrics.decision.observe(time.perf_counter() - began)
        self.metrics.prefix_match.labels(model).observe(route.prefix_match_tokens)
        return route

    async def open(
        self,
        model: str,
        path: str,
        body: bytes,
        prompt: str,
        max_tokens: int,
        headers: dict[str, str] | None = None,
        started: float | None = None,
        shadow: bool = False,
    ) -> UpstreamCall:
        """Route and connect; retries a connect error or a 503 before the first byte once on another replica.
        Raises RoutingError when no replica can take the request."""
        started = self.clock() if started is None else started
        tried: list[str] = []
        last_error: RoutingError | None = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                route = self._route(model, prompt, max_tokens, tried, shadow)
            except RoutingError as error:
                if last_error is not None and error.status == 503:
                    raise last_error from None  # nothing else to try: report what went wrong
                raise
            tried.append(route.endpoint.name)
            try:
                response = await self.session.post(route.endpoint.url + path, data=body, headers=headers)
            except (TimeoutError, aiohttp.ClientConnectionError, OSError) as error:
                self._failed(route, f"connect to {route.endpoint.url} failed: {error!r}")
                last_error = RoutingError(
                    502,
                    f"replica {route.endpoint.name} ({route.endpoint.url}) is unreachable",
                    attempted=True,
                )
                if attempt < self.max_attempts:
                    self.metrics.retries.labels(model, route.endpoint.name).inc()
                continue
            except BaseException:
                self.state.ledger.close(route.ticket)
                raise
            if response.status == RETRYABLE_STATUS and attempt < self.max_attempts:
                response.release()
                self._failed(route, f"{route.endpoint.url} answered 503 before the first byte")
                self.metrics.retries.labels(model, route.endpoint.name).inc()
                last_error = RoutingError(
                    503, f"replica {route.endpoint.name} is unavailable (503)", attempted=True
                )
                continue
            if response.status >= 500:
                self.state.record_failure(route.endpoint.name, self.clock())
            else:
                self.state.record_success(route.endpoint.name)
            return UpstreamCall(route, response, started, attempt)
        assert last_error is not None
        raise last_error

    def _failed(self, route: Route, why: str) -> None:
        self.state.ledger.close(route.ticket)
        if self.state.record_failure(route.endpoint.name, self.clock()):
            self.metrics.ejections.labels(route.endpoint.name).inc()
            log.warning("ejected replica %s after repeated failures (last: %s)", route.endpoint.name, why)
        else:
            log.info("replica %s failed: %s; retrying elsewhere", route.endpoint.name, why)

    def on_chunk(self, call: UpstreamCall, chunk: bytes, final: bool = False) -> None:
        """Account for a chunk relayed to the client. Time to first token is taken at the first chunk that
        carries generated text (or at the whole body of a non-streamed answer, ``final``); the gaps between
        later chunks that carry text are the inter-token latencies."""
        ledger = self.state.ledger
        events = call._counter.feed(chunk)
        if call.text is not None:
            (call.text.feed_body if final else call.text.feed_stream)(chunk)
        route = call.route
        if final or carries_token(chunk):
            now = self.clock()
            if call.first_byte_at is None:
                call.first_byte_at = now
                ledger.first_token(route.ticket)
                if not route.shadow:
                    self.metrics.ttft.labels(route.namespace, route.model, route.revision).observe(
                        now - call.started
                    )
            elif not route.shadow:
                if call._inter_token is None:
                    call._inter_token = self.metrics.inter_token.labels(
                        route.namespace, route.model, route.revision
                    )
                call._inter_token.observe(now - call.last_token_at)
            call.last_token_at = now
        if call.first_byte_at is not None:
            ledger.generated(route.ticket, events)

    def finish(self, call: UpstreamCall, code: int | str) -> None:
        """Release the accounting and record the outcome; ``code`` is the status the client got, or 499 for a
        client that went away and 502 for an upstream that broke mid-stream."""
        route = call.route
        self.state.ledger.close(route.ticket)
        call.response.close()  # closes the upstream connection: an unfinished request is aborted upstream
        if route.shadow:
            return
        self.count_answer(route.namespace, route.model, route.revision, route.endpoint.name, code)
        self.metrics.e2e.labels(route.namespace, route.model, route.revision).observe(
            self.clock() - call.started
        )
        if call.pair is not None:
            # A client that went away (499) says nothing of the revision: the pair is not counted.
            self._end_pair(call.pair, PRIMARY, None if int(code) == 499 else int(code) < 400, call.text)

    def count_answer(self, namespace: str, model: str, revision: str, replica: str, code: int | str) -> None:
        """One client request answered with ``code`` (errors are codes >= 400, 499 for a client gone)."""
        labels = (namespace, model, revision, replica, str(code))
        self.metrics.requests.labels(*labels).inc()
        if int(code) >= 400:
            self.metrics.errors.labels(*labels).inc()

    def count_rejected(self, model: str, error: RoutingError) -> None:
        """A request no replica was found for (unknown model, no replica, all saturated)."""
        known = error.status != 404  # an unknown model name is client input: not a label value
        self.count_answer(
            self.state.namespace_of(model) if known else "", model if known else "", "", "", error.status
        )

    # --- shadow copies ---------------------------------------------------------------------------------

    def maybe_shadow(
        self, primary: UpstreamCall, path: str, body: bytes, prompt: str, max_tokens: int, greedy: bool
    ) -> None:
        """With the model's shadow fraction, send a copy to the shadow revision off the client's path: the
        copy runs in its own task, is read to the end and discarded; when too many copies are in flight, the
        copy is dropped rather than queued (it must never slow the client). A copy that runs is paired with
        the primary: whichever of the two ends last records the pair (the client never waits for it)."""
        model = primary.route.model
        if not self.state.shadow_wanted(model):
            return
        view = self.state.models[model]
        revision = view.shadow.revision if view.shadow else ""
        if self._shadow_slots.locked():
            self.metrics.shadow_requests.labels(view.namespace, model, revision, "dropped").inc()
            return
        pair = ShadowPair(greedy, namespace=view.namespace, model=model, revision=revision)
        primary.pair = pair
        if pair.greedy:
            primary.text = OutputText()
        task = asyncio.create_task(self._shadow(pair, path, body, prompt, max_tokens))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    def _end_pair(self, pair: ShadowPair, side: str, ok: bool | None, text: OutputText | None) -> None:
        result = pair.end(side, ok, text.text() if text is not None else None)
        if result is not None:
            self._count_pair(pair, result)

    def _count_pair(self, pair: ShadowPair, result: PairResult) -> None:
        labels = (pair.namespace, pair.model, pair.revision)
        self.metrics.shadow_pairs.labels(*labels, result.outcome).inc()
        if result.outputs_match is not None:
            self.metrics.shadow_output_match.labels(*labels, str(result.outputs_match).lower()).inc()

    async def _shadow(self, pair: ShadowPair, path: str, body: bytes, prompt: str, max_tokens: int) -> None:
        model, revision, namespace = pair.model, pair.revision, pair.namespace
        async with self._shadow_slots:
            started = self.clock()
            outcome = "error"
            call = None
            try:
                call = await self.open(model, path, body, prompt, max_tokens, started=started, shadow=True)
                if pair.greedy:
                    call.text = OutputText()
                if call.response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    async for chunk in call.response.content.iter_any():
                        self.on_chunk(call, chunk)
                else:
                    self.on_chunk(call, await call.response.read(), final=True)
                outcome = "ok" if call.response.status < 400 else "error"
            except RoutingError as error:
                # A copy that reached a failing shadow replica is an error of that revision (the analysis must
                # see it); one that found no replica to go to was never answered, and is dropped.
                outcome = "error" if error.attempted else "dropped"
                log.debug("shadow copy for %s %s: %s", model, outcome, error.message)
            except (TimeoutError, aiohttp.ClientError, OSError) as error:
                log.info("shadow copy for %s (revision %s) failed: %r", model, revision, error)
            finally:
                if call is not None:
                    self.finish(call, call.response.status)
                self.metrics.shadow_requests.labels(namespace, model, revision, outcome).inc()
                if outcome != "dropped":
                    self.metrics.shadow_duration.labels(namespace, model, revision).observe(
                        self.clock() - started
                    )
                    self._end_pair(pair, SHADOW, outcome == "ok", call.text if call is not None else None)

    async def close(self) -> None:
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)


def upstream_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
