"""One request's exchange with a replica, from routing to its last byte: ``Exchange``, an async context
manager that both fronts (and the shadow copies) use the same way::

    try:
        async with forwarder.exchange(request, started) as exchange:  # route, connect, retry once elsewhere
            ...exchange.response.status, exchange.route...
            async for chunk, events in exchange.stream():  # or: body = await exchange.read()
                ...relay chunk (HTTP) or events (gRPC)...
    except RoutingError: ...  # no replica took it (counted as a rejection)
    except StreamBroken: ...  # the replica's stream broke (recorded as its failure)

Entering reserves the load (a ticket in the ledger, through ``RouterState.route``), counts the request in
flight, and may start a shadow copy. Leaving releases all of it in ``__aexit__`` however the exchange ended,
and knows how it ended (``Ending``): the replica's answer relayed whole, an upstream error, the client gone
(the upstream request is aborted: closing its response closes the connection), or a failure of the router
itself. Requests, errors, latencies, the shadow pair and the replica's failure record all follow from that one
ending.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
from tokenyard.router.openai_wire import (
    USAGE_MARK,
    USAGE_REFUSAL_STATUSES,
    InferenceRequest,
    OutputText,
    ResponseEvent,
    StreamDecodeError,
    StreamDecoder,
    decode_body,
    refuses_stream_usage,
)
from tokenyard.router.shadowpair import PRIMARY, SHADOW, ShadowPair
from tokenyard.router.state import Route, RoutingError

if TYPE_CHECKING:
    from tokenyard.router.discovery import Endpoint
    from tokenyard.router.proxy import Forwarder

log = logging.getLogger("tokenyard.router")

RETRYABLE_STATUS = 503
CLIENT_GONE = 499  # nginx's code for "client closed request"
UPSTREAM_BROKEN = 502
ROUTER_FAILED = 500
# How a client going away reaches the exchange: its handler cancelled (aiohttp's handler_cancellation, a gRPC
# cancellation), a write to its closed connection, or a gRPC response generator closed.
CLIENT_GONE_ERRORS = (asyncio.CancelledError, ConnectionResetError, GeneratorExit)
UPSTREAM_READ_ERRORS = (TimeoutError, aiohttp.ClientError)


class Ending(enum.Enum):
    SUCCESS = "success"  # the replica's answer was relayed whole, with a status < 400
    UPSTREAM_ERROR = "upstream_error"  # the replica answered an error status, or its stream broke
    CLIENT_GONE = "client_gone"  # the client went away before the end
    ROUTER_ERROR = "router_error"  # the router itself failed mid-way (a bug: logged with its traceback)

    @property
    def judges_replica(self) -> bool:
        """Whether the ending says anything about the replica's revision (a shadow pair counts only these)."""
        return self in (Ending.SUCCESS, Ending.UPSTREAM_ERROR)


class StreamBroken(Exception):
    """The replica's answer broke off (a failed read, or an event that does not decode). The exchange has
    recorded it; the front only tells its client."""


