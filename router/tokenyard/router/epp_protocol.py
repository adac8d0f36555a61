"""The Gateway API Inference Extension's endpoint picker protocol, as messages: reading what the gateway sends
and building what the picker answers. Pure (no I/O, no state); ``epp`` runs the exchange.

The protocol (kubernetes-sigs/gateway-api-inference-extension, docs/proposals/004-endpoint-picker-protocol,
as of tag v1.6.0) is Envoy's external processing service (``envoy.service.ext_proc.v3.ExternalProcessor``):
one bidirectional stream per HTTP request. What it fixes, and where this module follows it:

- the picked endpoints go to the gateway twice, with the same value: the request header
  ``x-gateway-destination-endpoint`` and the dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint``;
  the value is ``ip:port`` or an ordered list ``ip:port,ip:port,...``, the first the primary and the others
  fallbacks the gateway tries in order when one fails (``destination_response``);
- the gateway may restrict the choice with a subset hint, ``metadata_context`` ``envoy.lb.subset_hint`` /
  ``x-gateway-destination-endpoint-subset`` (a list of ``ip:port``); an empty or unservable subset is a 503
  (``subset_hint``);
- the gateway reports the endpoint that served in the response's ``metadata_context``, ``envoy.lb`` /
  ``x-gateway-destination-endpoint-served`` (``served_endpoint``);
- when no endpoint can serve, the answer is an ``ImmediateResponse``: 503 when none is ready, 429 when the
  request is shed under load (``immediate``);
- bodies travel in the ``FULL_DUPLEX_STREAMED`` mode (request and response), with trailers ``SEND``: the
  picker may hold the request body until its end, then answers the headers and streams the body back in
  ``StreamedBodyResponse`` chunks of at most 62,000 bytes (the reference picker's margin under Envoy's 64 KiB),
  and passes each response chunk back as it comes (``body_responses``).

The message types come from the ``xds-protos`` package (Envoy's data-plane API, generated).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION_KEY = "x-gateway-destination-endpoint"  # the request header and the metadata key alike
LB_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
BODY_CHUNK_BYTES = 62_000
REQUIRED_BODY_MODE = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
SERVICE_NAME = ext_proc.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name


def endpoint_address(url: str) -> str:
    """The ``ip:port`` the protocol names an endpoint by, from a replica's ``http://host:port`` URL."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"replica URL {url!r} has no host:port")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def ranked_fallbacks(scores: Mapping[str, float], chosen: str, count: int) -> list[str]:
    """The ``count`` best-scored candidates other than ``chosen``, best first (ties by name, for a stable
    list). The scores are the pipeline's over the candidates its filters kept, so a fallback has passed the
    same filters as the primary (health, saturation, the revision the canary split drew)."""
    others = sorted((name for name in scores if name != chosen), key=lambda name: (-scores[name], name))
    return others[: max(0, count)]


def headers_of(message: ext_proc.HttpHeaders) -> dict[str, str]:
    """An HttpHeaders message as a dict with lower-case names (Envoy sends ``raw_value``; ``value`` is the
    older field). A repeated header keeps its last value."""
    headers = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("utf-8", "replace") if header.raw_value else header.value
        headers[header.key.lower()] = value
    return headers


def _metadata_field(metadata: base_pb2.Metadata, namespace: str, key: str) -> struct_pb2.Value | None:
    if namespace not in metadata.filter_metadata:
        return None
    fields = metadata.filter_metadata[namespace].fields
    return fields[key] if key in fields else None


def subset_hint(metadata: base_pb2.Metadata) -> list[str] | None:
    """The endpoints the gateway lets the picker choose from, or None when it sets no hint."""
    value = _metadata_field(metadata, SUBSET_NAMESPACE, SUBSET_KEY)
    if value is None:
        return None
    if value.HasField("list_value"):
        return [item.string_value for item in value.list_value.values if item.string_value]
    if value.HasField("string_value"):  # tolerated: one comma-separated string
        return [item.strip() for item in value.string_value.split(",") if item.strip()]
    return []


def served_endpoint(metadata: base_pb2.Metadata) -> str | None:
    value = _metadata_field(metadata, LB_NAMESPACE, SERVED_KEY)
    return value.string_value or None if value is not None else None


