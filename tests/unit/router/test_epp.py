"""The endpoint picker's messages (``epp_protocol``) and one Process stream's state (``epp.PickerStream``)
driven message by message, on the router's real state, ledger and metrics (no sockets: the gateway's side is
the test, and nothing is forwarded)."""

from __future__ import annotations

import json

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2
from tokenyard.router import epp_protocol as wire
from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.epp import EndpointPicker, PickerStream
from tokenyard.router.proxy import Forwarder
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

MODEL = "m"
MODES = processing_mode_pb2.ProcessingMode


# --- the messages ---------------------------------------------------------------------------------------


def test_endpoint_address_is_ip_port():
    assert wire.endpoint_address("http://127.0.0.7:8000") == "127.0.0.7:8000"
    assert wire.endpoint_address("http://[::1]:8000") == "[::1]:8000"
    with pytest.raises(ValueError, match="no host:port"):
        wire.endpoint_address("http://127.0.0.7")


def test_fallbacks_are_the_next_best_scores_in_order():
    scores = {"a": 0.2, "b": 0.9, "c": 0.5, "d": 0.5}
    assert wire.ranked_fallbacks(scores, "b", 2) == ["c", "d"]  # ties by name
    assert wire.ranked_fallbacks(scores, "b", 10) == ["c", "d", "a"]
    assert wire.ranked_fallbacks(scores, "b", 0) == []
    assert wire.ranked_fallbacks({"b": 1.0}, "b", 1) == []


def test_destination_goes_in_the_header_and_the_metadata_alike():
    response = wire.destination_response(["127.0.0.1:1", "127.0.0.2:2"], 42)
    common = response.request_headers.response
    headers = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    assert headers == {wire.DESTINATION_KEY: "127.0.0.1:1,127.0.0.2:2", "content-length": "42"}
    assert common.clear_route_cache
    metadata = response.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
    assert metadata[wire.DESTINATION_KEY].string_value == "127.0.0.1:1,127.0.0.2:2"


def test_bodies_go_back_in_streamed_chunks_under_the_limit():
    body = bytes(range(256)) * 500  # 128,000 bytes
    responses = wire.body_responses(body, True, "response_body")
    chunks = [r.response_body.response.body_mutation.streamed_response for r in responses]
    assert [len(c.body) for c in chunks] == [62_000, 62_000, 4_000]
    assert b"".join(c.body for c in chunks) == body
    assert [c.end_of_stream for c in chunks] == [False, False, True]
    (empty,) = wire.body_responses(b"", True, "request_body")
    assert empty.request_body.response.body_mutation.streamed_response.end_of_stream
    with pytest.raises(ValueError, match="phase"):
        wire.body_responses(b"x", True, "trailers")


def lb_metadata(namespace: str, key: str, value) -> base_pb2.Metadata:
    metadata = base_pb2.Metadata()
    fields = struct_pb2.Struct()
    fields.update({key: value})
    metadata.filter_metadata[namespace].CopyFrom(fields)
    return metadata


def test_subset_hint_and_served_endpoint_are_read_from_the_metadata():
    assert wire.subset_hint(base_pb2.Metadata()) is None
    hint = lb_metadata(wire.SUBSET_NAMESPACE, wire.SUBSET_KEY, ["127.0.0.1:1", "127.0.0.2:2"])
    assert wire.subset_hint(hint) == ["127.0.0.1:1", "127.0.0.2:2"]
    assert wire.subset_hint(lb_metadata(wire.SUBSET_NAMESPACE, wire.SUBSET_KEY, [])) == []
    served = lb_metadata(wire.LB_NAMESPACE, wire.SERVED_KEY, "127.0.0.2:2")
    assert wire.served_endpoint(served) == "127.0.0.2:2"
    assert wire.served_endpoint(base_pb2.Metadata()) is None


def test_only_full_duplex_body_modes_are_accepted():
    good = ext_proc.ProtocolConfiguration(
        request_body_mode=MODES.FULL_DUPLEX_STREAMED, response_body_mode=MODES.FULL_DUPLEX_STREAMED
    )
    assert wire.body_mode_problem(good) is None
    bad = ext_proc.ProtocolConfiguration(
        request_body_mode=MODES.BUFFERED, response_body_mode=MODES.FULL_DUPLEX_STREAMED
    )
    problem = wire.body_mode_problem(bad)
    assert "request_body_mode is BUFFERED" in problem and "response_body_mode" not in problem.split("its")[1]


