"""The gRPC front (tokenyard.v1.Router): Generate streams a completion through the same exchange as the HTTP
front (routing, accounting, retries, shadow copies, metrics); PickEndpoint only chooses. Health and reflection
are registered beside it."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tokenyard.router.discovery import Endpoint
from tokenyard.router.exchange import Exchange, StreamBroken
from tokenyard.router.openai_wire import (
    CHAT_COMPLETIONS_PATH,
    COMPLETIONS_PATH,
    InferenceRequest,
    render_chat,
    request_from_body,
)
from tokenyard.router.proxy import Forwarder
from tokenyard.router.state import RoutingError
from tokenyard.v1 import router_pb2, router_pb2_grpc

log = logging.getLogger("tokenyard.router")

STATUS_BY_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
}
SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["Router"].full_name


def _messages(chat: router_pb2.ChatMessages) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in chat.messages]


def openai_body(request: router_pb2.GenerateRequest, default_max_tokens: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of the OpenAI request that serves a GenerateRequest: always streamed, with usage."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "model": request.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": sampling.max_tokens or default_max_tokens,
    }
    if sampling.HasField("temperature"):
        body["temperature"] = sampling.temperature
    if sampling.HasField("top_p"):
        body["top_p"] = sampling.top_p
    if sampling.HasField("seed"):
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if request.WhichOneof("input") == "chat":
        body["messages"] = _messages(request.chat)
        return CHAT_COMPLETIONS_PATH, body
    body["prompt"] = request.prompt
    return COMPLETIONS_PATH, body


def inference_request(
    request: router_pb2.GenerateRequest,
    default_max_tokens: int,
    request_id: str,
    deadline_s: float | None = None,
) -> InferenceRequest:
    path, body = openai_body(request, default_max_tokens)
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
    return request_from_body(path, body, json.dumps(body).encode(), default_max_tokens, headers, deadline_s)


def grpc_status(http_status: int, default: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> grpc.StatusCode:
    return STATUS_BY_HTTP.get(http_status, default)


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, forwarder: Forwarder, is_draining: Callable[[], bool] = lambda: False) -> None:
        self.forwarder = forwarder
        self.is_draining = is_draining

    @property
    def state(self):
        return self.forwarder.state

    async def PickEndpoint(self, request, context):
        if not request.model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model is required")
        chat = request.WhichOneof("input") == "chat"
        messages = tuple(_messages(request.chat)) if chat else None
        choice = InferenceRequest(
            model=request.model,
            path="",  # never forwarded: the gateway sends the request itself
            body=b"",
            prompt=render_chat(messages) if messages is not None else request.prompt,
            expected_output_tokens=request.max_tokens or self.state.settings.default_max_tokens,
            messages=messages,
        )
        try:
            route = self.forwarder.route(choice)
        except RoutingError as error:
            await context.abort(grpc_status(error.status), error.message)
        # The gateway forwards the request itself: the router cannot see it end, so the load it adds is
        # released at once and the engines' own queue/KV reports carry it from there.
        self.state.ledger.close(route.ticket)
        endpoint = route.endpoint
        return router_pb2.PickEndpointResponse(
            endpoint=_endpoint_message(endpoint),
            reason=route.decision.reason,
            prefix_match=route.prefix_match_tokens,
        )

    async def Generate(self, request, context):
        started = self.forwarder.clock()
        if self.is_draining():
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "router is draining; retry on another router replica"
            )
        if not request.model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model is required")
        request_id = request.request_id or uuid.uuid4().hex
        inference = inference_request(
            request, self.state.settings.default_max_tokens, request_id, context.time_remaining()
        )
        failure: tuple[grpc.StatusCode, str] | None = None
        try:
            async with self.forwarder.exchange(inference, started) as exchange:
                assert exchange.response is not None and exchange.route is not None
                endpoint = exchange.route.endpoint
                status = exchange.response.status
                if status != 200:
                    detail = (await exchange.read()).decode("utf-8", "replace")[:500]
                    failure = (
                        grpc_status(status, grpc.StatusCode.INTERNAL),
                        f"replica {endpoint.name} answered {status}: {detail}",
                    )
                else:
                    async with contextlib.aclosing(self._responses(exchange, request_id)) as responses:
                        async for message in responses:
                            yield message
        except RoutingError as error:
            failure = (grpc_status(error.status), error.message)
        except StreamBroken as error:
            failure = (grpc.StatusCode.UNAVAILABLE, str(error))
        if failure is not None:
            await context.abort(*failure)

    @staticmethod
    async def _responses(exchange: Exchange, request_id: str) -> AsyncIterator[router_pb2.GenerateResponse]:
        """The replica's OpenAI stream as GenerateResponses: the first names the replica, then one per event
        that carries text, and a last one with the finish reason and usage."""
        assert exchange.route is not None
        first = True
        finish_reason, usage = "", None
        async for _, events in exchange.stream(decode=True):
            for event in events:
                if event.done:
                    continue
                usage = event.usage or usage
                finish_reason = event.finish_reason or finish_reason
                text = event.text
                if not text and not first:
                    continue
                message = router_pb2.GenerateResponse(text=text, request_id=request_id)
                if first:
                    message.endpoint.CopyFrom(_endpoint_message(exchange.route.endpoint))
                    first = False
                yield message
        last = router_pb2.GenerateResponse(finish_reason=finish_reason or "stop", request_id=request_id)
        if usage:
            cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
            last.usage.CopyFrom(
                router_pb2.Usage(
                    prompt_tokens=usage.get("prompt_tokens", 0),
                    completion_tokens=usage.get("completion_tokens", 0),
                    cached_tokens=cached,
                )
            )
        yield last


def _endpoint_message(endpoint: Endpoint) -> router_pb2.Endpoint:
    return router_pb2.Endpoint(
        address=endpoint.url.split("://", 1)[1], replica=endpoint.name, revision=endpoint.revision
    )


async def start_grpc(
    forwarder: Forwarder, host: str, port: int, is_draining: Callable[[], bool] = lambda: False
) -> tuple[grpc.aio.Server, int, health.HealthServicer]:
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(forwarder, is_draining), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound, health_servicer
