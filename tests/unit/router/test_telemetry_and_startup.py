import random

import pytest
from tokenyard.router.__main__ import main
from tokenyard.router.discovery import Endpoint, ModelView, Shadow, models_from_cluster
from tokenyard.router.prefix import hash_prompt
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import REPLICA_COUNTER_GRACE_SECONDS, RouterMetrics
from tokenyard.router.tokenizing import TokenizerCache, TokenizerUnavailable, load_tokenizer

from .test_discovery import deployment, pod

PROMPT = "You answer questions about invoices, carefully and briefly. " * 30


def series(metrics: RouterMetrics, name: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    ]


def replicas_in(metrics: RouterMetrics, name: str) -> set[str]:
    return {labels.get("replica", "") for labels in series(metrics, name)}


def test_a_replica_that_leaves_takes_its_gauges_at_once_and_its_counters_after_the_grace():
    metrics = RouterMetrics()
    for replica in ("a", "b"):
        metrics.requests.labels("ns", "m", "v1", replica, "200").inc()
        metrics.errors.labels("ns", "m", "v1", replica, "503").inc()
        metrics.retries.labels("m", replica).inc()
        metrics.outstanding_tokens.labels(replica).set(5)
        metrics.replica_healthy.labels(replica, "v1").set(1)
    metrics.requests.labels("", "", "", "", "404").inc()  # no replica chosen: not a replica's series
    metrics.forget_replica("a", now=100.0)
    assert replicas_in(metrics, "tokenyard_router_outstanding_tokens") == {"b"}
    # Its last errors may not have been scraped yet: the counters stay for the grace period.
    assert replicas_in(metrics, "tokenyard_router_errors_total") == {"a", "b"}
    metrics.retain_replicas({"b"}, now=100.0 + REPLICA_COUNTER_GRACE_SECONDS - 1)
    assert replicas_in(metrics, "tokenyard_router_requests_total") == {"a", "b", ""}
    metrics.retain_replicas({"b"}, now=100.0 + REPLICA_COUNTER_GRACE_SECONDS)
    assert replicas_in(metrics, "tokenyard_router_requests_total") == {"b", ""}
    assert replicas_in(metrics, "tokenyard_router_retries_total") == {"b"}
    # The level-based sweep catches a replica whose series came back after it left, gauges first.
    metrics.retain_replicas(set(), now=1000.0)
    assert series(metrics, "tokenyard_router_replica_healthy") == []
    assert replicas_in(metrics, "tokenyard_router_requests_total") == {"b", ""}
    metrics.retain_replicas(set(), now=1000.0 + REPLICA_COUNTER_GRACE_SECONDS)
    assert replicas_in(metrics, "tokenyard_router_requests_total") == {""}


def test_every_known_label_set_has_its_event_counters_at_zero_before_the_first_event():
    metrics = RouterMetrics()
    views = [
        ModelView(
            "m",
            endpoints=(Endpoint("a", "http://127.0.0.1:1", "v1"), Endpoint("b", "http://127.0.0.1:2", "v2")),
            shadow=Shadow("v2", 0.1),
            namespace="ns",
        )
    ]
    metrics.declare(views)

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels)

    for replica, revision in (("a", "v1"), ("b", "v2")):
        assert sample("tokenyard_router_ejections_total", replica=replica) == 0
        assert sample("tokenyard_router_retries_total", model="m", replica=replica) == 0
        errors = dict(namespace="ns", model="m", revision=revision, replica=replica, code="502")
        assert sample("tokenyard_router_errors_total", **errors) == 0
    shadow = dict(namespace="ns", model="m", revision="v2")
    for outcome in ("ok", "error", "dropped", "abandoned"):
        assert sample("tokenyard_router_shadow_requests_total", **shadow, outcome=outcome) == 0
    for outcome in ("both_ok", "shadow_only_error", "primary_only_error", "both_error"):
        assert sample("tokenyard_router_shadow_pairs_total", **shadow, outcome=outcome) == 0
    # The mismatch ratio's numerator exists at 0: the panel reads 0, not "No data", while outputs agree.
    assert sample("tokenyard_router_shadow_output_match_total", **shadow, match="false") == 0
    # Declaring on every export never resets what was counted.
    metrics.retries.labels("m", "a").inc()
    metrics.declare(views)
    assert sample("tokenyard_router_retries_total", model="m", replica="a") == 1
    # A replica that leaves takes its declared counters with it after the grace, like counted ones.
    metrics.retain_replicas({"b"}, now=0.0)
    metrics.retain_replicas({"b"}, now=REPLICA_COUNTER_GRACE_SECONDS)
    assert sample("tokenyard_router_ejections_total", replica="a") is None