# --- one stream ------------------------------------------------------------------------------------------


class Gateway:
    """The gateway's side of one Process stream, message by message."""

    def __init__(self, replicas: int = 2, fallbacks: int = 1, draining: bool = False, max_body: int = 10_000):
        self.now = 0.0
        self.state = RouterState()
        self.endpoints = [Endpoint(f"r{i}", f"http://127.0.0.{i + 1}:8000") for i in range(replicas)]
        self.state.set_models({MODEL: ModelView(MODEL, tuple(self.endpoints))})
        self.metrics = RouterMetrics()
        self.forwarder = Forwarder(self.state, self.metrics, session=None, clock=lambda: self.now)
        self.picker = EndpointPicker(self.forwarder, fallbacks, max_body, lambda: draining)
        self.stream = PickerStream(self.picker)

    def send(self, **message) -> list[ext_proc.ProcessingResponse]:
        return self.stream.handle(ext_proc.ProcessingRequest(**message))

    def request(self, body: bytes, pieces: int = 1, metadata=None, config=None) -> list:
        headers = ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
                    base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions"),
                    base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
                ]
            )
        )
        extra = {"metadata_context": metadata} if metadata is not None else {}
        if config is not None:
            extra["protocol_config"] = config
        out = self.send(request_headers=headers, **extra)
        size = -(-len(body) // pieces)
        for start in range(0, len(body), size):
            last = start + size >= len(body)
            out += self.send(
                request_body=ext_proc.HttpBody(body=body[start : start + size], end_of_stream=last)
            )
        return out

    def answered(self, status: int = 200, served: str | None = None, stream: bool = True) -> list:
        content_type = b"text/event-stream" if stream else b"application/json"
        headers = ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=":status", raw_value=str(status).encode()),
                    base_pb2.HeaderValue(key="content-type", raw_value=content_type),
                ]
            )
        )
        metadata = lb_metadata(wire.LB_NAMESPACE, wire.SERVED_KEY, served) if served else None
        extra = {"metadata_context": metadata} if metadata is not None else {}
        return self.send(response_headers=headers, **extra)

    def chunk(self, data: bytes, end: bool = False) -> list:
        return self.send(response_body=ext_proc.HttpBody(body=data, end_of_stream=end))

    def answers(self, replica: str, code: str) -> float:
        labels = {"namespace": "", "model": MODEL, "revision": "", "replica": replica, "code": code}
        return self.metrics.registry.get_sample_value("tokenyard_router_requests_total", labels) or 0.0


def completion(max_tokens: int = 50) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "once upon a time " * 20, "max_tokens": max_tokens}).encode()


def sse(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


def picked(responses) -> list[str]:
    (first,) = [r for r in responses if r.WhichOneof("response") == "request_headers"]
    return (
        first.dynamic_metadata.fields[wire.LB_NAMESPACE]
        .struct_value.fields[wire.DESTINATION_KEY]
        .string_value.split(",")
    )


def test_the_body_is_held_until_its_end_then_the_pick_and_the_body_go_back():
    gateway = Gateway()
    body = completion()
    head = gateway.send(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=":path", raw_value=b"/v1/completions")]
            )
        )
    )
    assert head == []  # nothing before the body's end
    assert gateway.send(request_body=ext_proc.HttpBody(body=body[:10])) == []
    responses = gateway.send(request_body=ext_proc.HttpBody(body=body[10:], end_of_stream=True))
    kinds = [r.WhichOneof("response") for r in responses]
    assert kinds == ["request_headers", "request_body"]  # headers first, then the body: full duplex order
    streamed = responses[1].request_body.response.body_mutation.streamed_response
    assert streamed.body == body and streamed.end_of_stream
    primary, fallback = picked(responses)
    assert {primary, fallback} == {"127.0.0.1:8000", "127.0.0.2:8000"}
    (ticket_holder,) = gateway.state.ledger.snapshot()
    assert wire.endpoint_address(next(e.url for e in gateway.endpoints if e.name == ticket_holder)) == primary