class RoutedRequest:
    """One request routed to one replica and the replica's answer, accounted: the ticket its route holds in the
    ledger, the answer's tokens as they are relayed, and its ending. Whoever moves the bytes subclasses it:
    ``Exchange`` (the router forwards the request itself) and ``epp.GatewayExchange`` (a gateway forwards it
    and passes the answer through the endpoint picker protocol). A shadow copy (``shadow=True``) is accounted
    on the ledger like any request but counted apart: in the shadow metrics and its pair only."""

    def __init__(
        self,
        forwarder: Forwarder,
        request: InferenceRequest,
        started: float,
        shadow: bool = False,
        pair: ShadowPair | None = None,
    ) -> None:
        self.forwarder = forwarder
        self.request = request
        self.started = started  # monotonic time the client's request arrived
        self.shadow = shadow
        self.route: Route | None = None
        self.status: int | None = None  # the replica's answer's status, once it came
        self.content_type = ""  # the replica's answer's Content-Type
        self.ending: Ending | None = None
        self.code: int | None = None  # the status the client got; 499 client gone, 502 stream broken
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        # Set when the request is shadowed: the pair this side belongs to, and its output text when compared.
        self.pair: ShadowPair | None = None
        self.text: OutputText | None = None
        if pair is not None:
            self.join_pair(pair)
        self._broken = False
        # Output tokens: as the engine's usage counts them when it reports it, else the events that carried text
        self.usage_output_tokens: int | None = None
        self.output_events = 0
        self._decoder = StreamDecoder()
        self._inter_token: Any = None  # the labelled inter-token histogram, looked up once per exchange

    def join_pair(self, pair: ShadowPair) -> None:
        self.pair = pair
        if pair.greedy:
            self.text = OutputText()

    @property
    def streams(self) -> bool:
        """Whether the replica answers with an event stream (else one JSON body)."""
        return self.content_type.startswith("text/event-stream")

    def answered(self, status: int, content_type: str) -> None:
        """The replica's answer began with ``status``: a 5xx counts towards its ejection, anything else clears
        its failures."""
        assert self.route is not None
        self.status, self.content_type = status, content_type
        endpoint = self.route.endpoint
        if status >= 500:
            self.forwarder.replica_failed(endpoint.name, f"{endpoint.url} answered {status}")
        else:
            self.forwarder.state.record_success(endpoint.name)

    def note_usage_refusal(self, endpoint: Endpoint, status: int, detail: bytes) -> bool:
        """Whether the replica's error answer (``status``, the head of its body) refuses the ``stream_options``
        member the router added; then the replica is remembered, and its next requests go as the client sent
        them (the router learns token sizes there only from clients that ask for usage)."""
        if not self.request.hides_usage or not refuses_stream_usage(status, detail):
            return False
        state = self.forwarder.state
        if endpoint.url not in state.usage_refused:
            state.usage_refused.add(endpoint.url)
            log.warning(
                "replica %s (%s) refuses stream_options (HTTP %d: %s); its streams go as the client sent them",
                endpoint.name,
                endpoint.url,
                status,
                detail[:200].decode(errors="replace"),
            )
        return True

    def _broke(self, error: BaseException) -> StreamBroken:
        assert self.route is not None
        name = self.route.endpoint.name
        self._broken = True
        self.forwarder.replica_failed(name, f"its stream broke: {error!r}")
        return StreamBroken(f"stream from replica {name} broke: {error!r}")

    def _feed(self, chunk: bytes, decode: bool = False) -> list[ResponseEvent]:
        """Accounts for one read of the replica's event stream; returns the events it completed. ``decode``:
        each event's JSON is decoded now (raises StreamDecodeError when one does not decode)."""
        events = self._decoder.feed(chunk)
        if decode:
            for event in events:
                if not event.done:
                    event.payload  # noqa: B018 - decoded now, cached for the caller
        self._account(events, whole=False)
        return events

    def _account_whole(self, body: bytes) -> None:
        """Accounts for the replica's whole (non-streamed) answer."""
        self._account([decode_body(body)], whole=True)

    def _account(self, events: list[ResponseEvent], whole: bool) -> None:
        """Accounts for what was relayed. Time to first token is taken at the first event that carries
        generated text (or at the whole body of a non-streamed answer, ``whole``); the gaps between later
        reads that carry text are the inter-token latencies. Each event that carries text releases one decode
        token of the ticket (one event ~ one token, as engines stream)."""
        route = self.route
        assert route is not None
        if self.text is not None:
            for event in events:
                self.text.add(event)
        if self.usage_output_tokens is None and not self.shadow:
            self._read_usage(events)
        carrying = len(events) if whole else sum(event.carries_token for event in events)
        self.output_events += carrying
        if carrying:
            now = self.forwarder.clock()
            if self.first_token_at is None:
                self.first_token_at = now
                # A streamed first token came as the engine made it: it measures the replica's prefill rate
                self.forwarder.state.ledger.first_token(route.ticket, None if whole else now)
                if not self.shadow:
                    self.forwarder.metrics.ttft.labels(route.namespace, route.model, route.revision).observe(
                        now - self.started
                    )
            elif not self.shadow:
                if self._inter_token is None:
                    self._inter_token = self.forwarder.metrics.inter_token.labels(
                        route.namespace, route.model, route.revision
                    )
                self._inter_token.observe(now - self.last_token_at)
            self.last_token_at = now
        if carrying and not whole:
            self.forwarder.state.ledger.generated(route.ticket, carrying, now)

    def _read_usage(self, events: list[ResponseEvent]) -> None:
        """The engine's usage (once per answer): its count of the prompt's tokens teaches the router how many
        bytes make a token for this model (learned_sizes); its count of output tokens is kept for the end; its
        count of cached prompt tokens (vLLM with --enable-prompt-tokens-details, SGLang with
        --enable-cache-report) corrects the prefix index (RouterState.learn_cached_tokens).
        Found by a byte search first: usage comes once, in the last event of a stream, and decoding every
        event to look for it would cost the relay."""
        for event in events:
            if USAGE_MARK not in event.data:
                continue
            try:
                usage = event.usage
            except StreamDecodeError:
                return
            prompt_tokens = usage.get("prompt_tokens") if usage else None
            output_tokens = usage.get("completion_tokens") if usage else None
            if _is_count(prompt_tokens):
                prompt_bytes = len(self.request.prompt.encode("utf-8", "surrogatepass"))
                self.forwarder.state.learn_prompt_tokens(self.request.model, prompt_bytes, prompt_tokens)
            if _is_count(output_tokens):
                self.usage_output_tokens = output_tokens
            details = usage.get("prompt_tokens_details") if usage else None
            cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
            # the engines report the first prompt's cached tokens, which says nothing of a batch's joined text
            if _is_count(cached_tokens) and self.route is not None and self.request.prompts == 1:
                self.forwarder.state.learn_cached_tokens(self.route, cached_tokens)
            return

    # --- leaving: release and record ---------------------------------------------------------------------

    def settle(self, exc: BaseException | None) -> None:
        """The request ended (``exc``: how, None for a whole answer): releases what it held on the ledger and
        in flight, and records its ending. Call it once, however the request ended."""
        assert self.route is not None
        self.ending, self.code = self._ending(exc)
        try:
            self.forwarder.state.ledger.close(self.route.ticket)
            self._release_upstream()
            self._record_end()
        finally:
            if not self.shadow:
                self.forwarder.request_ended()

    def _release_upstream(self) -> None:
        """What the subclass holds of the replica's answer (its connection), released at the end."""

    def _ending(self, exc: BaseException | None) -> tuple[Ending, int]:
        assert self.route is not None
        if self._broken:
            return Ending.UPSTREAM_ERROR, UPSTREAM_BROKEN
        if exc is None:
            status = self.status if self.status is not None else UPSTREAM_BROKEN
            return (Ending.SUCCESS if status < 400 else Ending.UPSTREAM_ERROR), status
        if isinstance(exc, CLIENT_GONE_ERRORS):
            return Ending.CLIENT_GONE, CLIENT_GONE
        log.error(
            "request to replica %s failed in the router; the client gets a %d",
            self.route.endpoint.name,
            ROUTER_FAILED,
            exc_info=exc,
        )
        return Ending.ROUTER_ERROR, ROUTER_FAILED

    def _record_end(self) -> None:
        assert self.route is not None and self.ending is not None and self.code is not None
        route, metrics = self.route, self.forwarder.metrics
        elapsed = self.forwarder.clock() - self.started
        labels = (route.namespace, route.model, route.revision)
        if self.ending is Ending.SUCCESS and not self.shadow:
            # Streamed events count tokens; a whole answer without usage says nothing of its length.
            produced = self.usage_output_tokens
            if produced is None and self.streams:
                produced = self.output_events
            if produced is not None:
                cap, samples = self.request.output_cap, self.request.samples
                reached_cap = cap is not None and produced >= cap * samples
                self.forwarder.state.learn_output_tokens(self.request.model, produced, reached_cap, samples)
        if self.shadow:
            # A copy cut short by the router (its shutdown, a bug) says nothing of the revision: the canary
            # analysis reads outcome="error" as the shadow revision's errors, so it is counted apart.
            if self.ending.judges_replica:
                outcome = "ok" if self.ending is Ending.SUCCESS else "error"
            else:
                outcome = "abandoned"
            metrics.shadow_requests.labels(*labels, outcome).inc()
            metrics.shadow_duration.labels(*labels).observe(elapsed)
        else:
            self.forwarder.count_answer(*labels, route.endpoint.name, self.code)
            metrics.e2e.labels(*labels).observe(elapsed)
        if self.pair is not None:
            ok = self.ending is Ending.SUCCESS if self.ending.judges_replica else None
            self.forwarder.end_pair(self.pair, SHADOW if self.shadow else PRIMARY, ok, self.text)

    def _record_rejection(self, error: RoutingError) -> None:
        """No replica took the request (unknown model, none ready, all saturated, every attempt failed)."""
        if not self.shadow:
            self.forwarder.count_rejected(self.request.model, error)
            return
        # A copy that reached a failing shadow replica is an error of that revision (the analysis must see
        # it); one that found no replica to go to was never answered, and is dropped.
        pair = self.pair
        assert pair is not None
        labels = (pair.namespace, pair.model, pair.revision)
        if not error.attempted:
            log.debug("shadow copy for %s dropped: %s", pair.model, error.message)
            self.forwarder.metrics.shadow_requests.labels(*labels, "dropped").inc()
            return
        self.forwarder.metrics.shadow_requests.labels(*labels, "error").inc()
        self.forwarder.metrics.shadow_duration.labels(*labels).observe(self.forwarder.clock() - self.started)
        self.forwarder.end_pair(pair, SHADOW, False, None)


