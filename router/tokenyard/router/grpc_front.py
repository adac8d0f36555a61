"""The gRPC front (tokenyard.v1.Router): Generate streams a completion through the same routing and
accounting as the HTTP front; PickEndpoint only chooses. Health and reflection are registered beside it."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tokenyard.router.proxy import Forwarder
from tokenyard.router.shadowpair import is_greedy
from tokenyard.router.state import RoutingError, render_chat
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


def openai_body(
    request: router_pb2.GenerateRequest, default_max_tokens: int
) -> tuple[str, dict[str, Any], str]:
    """(path, body, prompt text) of the OpenAI request that serves a GenerateRequest."""
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
        return "/v1/chat/completions", body, render_chat(body["messages"])
    body["prompt"] = request.prompt
    return "/v1/completions", body, request.prompt


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder

    @property
    def state(self):
        return self.forwarder.state

    async def PickEndpoint(self, request, context):
        if not request.model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model is required")
        prompt = (
            render_chat(_messages(request.chat)) if request.WhichOneof("input") == "chat" else request.prompt
        )
        max_tokens = request.max_tokens or self.state.settings.default_max_tokens
        try:
            route = self.forwarder._route(request.model, prompt, max_tokens, [], False)
        except RoutingError as error:
            await context.abort(STATUS_BY_HTTP.get(error.status, grpc.StatusCode.UNAVAILABLE), error.message)
        # The gateway forwards the request itself: the router cannot see it end, so the load it adds is
        # released at once and the engines' own queue/KV reports carry it from there.
        self.state.ledger.close(route.ticket)
        endpoint = route.endpoint
        return router_pb2.PickEndpointResponse(
            endpoint=router_pb2.Endpoint(
                address=endpoint.url.split("://", 1)[1], replica=endpoint.name, revision=endpoint.revision
            ),
            reason=route.decision.reason,
            prefix_match=route.prefix_match_tokens,
        )

    async def Generate(self, request, context):
        if not request.model:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "model is required")
        request_id = request.request_id or uuid.uuid4().hex
        path, body, prompt = openai_body(request, self.state.settings.default_max_tokens)
        raw = json.dumps(body).encode()
        try:
            call = await self.forwarder.open(
                request.model,
                path,
                raw,
                prompt,
                body["max_tokens"],
                {"Content-Type": "application/json", "X-Request-Id": request_id},
            )
        except RoutingError as error:
            self.forwarder.count_rejected(request.model, error)
            await context.abort(STATUS_BY_HTTP.get(error.status, grpc.StatusCode.UNAVAILABLE), error.message)
        self.forwarder.maybe_shadow(call, path, raw, prompt, body["max_tokens"], is_greedy(body))
        code: int = call.response.status
        endpoint = call.route.endpoint
        first = True
        try:
            if call.response.status != 200:
                detail = (await call.response.text())[:500]
                await context.abort(
                    STATUS_BY_HTTP.get(call.response.status, grpc.StatusCode.INTERNAL),
                    f"replica {endpoint.name} answered {call.response.status}: {detail}",
                )
            finish_reason, usage = "", None
            async for line in call.response.content:
                self.forwarder.on_chunk(call, line)
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue
                data = text[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"]
                delta = ""
                for choice in event.get("choices") or ():
                    delta += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    finish_reason = choice.get("finish_reason") or finish_reason
                if not delta and not first:
                    continue
                message = router_pb2.GenerateResponse(text=delta, request_id=request_id)
                if first:
                    message.endpoint.CopyFrom(
                        router_pb2.Endpoint(
                            address=endpoint.url.split("://", 1)[1],
                            replica=endpoint.name,
                            revision=endpoint.revision,
                        )
                    )
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
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ValueError) as error:
            code = 502
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"stream from replica {endpoint.name} broke: {error!r}"
            )
        except BaseException:
            code = 499 if code == 200 else code
            raise
        finally:
            self.forwarder.finish(call, code)


async def start_grpc(
    forwarder: Forwarder, host: str, port: int
) -> tuple[grpc.aio.Server, int, health.HealthServicer]:
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(forwarder), server)
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