def test_a_replica_that_comes_back_within_the_grace_keeps_its_counters():
    metrics = RouterMetrics()
    metrics.requests.labels("ns", "m", "v1", "a", "200").inc(7)
    metrics.forget_replica("a", now=0.0)
    metrics.retain_replicas({"a"}, now=10.0)  # back (readiness flapped)
    metrics.retain_replicas({"a"}, now=10.0 + REPLICA_COUNTER_GRACE_SECONDS)
    assert [
        s.value
        for f in metrics.registry.collect()
        for s in f.samples
        if s.name == "tokenyard_router_requests_total"
    ] == [7.0]


def test_namespace_comes_from_the_model_deployment_and_routes_carry_it():
    dep = deployment()
    dep["metadata"]["namespace"] = "team-a"
    views = models_from_cluster([pod("a-0")], [dep])
    assert views["llama"].namespace == "team-a"
    state = RouterState(rng=random.Random(0))
    state.set_models(views)
    assert state.route("llama", "hi", 4, now=0).namespace == "team-a"
    assert state.namespace_of("llama") == "team-a" and state.namespace_of("unknown") == ""


def test_spec_routing_tokenizer_picks_token_blocks_and_unloadable_ones_fall_back():
    dep = deployment()
    dep["spec"]["routing"] = {"tokenizer": "sim"}
    assert models_from_cluster([pod("a-0")], [dep])["llama"].tokenizer == "sim"
    state = RouterState(rng=random.Random(0))
    endpoints = (Endpoint("a", "http://a"),)
    state.set_models({"tok": ModelView("tok", endpoints, tokenizer="sim:200000")})
    by_tokens = state.route("tok", PROMPT, 4, now=0)
    assert by_tokens.prompt_tokens == len(load_tokenizer("sim:200000")(PROMPT))
    state.set_models({"tok": ModelView("tok", endpoints, tokenizer="meta-llama/Llama-3.1-8B")})
    by_chars = state.route("tok", PROMPT, 4, now=1)
    assert by_chars.prompt_tokens == hash_prompt(PROMPT).prompt_tokens != by_tokens.prompt_tokens


def test_tokenizer_specs_that_need_a_download_are_refused_once():
    calls = []

    def loader(spec):
        calls.append(spec)
        raise TokenizerUnavailable(spec)

    cache = TokenizerCache(loader)
    assert cache.get("org/model") is None and cache.get("org/model") is None and cache.get(None) is None
    assert calls == ["org/model"]
    with pytest.raises(TokenizerUnavailable, match="downloads nothing"):
        load_tokenizer("meta-llama/Llama-3.1-8B")
    with pytest.raises(TokenizerUnavailable, match="vocab_size"):
        load_tokenizer("sim:3")


def test_an_unreadable_kubeconfig_stops_the_router_with_a_message_naming_it(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["--kubeconfig", str(missing)]) == 1
    assert f"kubeconfig {missing} cannot be loaded: no such file" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("clusters: [\n")
    assert main(["--kubeconfig", str(broken)]) == 1
    err = capsys.readouterr().err.strip()
    assert f"kubeconfig {broken} cannot be loaded" in err and "\n" not in err


def test_an_unreachable_api_server_stops_the_router(tmp_path, capsys):
    import socket

    with socket.socket() as sock:  # a port nobody listens on: the connection is refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: ns}}}}]
current-context: x
"""
    )
    assert main(["--kubeconfig", str(kubeconfig), "--port", "0", "--metrics-port", "0"]) == 1
    err = capsys.readouterr().err
    assert f"Kubernetes API server at https://127.0.0.1:{port}" in err and "unreachable" in err


@pytest.fixture
def without_uvloop(monkeypatch):
    """Imports of uvloop fail, as on a machine where it is not installed."""
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_event_loop_choice_prefers_uvloop():
    import uvloop
    from tokenyard.router.__main__ import loop_factory

    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("asyncio") is None


def test_without_uvloop_auto_falls_back_and_an_explicit_choice_is_a_usage_error(without_uvloop, capsys):
    from tokenyard.router.__main__ import loop_factory

    assert loop_factory("auto") is None  # asyncio's own loop: the router still starts
    assert main(["--backend", "http://127.0.0.1:9", "--event-loop", "uvloop"]) == 2
    assert "--event-loop uvloop: the 'uvloop' package is not installed" in capsys.readouterr().err


def test_a_router_without_redis_says_so_rather_than_reading_as_redis_down():
    metrics = RouterMetrics()
    assert metrics.registry.get_sample_value("tokenyard_router_redis_configured") == 0
    assert metrics.registry.get_sample_value("tokenyard_router_redis_up") == 0
