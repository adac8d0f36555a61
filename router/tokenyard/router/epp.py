"""The router as the Gateway API Inference Extension's endpoint picker (EPP): an Envoy ``ExternalProcessor``
service on its own port, for gateways (Istio, kgateway, Envoy Gateway, ...) whose ``InferencePool`` names
this router as its picker. The gateway forwards each request itself; the router only picks and accounts.

One ``Process`` stream is one HTTP request (the messages are in ``epp_protocol``). The gateway streams the
request headers and body; at the body's end the request is parsed as the HTTP front parses it
(``openai_wire``) and routed by the same call (``Forwarder.route``: the filters, scorers and picker, the
canary split, a ticket in the ledger); the answer names the replica and, as fallbacks, the next best ones the
same filters kept, and the body goes back to the gateway as the HTTP front would forward it (a stream asks
for its usage; the picker drops that event from the response). The response then passes through the picker:
its status clears or counts the replica's failures, its event stream releases decode tokens as it comes, and
its end, or the gateway closing the stream, or an error, releases whatever the ticket still holds
(``GatewayExchange``, the same accounting as the HTTP front's ``Exchange``). The gateway must run its ext_proc
filter with request and response bodies ``FULL_DUPLEX_STREAMED`` and trailers ``SEND``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tokenyard.router import epp_protocol as wire
from tokenyard.router.discovery import Endpoint
from tokenyard.router.exchange import RoutedRequest
from tokenyard.router.http_front import DEFAULT_MAX_BODY_BYTES, error_body
from tokenyard.router.openai_wire import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    HOP_HEADERS,
    USAGE_REFUSAL_STATUSES,
    InferenceRequest,
    InvalidRequest,
    StreamDecodeError,
    UsageEventFilter,
    parse_request,
)
from tokenyard.router.proxy import Forwarder
from tokenyard.router.state import RoutingError

log = logging.getLogger("tokenyard.router")

DEFAULT_FALLBACKS = 1
INFERENCE_PATHS = (COMPLETIONS_PATH, CHAT_COMPLETIONS_PATH)
# The gRPC health services the protocol asks an EPP to expose (besides the server's overall "").
HEALTH_SERVICES = ("", "liveness", "readiness", wire.SERVICE_NAME)


class GatewayGone(ConnectionResetError):
    """The gateway ended the stream before the response's end (its client went away, or it gave up)."""


class GatewayExchange(RoutedRequest):
    """One request a gateway forwards to the replica this router picked: reserved when picked, accounted as
    the response passes through the picker, released when it ends however it ends (``settle``)."""

    def __init__(self, forwarder: Forwarder, request: InferenceRequest, started: float) -> None:
        super().__init__(forwarder, request, started)
        self.endpoints: list[Endpoint] = []  # the primary, then the fallbacks, as the gateway was told
        self._whole_body = bytearray()  # a non-streamed answer, accounted at its end

    @property
    def addresses(self) -> list[str]:
        return [wire.endpoint_address(endpoint.url) for endpoint in self.endpoints]

    def reserve(self, subset: list[str] | None, fallbacks: int) -> None:
        """Routes the request (the ledger holds its ticket from here on) and chooses its fallbacks. Raises
        RoutingError when no replica can take it (then nothing is held)."""
        forwarder, model = self.forwarder, self.request.model
        view = forwarder.state.models.get(model)
        exclude: list[str] = []
        if subset is not None and view is not None:
            allowed = set(subset)
            exclude = [e.name for e in view.endpoints if wire.endpoint_address(e.url) not in allowed]
            if len(exclude) == len(view.endpoints):
                error = RoutingError(
                    503, f"no replica of model {model!r} is in the gateway's subset {subset}"
                )
                forwarder.count_rejected(model, error)
                raise error
        forwarder.request_began()
        try:
            self.route = forwarder.route(self.request, exclude)
        except RoutingError as error:
            self._record_rejection(error)
            forwarder.request_ended()
            raise
        try:  # the ticket is open and the request counted: whatever fails from here releases both
            by_name = {endpoint.name: endpoint for endpoint in view.endpoints} if view else {}
            chosen = self.route.endpoint
            self.endpoints = [chosen] + [
                by_name[name]
                for name in wire.ranked_fallbacks(self.route.decision.scores, chosen.name, fallbacks)
                if name in by_name
            ]
            forwarder.maybe_shadow(self)
        except BaseException as error:
            self.settle(error)
            raise

    def served_by(self, address: str | None) -> None:
        """The gateway's report of the endpoint that served (None: none did). The ones before it in the list
        failed (the gateway went on down the list): each counts towards its ejection, and the ticket moves to
        the one that serves, so that the load lands where the work is."""
        assert self.route is not None
        addresses = self.addresses
        # None: the gateway reached none of them (its own 503 then counts against the primary, in
        # ``answered``), or it does not report; either way the primary keeps the ticket.
        if address is None or address == addresses[0]:
            return
        if address not in addresses:
            log.warning("the gateway reports %s served a request; the picker named %s", address, addresses)
            return
        failed = addresses.index(address)
        for endpoint in self.endpoints[:failed]:
            self.forwarder.replica_failed(endpoint.name, f"the gateway could not reach {endpoint.url}")
        served = self.endpoints[failed]
        self.route = self.forwarder.state.served_elsewhere(self.route, served, self.forwarder.clock())

    def response_chunk(self, chunk: bytes) -> None:
        """One piece of the replica's answer as the gateway passes it. A stream that does not decode is
        recorded as broken; its bytes still reach the client (the gateway relays them either way)."""
        if self._broken:
            return
        if self.streams:
            try:
                self._feed(chunk)
            except StreamDecodeError as error:
                self._broke(error)
        elif len(self._whole_body) <= DEFAULT_MAX_BODY_BYTES:
            self._whole_body += chunk

    def response_ended(self) -> None:
        if not self.streams and not self._broken and self._whole_body:
            self._account_whole(bytes(self._whole_body))
        self.settle(None)


