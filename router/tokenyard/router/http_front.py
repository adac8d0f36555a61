"""The OpenAI-compatible HTTP front (aiohttp): completions and chat completions streamed through chunk by
chunk, /v1/models, /health; errors as OpenAI-style JSON bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from tokenyard.router.proxy import Forwarder, UpstreamCall, upstream_headers
from tokenyard.router.shadowpair import is_greedy
from tokenyard.router.state import RouterState, RoutingError, max_tokens_of, prompt_of

log = logging.getLogger("tokenyard.router")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
CLIENT_GONE = 499  # nginx's code for "client closed request"
UPSTREAM_BROKEN = 502


def error_response(status: int, message: str, kind: str | None = None, headers: dict[str, str] | None = None):
    kind = kind or {
        400: "invalid_request_error",
        404: "model_not_found",
        413: "request_too_large",
        429: "rate_limit_exceeded",
    }.get(status, "server_error")
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status, headers=headers)


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
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def app(self) -> web.Application:
        # client_max_size is enforced by hand below (a JSON 413 instead of aiohttp's text one)
        app = web.Application(client_max_size=self.max_body_bytes + 1)
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

    async def _read_json(self, request: web.Request) -> tuple[bytes, dict[str, Any]] | web.Response:
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
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return error_response(400, f"request body is not valid JSON: {error}")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        return raw, body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        started = self.forwarder.clock()
        if self.is_draining():
            return error_response(
                503, "router is draining; retry on another router replica", headers={"Retry-After": "1"}
            )
        parsed = await self._read_json(request)
        if isinstance(parsed, web.Response):
            return parsed
        raw, body = parsed
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return error_response(400, "'model' is required and must be a string")
        try:
            prompt = prompt_of(body)
        except ValueError as error:
            return error_response(400, str(error))
        max_tokens = max_tokens_of(body, self.state.settings.default_max_tokens)
        headers = upstream_headers(request.headers)
        self.in_flight += 1
        self.idle.clear()
        self.forwarder.metrics.in_flight.inc()
        try:
            try:
                call = await self.forwarder.open(
                    model, request.path, raw, prompt, max_tokens, headers, started
                )
            except RoutingError as error:
                self.forwarder.count_rejected(model, error)
                retry = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s else None
                return error_response(error.status, error.message, headers=retry)
            self.forwarder.maybe_shadow(call, request.path, raw, prompt, max_tokens, is_greedy(body))
            return await self._relay(request, call)
        finally:
            self.in_flight -= 1
            self.forwarder.metrics.in_flight.dec()
            if self.in_flight == 0:
                self.idle.set()

    async def _relay(self, request: web.Request, call: UpstreamCall) -> web.StreamResponse:
        upstream = call.response
        code: int = upstream.status
        try:
            content_type = upstream.headers.get("Content-Type", "application/json")
            if not content_type.startswith("text/event-stream"):
                payload = await upstream.read()
                self.forwarder.on_chunk(call, payload, final=True)  # the ticket closes in finish()
                return web.Response(
                    body=payload,
                    status=upstream.status,
                    content_type=None,
                    headers={"Content-Type": content_type, **self._route_headers(call)},
                )
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    "Content-Type": content_type,
                    "Cache-Control": "no-cache",
                    **self._route_headers(call),
                },
            )
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    self.forwarder.on_chunk(call, chunk)
                    await response.write(chunk)
            except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as error:
                code = UPSTREAM_BROKEN
                log.warning("stream from replica %s broke: %r", call.route.endpoint.name, error)
                self.state.record_failure(call.route.endpoint.name, self.forwarder.clock())
                return response
            await response.write_eof()
            return response
        except (ConnectionResetError, asyncio.CancelledError):
            code = CLIENT_GONE  # the client went away: finishing closes the upstream request too
            raise
        finally:
            self.forwarder.finish(call, code)

    @staticmethod
    def _route_headers(call: UpstreamCall) -> dict[str, str]:
        return {"x-tokenyard-replica": call.route.endpoint.name, "x-tokenyard-revision": call.route.revision}