def test_the_response_releases_tokens_as_they_stream_and_the_rest_at_its_end():
    gateway = Gateway()
    gateway.request(completion(max_tokens=50), pieces=3)
    (replica,) = gateway.state.ledger.snapshot()
    before = gateway.state.ledger.load(replica).tokens
    headers = gateway.answered(200)
    mutation = headers[0].response_headers.response.header_mutation.set_headers
    assert {h.header.key: h.header.raw_value.decode() for h in mutation}["x-tokenyard-replica"] == replica
    echoed = gateway.chunk(sse("a") + sse("b") + sse("c"))
    assert echoed[0].response_body.response.body_mutation.streamed_response.body == sse("a") + sse("b") + sse(
        "c"
    )
    during = gateway.state.ledger.load(replica).tokens
    assert during <= before - 3  # the prefill and three decode tokens are released
    gateway.chunk(b"data: [DONE]\n\n", end=True)
    assert gateway.state.ledger.snapshot() == {} and gateway.forwarder.in_flight == 0
    assert gateway.answers(replica, "200") == 1


def test_a_fallback_that_served_takes_the_ticket_and_the_primary_a_failure():
    gateway = Gateway()
    primary, fallback = picked(gateway.request(completion()))
    names = {wire.endpoint_address(e.url): e.name for e in gateway.endpoints}
    gateway.answered(200, served=fallback)
    assert gateway.state.ledger.load(names[fallback]).requests == 1
    assert gateway.state.ledger.load(names[primary]).requests == 0
    assert gateway.state.failures._states[names[primary]].consecutive == 1
    gateway.chunk(sse("x"), end=True)
    assert gateway.state.ledger.snapshot() == {}
    assert gateway.answers(names[fallback], "200") == 1


def test_a_stream_the_gateway_drops_releases_the_request():
    gateway = Gateway()
    gateway.request(completion())
    (replica,) = gateway.state.ledger.snapshot()
    gateway.answered(200)
    gateway.chunk(sse("x"))
    gateway.stream.close()  # the gateway ended the stream before the response's end
    assert gateway.state.ledger.snapshot() == {} and gateway.forwarder.in_flight == 0
    assert gateway.answers(replica, "499") == 1
    gateway.stream.close()  # closing again changes nothing
    assert gateway.answers(replica, "499") == 1


def immediate_status(responses) -> tuple[int, str]:
    (response,) = responses
    immediate = response.immediate_response
    return immediate.status.code, json.loads(immediate.body)["error"]["message"]


def test_what_cannot_be_served_gets_an_immediate_response():
    unknown = json.dumps({"model": "other", "prompt": "x"}).encode()
    status, message = immediate_status(Gateway().request(unknown))
    assert status == 404 and "'other'" in message
    status, message = immediate_status(Gateway().request(b"{oops"))
    assert status == 400 and "not valid JSON" in message
    status, message = immediate_status(Gateway(max_body=100).request(completion(), pieces=4))
    assert status == 413
    nobody = lb_metadata(wire.SUBSET_NAMESPACE, wire.SUBSET_KEY, ["127.0.0.99:8000"])
    status, message = immediate_status(Gateway().request(completion(), metadata=nobody))
    assert status == 503 and "subset" in message
    status, message = immediate_status(Gateway(draining=True).request(completion()))
    assert status == 503 and "draining" in message
    buffered = ext_proc.ProtocolConfiguration(
        request_body_mode=MODES.BUFFERED, response_body_mode=MODES.FULL_DUPLEX_STREAMED
    )
    status, message = immediate_status(Gateway().request(completion(), config=buffered)[:1])
    assert status == 500 and "FULL_DUPLEX_STREAMED" in message


def test_a_subset_hint_is_honoured():
    gateway = Gateway(replicas=3)
    hint = lb_metadata(wire.SUBSET_NAMESPACE, wire.SUBSET_KEY, ["127.0.0.3:8000"])
    assert picked(gateway.request(completion(), metadata=hint)) == [
        "127.0.0.3:8000"
    ]  # no fallback outside it


def test_the_epp_port_is_off_by_default_and_checked():
    from tokenyard.router.__main__ import build_parser, options_from_args
    from tokenyard.router.discovery import ConfigError

    parser = build_parser()
    backend = ["--backend", "http://127.0.0.1:8000"]
    assert options_from_args(parser.parse_args(backend)).epp_port is None
    options = options_from_args(parser.parse_args([*backend, "--epp-port", "9002", "--epp-fallbacks", "2"]))
    assert (options.epp_port, options.epp_fallbacks) == (9002, 2)
    with pytest.raises(ConfigError, match="--epp-port 70000"):
        options_from_args(parser.parse_args([*backend, "--epp-port", "70000"]))
    with pytest.raises(ConfigError, match="--epp-fallbacks -1"):
        options_from_args(parser.parse_args([*backend, "--epp-fallbacks", "-1"]))