class PickerStream:
    """One ``Process`` stream's state: ``handle`` takes each message from the gateway and returns the messages
    to send back, in order; ``close`` ends it (releasing what the request holds, once)."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self.forwarder = picker.forwarder
        self.started = self.forwarder.clock()
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.subset: list[str] | None = None
        self.exchange: GatewayExchange | None = None
        self.has_body = False  # the gateway sends a body (its headers did not end the stream)
        self.picked = False  # the request phase is answered
        self.done = False  # the response has ended, or an immediate response was sent
        self.response_status = 0
        # The stream's usage event, asked for on the client's behalf (openai_wire.ask_stream_usage), is
        # dropped from the response on its way back to the gateway, as the HTTP front drops it.
        self.hidden_usage: UsageEventFilter | None = None
        self.error_body = bytearray()  # the head of an error answer to a request with stream_options added

    def handle(self, message: ext_proc.ProcessingRequest) -> list[ext_proc.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if message.HasField("protocol_config"):
            problem = wire.body_mode_problem(message.protocol_config)
            if problem:
                log.error("endpoint picker: %s", problem)
                return self._refuse(500, problem)
        if message.HasField("metadata_context") and self.subset is None:
            self.subset = wire.subset_hint(message.metadata_context)
        if kind == "request_headers":
            return self._request_headers(message.request_headers)
        if kind == "request_body":
            return self._request_body(message.request_body)
        if kind == "request_trailers":
            # Trailers end the body in full duplex mode (its last chunk then does not say so).
            responses = self._pick(body_ends=False) if not self.picked else []
            return [*responses, wire.trailers_response("request_trailers")]
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "response_trailers":
            self._end_response()
            return [wire.trailers_response("response_trailers")]
        return []

    def close(self, error: BaseException | None = None) -> None:
        """The stream is over: a request still open ended without its response (the gateway left)."""
        exchange = self.exchange
        if exchange is not None and exchange.ending is None:
            exchange.settle(error if error is not None else GatewayGone("the gateway closed the stream"))

    # --- the request phase -----------------------------------------------------------------------------

    def _request_headers(self, message: ext_proc.HttpHeaders) -> list[ext_proc.ProcessingResponse]:
        self.headers = wire.headers_of(message)
        self.has_body = not message.end_of_stream
        if self.picker.is_draining():
            return self._refuse(
                503, "router is draining; retry on another router replica", {"retry-after": "1"}
            )
        if message.end_of_stream:
            return self._pick()
        return []

    def _request_body(self, message: ext_proc.HttpBody) -> list[ext_proc.ProcessingResponse]:
        if self.done or self.picked:
            return []
        self.body += message.body
        if len(self.body) > self.picker.max_body_bytes:
            return self._refuse(413, f"request body exceeds the limit of {self.picker.max_body_bytes} bytes")
        if message.end_of_stream:
            return self._pick()
        return []

    def _pick(self, body_ends: bool = True) -> list[ext_proc.ProcessingResponse]:
        """The request is whole: pick, and answer the headers (the endpoints) and then the body (whose last
        chunk ends the stream unless trailers follow, ``body_ends``)."""
        if self.done:
            return []
        path = self.headers.get(":path", "").split("?", 1)[0]
        body = bytes(self.body)
        if path in INFERENCE_PATHS:
            settings = self.forwarder.state.settings
            try:
                request = parse_request(
                    path,
                    body,
                    settings.default_max_tokens,
                    self._upstream_headers(),
                    ask_usage=settings.stream_usage,
                )
            except InvalidRequest as error:
                return self._refuse(400, str(error))
            exchange = GatewayExchange(self.forwarder, request, self.started)
            try:
                exchange.reserve(self.subset, self.picker.fallbacks)
            except RoutingError as error:
                retry = {"retry-after": str(error.retry_after_s)} if error.retry_after_s else None
                return self._refuse(error.status, error.message, retry)
            self.exchange = exchange
            endpoints = exchange.addresses
            assert exchange.route is not None
            if request.hides_usage and exchange.route.endpoint.url in self.forwarder.state.usage_refused:
                exchange.request = request.as_client_sent()  # the replica refused the member before
            body = exchange.request.body  # as the HTTP front forwards it (a stream's usage asked for)
        else:
            # Not an inference request (a model list, a health check): any ready replica, nothing to account.
            endpoint = self.picker.any_ready(self.subset)
            if endpoint is None:
                return self._refuse(
                    503, "no ready replica" + (" in the gateway's subset" if self.subset else "")
                )
            endpoints = [wire.endpoint_address(endpoint.url)]
        self.picked = True
        responses = [wire.destination_response(endpoints, len(body))]
        if self.has_body:  # full duplex: the body goes back through the picker, whole
            responses += wire.body_responses(body, body_ends, "request_body")
        self.body = bytearray()
        return responses

    def _upstream_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if not k.startswith(":") and k not in HOP_HEADERS}

    def _refuse(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        self.done = True
        return [wire.immediate(status, error_body(status, message), headers, details=message)]

    # --- the response phase ----------------------------------------------------------------------------

    def _response_headers(self, message: ext_proc.ProcessingRequest) -> list[ext_proc.ProcessingResponse]:
        headers = wire.headers_of(message.response_headers)
        try:
            self.response_status = int(headers.get(":status", "0"))
        except ValueError:
            self.response_status = 0
        exchange = self.exchange
        extra: dict[str, str] = {}
        if exchange is not None and exchange.ending is None:
            served = wire.served_endpoint(message.metadata_context)
            exchange.served_by(served)
            exchange.answered(self.response_status, headers.get("content-type", ""))
            if exchange.request.hides_usage and exchange.streams:
                self.hidden_usage = UsageEventFilter()
            assert exchange.route is not None
            extra = {
                "x-tokenyard-replica": exchange.route.endpoint.name,
                "x-tokenyard-revision": exchange.route.revision,
            }
        responses = [wire.response_headers_response(extra)]
        if message.response_headers.end_of_stream:
            self._end_response()
        return responses

    def _response_body(self, message: ext_proc.HttpBody) -> list[ext_proc.ProcessingResponse]:
        exchange = self.exchange
        if exchange is not None and exchange.ending is None and message.body:
            exchange.response_chunk(message.body)
        if (
            exchange is not None
            and exchange.request.hides_usage
            and self.response_status in USAGE_REFUSAL_STATUSES
        ):
            # The gateway has sent the request and cannot resend it: this one answer is the client's, but the
            # replica is remembered as refusing stream_options, and its next requests go as the client sent them.
            self.error_body += message.body[: 4096 - len(self.error_body)]
            if message.end_of_stream and exchange.route is not None:
                exchange.note_usage_refusal(
                    exchange.route.endpoint, self.response_status, bytes(self.error_body)
                )
        if message.end_of_stream:
            self._end_response()
        body = message.body
        if self.hidden_usage is not None:
            # Engines end every event with a blank line, so nothing is held when trailers end the body
            body = self.hidden_usage.feed(body) + (
                self.hidden_usage.flush() if message.end_of_stream else b""
            )
        return wire.body_responses(body, message.end_of_stream, "response_body")

    def _end_response(self) -> None:
        self.done = True
        exchange = self.exchange
        if exchange is not None and exchange.ending is None:
            exchange.response_ended()


class EndpointPicker(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        forwarder: Forwarder,
        fallbacks: int = DEFAULT_FALLBACKS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        is_draining: Callable[[], bool] = lambda: False,
    ) -> None:
        if fallbacks < 0:
            raise ValueError(f"fallbacks must be >= 0, got {fallbacks}")
        self.forwarder = forwarder
        self.fallbacks = fallbacks
        self.max_body_bytes = max_body_bytes
        self.is_draining = is_draining

    def any_ready(self, subset: list[str] | None) -> Endpoint | None:
        """The least loaded replica that is reachable and not ejected (within the subset, when given)."""
        state, now = self.forwarder.state, self.forwarder.clock()
        ready = [
            endpoint
            for endpoint in state.endpoints()
            if endpoint.name not in state.unreachable
            and not state.failures.is_ejected(endpoint.name, now)
            and (subset is None or wire.endpoint_address(endpoint.url) in subset)
        ]
        return min(ready, key=lambda e: (state.load(e.name).tokens, e.name), default=None)

    async def Process(
        self, request_iterator: AsyncIterator[ext_proc.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        stream = PickerStream(self)
        try:
            async for message in request_iterator:
                for response in stream.handle(message):
                    yield response
        except BaseException as error:  # cancelled (the gateway reset the stream), or a bug: release first
            stream.close(error)
            raise
        else:
            stream.close()


async def start_epp(
    forwarder: Forwarder,
    host: str,
    port: int,
    fallbacks: int = DEFAULT_FALLBACKS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    is_draining: Callable[[], bool] = lambda: False,
) -> tuple[grpc.aio.Server, int, health.HealthServicer]:
    """The endpoint picker's gRPC server (ExternalProcessor plus the health services the protocol names)."""
    server = grpc.aio.server()
    picker = EndpointPicker(forwarder, fallbacks, max_body_bytes, is_draining)
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in HEALTH_SERVICES:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"endpoint picker: cannot listen on {host}:{port}")
    await server.start()
    return server, bound, health_servicer
