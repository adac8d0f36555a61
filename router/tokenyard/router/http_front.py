"""The OpenAI-compatible HTTP front (aiohttp): completions and chat completions streamed through chunk by
chunk, /v1/models, /health; errors as OpenAI-style JSON bodies."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from tokenyard.router.exchange import UPSTREAM_BROKEN, Exchange, StreamBroken
from tokenyard.router.openai_wire import InvalidRequest, UsageEventFilter, parse_request, upstream_headers
from tokenyard.router.proxy import Forwarder
from tokenyard.router.state import RouterState, RoutingError

log = logging.getLogger("tokenyard.router")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


def error_body(status: int, message: str, kind: str | None = None) -> dict:
    """An OpenAI-style error body (the endpoint picker's immediate responses carry the same)."""
    kind = kind or {
        400: "invalid_request_error",
        404: "model_not_found",
        413: "request_too_large",
        429: "rate_limit_exceeded",
    }.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, message: str, kind: str | None = None, headers: dict[str, str] | None = None):
    return web.json_response(error_body(status, message, kind), status=status, headers=headers)


def served_routes(app: web.Application) -> str:
    """What the front serves, read from its own route table (aiohttp adds a HEAD beside every GET)."""
    return ", ".join(
        f"{route.method} {route.resource.canonical}"
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    )


@web.middleware
async def openai_style_routing_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp answers an unknown path or method with a plain-text 404 or 405; an OpenAI client expects a JSON
    error body it can show, naming what is wrong (an embeddings or responses call to a completions router)."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(
            404,
            f"{request.method} {request.path} is not served by this router; it serves "
            f"{served_routes(request.app)}",
            "not_found_error",
        )
    except web.HTTPMethodNotAllowed as refused:
        allowed = ", ".join(sorted(refused.allowed_methods))
        return error_response(
            405,
            f"{request.method} is not allowed on {request.path}; use {allowed}",
            "invalid_request_error",
            headers={"Allow": allowed},
        )


class ClientGone(ConnectionResetError):
    """The client hung up while its answer streamed (a ConnectionResetError, so the exchange records the
    ending as client gone); carries the response already started for it."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("the client closed the connection mid-answer")
        self.response = response


class HttpFront:
    def __init__(
        self,
        state: RouterState,
        forwarder: Forwarder,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        is_draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.state = state
        self.forwarder = forwarder
        self.max_body_bytes = max_body_bytes
        self.is_draining = is_draining

    def app(self) -> web.Application:
        # client_max_size is enforced by hand below (a JSON 413 instead of aiohttp's text one)
        app = web.Application(
            client_max_size=self.max_body_bytes + 1, middlewares=[openai_style_routing_errors]
        )
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/health", self.health)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.is_draining():
            return error_response(503, "router is draining")
        return web.json_response({"status": "ok", "models": sorted(self.state.models)})

    async def list_models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tokenyard",
                "replicas": len(view.endpoints),
            }
            for name, view in sorted(self.state.models.items())
        ]
        return web.json_response({"object": "list", "data": data})

    async def _read_body(self, request: web.Request) -> bytes | web.Response:
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return error_response(
                413, f"request body is {request.content_length} bytes; the limit is {self.max_body_bytes}"
            )
        try:
            # read(n) returns what has arrived so far, up to n: a body in several TCP segments needs a loop.
            raw = b""
            while len(raw) <= self.max_body_bytes:
                chunk = await request.content.read(self.max_body_bytes + 1 - len(raw))
                if not chunk:
                    break
                raw += chunk
        except (aiohttp.ClientPayloadError, ConnectionError) as error:
            return error_response(400, f"could not read the request body: {error}")
        if len(raw) > self.max_body_bytes:
            return error_response(413, f"request body exceeds the limit of {self.max_body_bytes} bytes")
        return raw

    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = self.forwarder.clock()
        if self.is_draining():
            return error_response(
                503, "router is draining; retry on another router replica", headers={"Retry-After": "1"}
            )
        raw = await self._read_body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            inference = parse_request(
                request.path,
                raw,
                self.state.settings.default_max_tokens,
                upstream_headers(request.headers),
                ask_usage=self.state.settings.stream_usage,
            )
        except InvalidRequest as error:
            return error_response(400, str(error))
        try:
            async with self.forwarder.exchange(inference, started) as exchange:
                return await self._relay(request, exchange)
        except RoutingError as error:
            retry = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
            return error_response(error.status, error.message, headers=retry)
        except ClientGone as gone:
            # The exchange has recorded the ending (client gone) and released the load. Returned, the started
            # response lets aiohttp close the connection quietly; raised, it would log a traceback per client
            # that hangs up mid-answer.
            return gone.response

    async def _relay(self, request: web.Request, exchange: Exchange) -> web.StreamResponse:
        upstream = exchange.response
        assert upstream is not None
        content_type = upstream.headers.get("Content-Type", "application/json")
        if not exchange.streams:
            try:
                payload = await exchange.read()
            except StreamBroken as error:
                return error_response(UPSTREAM_BROKEN, str(error))
            return web.Response(
                body=payload,
                status=upstream.status,
                content_type=None,
                headers={"Content-Type": content_type, **self._route_headers(exchange)},
            )
        response = web.StreamResponse(
            status=upstream.status,
            headers={
                "Content-Type": content_type,
                "Cache-Control": "no-cache",
                **self._route_headers(exchange),
            },
        )
        await response.prepare(request)
        # The usage event the router asked for on the client's behalf is not the client's to see
        hidden_usage = UsageEventFilter() if exchange.request.hides_usage else None

        async def relay(chunk: bytes) -> None:
            if not chunk:
                return
            try:
                await response.write(chunk)
            except ConnectionResetError as error:
                raise ClientGone(response) from error

        try:
            async for chunk, _ in exchange.stream():
                await relay(hidden_usage.feed(chunk) if hidden_usage is not None else chunk)
            if hidden_usage is not None:
                await relay(hidden_usage.flush())
        except StreamBroken as error:
            # The status line is sent, so the stream itself must say it broke: an error event (as vLLM sends
            # when generation fails mid-stream; OpenAI's clients raise on an event that carries "error") and no
            # `data: [DONE]`. Ended without it, the response reads as a whole answer to most clients. The blank
            # line first closes an event the broken read may have left half-relayed.
            event = json.dumps(error_body(UPSTREAM_BROKEN, str(error))).encode()
            with contextlib.suppress(ConnectionResetError):  # the client may be gone as well
                await response.write(b"\n\ndata: " + event + b"\n\n")
            return response
        await response.write_eof()
        return response

    @staticmethod
    def _route_headers(exchange: Exchange) -> dict[str, str]:
        assert exchange.route is not None
        return {
            "x-tokenyard-replica": exchange.route.endpoint.name,
            "x-tokenyard-revision": exchange.route.revision,
        }