def body_mode_problem(config: ext_proc.ProtocolConfiguration) -> str | None:
    """What is wrong with the gateway's body modes (sent in its first message, by gateways that send it), or
    None. The picker needs the request body (to read the model and the prompt) and answers in the
    full-duplex style, which only ``FULL_DUPLEX_STREAMED`` accepts."""
    mode_name = processing_mode_pb2.ProcessingMode.BodySendMode.Name
    wrong = [
        f"{field} is {mode_name(getattr(config, field))}"
        for field in ("request_body_mode", "response_body_mode")
        if getattr(config, field) != REQUIRED_BODY_MODE
    ]
    if not wrong:
        return None
    return (
        "the gateway's ext_proc filter must use processing_mode request_body_mode and response_body_mode "
        f"FULL_DUPLEX_STREAMED (with trailer modes SEND); its {' and '.join(wrong)}"
    )


def _set_headers(headers: Mapping[str, str]) -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()))
        for key, value in headers.items()
    ]


def destination_response(
    endpoints: Sequence[str], body_bytes: int | None, extra_headers: Mapping[str, str] | None = None
) -> ext_proc.ProcessingResponse:
    """The answer to the request headers: the picked endpoints (primary first) as the header and as the
    ``envoy.lb`` dynamic metadata, with the same value; the route cache cleared so that the gateway routes on
    the header. ``body_bytes``: the body's length (the gateway drops Content-Length in this mode)."""
    value = ",".join(endpoints)
    headers = {DESTINATION_KEY: value, **(extra_headers or {})}
    if body_bytes:
        headers["content-length"] = str(body_bytes)
    metadata = struct_pb2.Struct()
    metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_KEY] = value
    return ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(
                clear_route_cache=True,
                header_mutation=ext_proc.HeaderMutation(set_headers=_set_headers(headers)),
            )
        ),
        dynamic_metadata=metadata,
    )


def response_headers_response(extra_headers: Mapping[str, str] | None = None) -> ext_proc.ProcessingResponse:
    mutation = ext_proc.HeaderMutation(set_headers=_set_headers(extra_headers or {}))
    return ext_proc.ProcessingResponse(
        response_headers=ext_proc.HeadersResponse(response=ext_proc.CommonResponse(header_mutation=mutation))
    )


def body_responses(body: bytes, end_of_stream: bool, phase: str) -> list[ext_proc.ProcessingResponse]:
    """``body`` handed back in ``StreamedBodyResponse`` chunks of at most BODY_CHUNK_BYTES, the last one
    carrying ``end_of_stream``; ``phase`` is "request_body" or "response_body". An empty body is one empty
    chunk (it may still end the stream)."""
    if phase not in ("request_body", "response_body"):
        raise ValueError(f"phase must be request_body or response_body, got {phase!r}")
    pieces = [body[i : i + BODY_CHUNK_BYTES] for i in range(0, len(body), BODY_CHUNK_BYTES)] or [b""]
    responses = []
    for number, piece in enumerate(pieces, 1):
        streamed = ext_proc.StreamedBodyResponse(
            body=piece, end_of_stream=end_of_stream and number == len(pieces)
        )
        common = ext_proc.CommonResponse(body_mutation=ext_proc.BodyMutation(streamed_response=streamed))
        responses.append(ext_proc.ProcessingResponse(**{phase: ext_proc.BodyResponse(response=common)}))
    return responses


def trailers_response(phase: str) -> ext_proc.ProcessingResponse:
    """The answer to trailers; ``phase`` is "request_trailers" or "response_trailers"."""
    return ext_proc.ProcessingResponse(**{phase: ext_proc.TrailersResponse()})


def immediate(
    status: int, body: Mapping, headers: Mapping[str, str] | None = None, details: str = ""
) -> ext_proc.ProcessingResponse:
    """The gateway answers the client itself with ``status`` and this JSON body (the picker found no endpoint,
    or the request is not servable)."""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ext_proc.HeaderMutation(
                set_headers=_set_headers({"content-type": "application/json", **(headers or {})})
            ),
            body=json.dumps(body).encode(),
            details=details,
        )
    )