class Exchange(RoutedRequest):
    """One request the router forwards to a replica itself (see the module's docstring)."""

    def __init__(
        self,
        forwarder: Forwarder,
        request: InferenceRequest,
        started: float,
        shadow: bool = False,
        pair: ShadowPair | None = None,
    ) -> None:
        super().__init__(forwarder, request, started, shadow, pair)
        self.response: aiohttp.ClientResponse | None = None
        self.attempts = 0

    # --- entering: route, connect, retry ---------------------------------------------------------------

    async def __aenter__(self) -> Exchange:
        forwarder = self.forwarder
        if not self.shadow:
            forwarder.request_began()
        try:
            await self._connect()
        except BaseException as error:
            if isinstance(error, RoutingError):
                self._record_rejection(error)
            if not self.shadow:
                forwarder.request_ended()
            raise
        if not self.shadow:
            try:
                forwarder.maybe_shadow(self)
            except BaseException as error:  # connected, ticket open: __aexit__ will not run, so release here
                self.settle(error)
                raise
        return self

    async def _connect(self) -> None:
        """Routes and connects; a connect error or a 503 before the first byte is retried once on another
        replica. Raises RoutingError when no replica can take the request."""
        forwarder, request = self.forwarder, self.request
        tried: list[str] = []
        last_error: RoutingError | None = None
        for attempt in range(1, forwarder.max_attempts + 1):
            try:
                route = forwarder.route(request, tried, self.shadow)
            except RoutingError as error:
                if last_error is not None and error.status == 503:
                    raise last_error from None  # nothing else to try: report what went wrong
                raise
            # A retry happens only once another replica took the request: counted against the one that failed.
            if tried:
                forwarder.metrics.retries.labels(route.model, tried[-1]).inc()
            tried.append(route.endpoint.name)
            endpoint = route.endpoint
            if request.hides_usage and endpoint.url in forwarder.state.usage_refused:
                request = self.request = request.as_client_sent()
            try:
                response = await self._post(endpoint.url)
                if request.hides_usage and response.status in USAGE_REFUSAL_STATUSES:
                    response = await self._unless_usage_refused(route, response)
                    request = self.request
            except (TimeoutError, aiohttp.ClientConnectionError, OSError) as error:
                forwarder.state.ledger.close(route.ticket)
                forwarder.replica_failed(endpoint.name, f"connect to {endpoint.url} failed: {error!r}")
                last_error = RoutingError(
                    502, f"replica {endpoint.name} ({endpoint.url}) is unreachable", attempted=True
                )
                continue
            except BaseException:
                forwarder.state.ledger.close(route.ticket)
                raise
            if response.status == RETRYABLE_STATUS and attempt < forwarder.max_attempts:
                response.release()
                forwarder.state.ledger.close(route.ticket)
                forwarder.replica_failed(endpoint.name, f"{endpoint.url} answered 503 before the first byte")
                last_error = RoutingError(
                    503, f"replica {endpoint.name} is unavailable (503)", attempted=True
                )
                continue
            self.route, self.response, self.attempts = route, response, attempt
            self.answered(response.status, response.headers.get("Content-Type", ""))
            return
        assert last_error is not None
        raise last_error

    async def _post(self, url: str) -> aiohttp.ClientResponse:
        request = self.request
        return await self.forwarder.session.post(
            url + request.path,
            data=request.body,
            headers=dict(request.headers),
            timeout=self.forwarder.upstream_timeout(self.started, request.deadline_s),
        )

    async def _unless_usage_refused(
        self, route: Route, response: aiohttp.ClientResponse
    ) -> aiohttp.ClientResponse:
        """``response``, an error to a request the router added ``stream_options`` to, unless the error is about
        that member: then the replica is remembered as refusing it and gets the client's own request instead,
        so an engine older than the member (vLLM before v0.5.0) serves what it would have served without the
        router. An error body is small, and aiohttp keeps it for ``read`` once read."""
        endpoint = route.endpoint
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return response  # a stream, not an error body: left for the relay to read
        try:
            detail = await response.read()
        except UPSTREAM_READ_ERRORS:
            return response  # the relay reads it again and reports the failure
        if not self.note_usage_refusal(endpoint, response.status, detail):
            return response
        response.release()
        self.request = self.request.as_client_sent()
        return await self._post(endpoint.url)

    # --- the answer --------------------------------------------------------------------------------------

    async def stream(self, decode: bool = False) -> AsyncIterator[tuple[bytes, list[ResponseEvent]]]:
        """The replica's event stream as it arrives: each network read with the events it completed, accounted
        before it is yielded. ``decode``: each event's JSON is decoded here (for a front that relays events,
        not bytes), so that an event that does not decode breaks the stream like a failed read. Raises
        StreamBroken when the stream breaks."""
        assert self.response is not None
        try:
            async for chunk in self.response.content.iter_any():
                yield chunk, self._feed(chunk, decode)
        except (*UPSTREAM_READ_ERRORS, StreamDecodeError) as error:
            raise self._broke(error) from error

    async def read(self) -> bytes:
        """The replica's whole (non-streamed) answer. Raises StreamBroken when it cannot be read."""
        assert self.response is not None
        try:
            body = await self.response.read()
        except UPSTREAM_READ_ERRORS as error:
            raise self._broke(error) from error
        self._account_whole(body)
        return body

    async def discard_answer(self) -> None:
        """Reads the answer to the end and drops it (a shadow copy: only its ending and timing matter)."""
        if self.streams:
            async for _ in self.stream():
                pass
        else:
            await self.read()

    # --- leaving ----------------------------------------------------------------------------------------

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.settle(exc)
        return False

    def _release_upstream(self) -> None:
        assert self.response is not None
        self.response.close()  # closes the upstream connection: an unfinished request is aborted upstream


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
