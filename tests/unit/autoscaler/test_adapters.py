"""The autoscaler's adapters without servers: PromQL building, response parsing, spec mapping, and the
controller's pass against in-memory fakes of the Kubernetes API and Prometheus."""

import asyncio
import copy
import math
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from prometheus_client import generate_latest
from tokenyard.autoscaler.controller import (
    AutoscalerController,
    AutoscalerMetrics,
    LeaseElector,
    decision_conditions,
    effective_panic_window,
    policy_config_from_spec,
    target_counts,
    without_stale_values,
)
from tokenyard.autoscaler.policy import (
    Direction,
    PolicyConfig,
    ScalingDecision,
    SignalKind,
    SignalReading,
)
from tokenyard.autoscaler.prometheus import KVCacheSize, QueryTemplateError, kv_cache_sizes, signal_query
from tokenyard.core.prometheus import Reading, Sample, VectorReading, parse_query_response
from tokenyard.core.types import InferenceAutoscalerSpec


# ---- PromQL and responses ----------------------------------------------------------------------------------
def test_default_queries_select_the_target_and_use_both_engines_names():
    q = signal_query(SignalKind.KV_CACHE_USAGE, "team-a", "llama")
    assert q == (
        'avg(max without (pid) (vllm:kv_cache_usage_perc{namespace="team-a",model_deployment="llama"})'
        " or max without (tp_rank, pp_rank, moe_ep_rank, pid)"
        ' (sglang:token_usage{priority="",namespace="team-a",model_deployment="llama"}))'
    )
    ttft = signal_query(SignalKind.TTFT_P95, "team-a", "llama")
    assert "histogram_quantile(0.95" in ttft and "vllm:time_to_first_token_seconds_bucket" in ttft
    assert "sglang:time_to_first_token_seconds_bucket" in ttft
    assert "$" not in signal_query(SignalKind.QUEUED_TOKENS, "team-a", "llama")


def test_token_load_query_adds_the_tokens_running_sequences_hold_to_the_queued_ones():
    queued = signal_query(SignalKind.QUEUED_TOKENS, "team-a", "llama")
    # with the engines' cache sizes: vLLM's occupancy times each size, SGLang's own count
    load = signal_query(
        SignalKind.TOKEN_LOAD,
        "team-a",
        "llama",
        kv_sizes=(KVCacheSize.of_blocks(1000, 16), KVCacheSize.of_blocks(2000, 32)),
    )
    assert load.startswith(queued + " + sum(") and "$" not in load
    held = load.removeprefix(queued + " + ")
    assert held.count("vllm:kv_cache_usage_perc{") == 2 and held.count("on(instance, engine)") == 2
    assert 'num_gpu_blocks="1000",block_size="16",kv_cache_size_tokens="",namespace="team-a"' in held
    assert "* 16000" in held
    assert 'num_gpu_blocks="2000",block_size="32"' in held and "* 64000" in held
    assert "sglang:num_used_tokens" in held and "num_requests_running" not in held
    # without them: SGLang's count, else every running sequence's estimated share
    estimated = signal_query(SignalKind.TOKEN_LOAD, "team-a", "llama").removeprefix(queued + " + ")
    assert "vllm:kv_cache_usage_perc" not in estimated and "sglang:num_used_tokens" in estimated
    assert "unless on() count(vllm:num_requests_running{" in estimated
    assert "vllm:request_generation_tokens_sum" in estimated and "sglang:generation_tokens_total" in estimated
    assert "/ 2" in estimated
    # the request rate's floor is far below any real rate: a mean, not tokens per second (see prometheus.py)
    assert ", 1))" not in estimated and "clamp_min(" in estimated
    # a user's query is left as written
    assert (
        signal_query(SignalKind.TOKEN_LOAD, "a", "b", "sum(x)", kv_sizes=(KVCacheSize.of_blocks(1, 1),))
        == "sum(x)"
    )


def test_kv_cache_sizes_are_read_from_the_info_labels_and_bad_ones_are_left_out():
    def samples(*label_sets):
        return VectorReading(tuple(Sample(labels, 1.0) for labels in label_sets))

    reading = samples(
        {"num_gpu_blocks": "2000", "block_size": "16"},
        {"num_gpu_blocks": "1000", "block_size": "16"},
        {"num_gpu_blocks": "1000", "block_size": "16"},
        {"num_gpu_blocks": "None", "block_size": "16"},  # not a number
        {"num_gpu_blocks": "0", "block_size": "16"},
        {"block_size": "16"},
        # a release since vllm-project/vllm#42206 states its capacity; a model with no KV cache states "None"
        {"num_gpu_blocks": "1000", "block_size": "16", "kv_cache_size_tokens": "50000"},
        {"num_gpu_blocks": "1000", "block_size": "16", "kv_cache_size_tokens": "None"},
    )
    stated = KVCacheSize(50000, (("kv_cache_size_tokens", "50000"),))
    assert kv_cache_sizes(reading) == (
        KVCacheSize.of_blocks(1000, 16),
        KVCacheSize.of_blocks(2000, 16),
        stated,
    )
    assert KVCacheSize.of_blocks(1000, 16).tokens == 16000
    # the engines of each size are picked by the labels that state it, and an engine that states its size is
    # never also picked by its blocks
    assert stated.matchers() == 'kv_cache_size_tokens="50000"'
    assert (
        KVCacheSize.of_blocks(1000, 16).matchers()
        == 'num_gpu_blocks="1000",block_size="16",kv_cache_size_tokens=""'
    )
    with pytest.raises(ValueError, match="0 blocks of 16"):
        KVCacheSize.of_blocks(0, 16)
    assert kv_cache_sizes(VectorReading(None, "Prometheus unreachable")) == ()


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="no promtool on PATH (Debian package prometheus)"
)
def test_every_default_query_parses(tmp_path):
    kinds = [k for k in SignalKind if k is not SignalKind.PROMQL]
    rules = [{"record": f"signal:{k.value.lower()}", "expr": signal_query(k, "ns", "t")} for k in kinds]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "signals", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_override_query_is_substituted_and_a_bad_placeholder_is_named():
    q = signal_query(SignalKind.PROMQL, "ns", "t", override='sum(my_queue{ns="$namespace",svc="$target"})')
    assert q == 'sum(my_queue{ns="ns",svc="t"})'
    with pytest.raises(QueryTemplateError, match=r"\$nope|nope"):
        signal_query(SignalKind.PROMQL, "ns", "t", override='sum(x{a="$nope"})')
    with pytest.raises(QueryTemplateError, match="no default query"):
        signal_query(SignalKind.PROMQL, "ns", "t")


@pytest.mark.parametrize(
    "body, value, problem",
    [
        (
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [10, "3.5"]}]},
            },
            3.5,
            "",
        ),
        ({"status": "success", "data": {"resultType": "scalar", "result": [10, "0"]}}, 0.0, ""),
        ({"status": "success", "data": {"resultType": "vector", "result": []}}, None, "empty result"),
        (
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "NaN"]}]}},
            None,
            "nan",
        ),
        (
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]},
            },
            None,
            "2 series",
        ),
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, None, "bad_data: parse error"),
        ("<html>", None, "not a JSON object"),
    ],
)
def test_responses_parse_to_a_value_or_a_reason_never_a_silent_zero(body, value, problem):
    reading = parse_query_response(200, body, "q")
    assert reading.value == value
    assert problem.lower() in reading.problem.lower()
    if value is None:
        assert reading.problem


# ---- spec mapping -----------------------------------------------------------------------------------------------
SPEC = {
    "scaleTargetRef": {"apiVersion": "tokenyard.dev/v1alpha1", "kind": "ModelDeployment", "name": "llama"},
    "minReplicas": 1,
    "maxReplicas": 8,
    "intervalSeconds": 1,
    "signals": [{"kind": "KVCacheUsage", "target": 0.7}, {"kind": "QueuedTokens", "target": 2000}],
    "scaleDown": {"maxGroups": 1, "periodSeconds": 60, "stabilizationWindowSeconds": 0},
}


def test_the_policys_own_defaults_are_the_crds():
    """A policy built without a spec (a test, a benchmark) behaves as a user's default InferenceAutoscaler."""
    bare = {key: SPEC[key] for key in ("scaleTargetRef", "maxReplicas")}
    from_spec = policy_config_from_spec(InferenceAutoscalerSpec.parse(bare))
    defaults = PolicyConfig(signals=from_spec.signals, max_groups=from_spec.max_groups)
    assert from_spec == defaults


def test_spec_maps_onto_the_policy_configuration():
    cfg = policy_config_from_spec(InferenceAutoscalerSpec.parse(SPEC))
    assert [(s.name, s.kind, s.target) for s in cfg.signals] == [
        ("KVCacheUsage", SignalKind.KV_CACHE_USAGE, 0.7),
        ("QueuedTokens", SignalKind.QUEUED_TOKENS, 2000),
    ]
    assert (cfg.min_groups, cfg.max_groups, cfg.scale_down_limit.groups) == (1, 8, 1)
    assert cfg.spare_groups == 0
    assert (
        policy_config_from_spec(InferenceAutoscalerSpec.parse({**SPEC, "spareGroups": 3})).spare_groups == 3
    )


@pytest.mark.parametrize(
    "windows, runs_with, words",
    [
        # The old CRD defaults, stored in every object created before the CEL rules existed.
        (
            {"intervalSeconds": 15, "panicWindowSeconds": 6},
            15,
            "spec.panicWindowSeconds (6) must lie between",
        ),
        ({"stableWindowSeconds": 30, "panicWindowSeconds": 40}, 30, "spec.stableWindowSeconds (30)"),
        ({"intervalSeconds": 5, "panicWindowSeconds": 10}, 10, None),
    ],
)
def test_windows_the_crd_rejects_are_brought_inside_their_bounds_and_named(windows, runs_with, words):
    # Objects stored before the CRD's CEL rules existed reach the controller: keep scaling them, and say why
    # the window differs from the spec.
    spec = InferenceAutoscalerSpec.parse({**SPEC, **windows})
    panic, warning = effective_panic_window(spec)
    assert panic == runs_with == policy_config_from_spec(spec).panic_window_seconds
    if words is None:
        assert warning == ""
    else:
        assert words in warning and f"running with {runs_with} s" in warning


def test_target_counts_read_ready_groups_and_a_full_cluster():
    counts = target_counts(
        {"spec": {"replicas": 5}},
        {"status": {"readyReplicas": 3, "conditions": [{"type": "InsufficientCapacity", "status": "True"}]}},
    )
    assert (counts.current, counts.ready, counts.pending, counts.insufficient_capacity) == (5, 3, 2, True)


def test_conditions_keep_their_transition_time_while_unchanged():
    hold = ScalingDecision(
        3,
        Direction.HOLD,
        "no data",
        "NoData",
        (SignalReading("kv", None, None, "empty result"),),
        missing_data=True,
    )
    first = decision_conditions([], hold, "2026-01-01T00:00:00Z", 1)
    again = decision_conditions(first, hold, "2026-01-01T00:05:00Z", 1)
    active = next(c for c in again if c["type"] == "ScalingActive")
    assert active["status"] == "False" and active["reason"] == "MissingData"
    assert active["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert "kv: empty result" in active["message"]


# ---- the controller's pass, against fakes ------------------------------------------------------------------
class FakeCustomObjects:
    def __init__(self, autoscalers, targets):
        self.autoscalers = autoscalers
        self.targets = targets  # name -> {"replicas": n, "ready": r}
        self.scale_writes = []
        self.status_writes = []

    async def list_cluster_custom_object(self, group, version, plural):
        return {"items": copy.deepcopy(self.autoscalers)}

    async def get_namespaced_custom_object_scale(self, group, version, namespace, plural, name):
        if name not in self.targets:
            raise ApiException(status=404, reason="Not Found")
        return {"spec": {"replicas": self.targets[name]["replicas"]}}

    async def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        return {"status": {"readyReplicas": self.targets[name]["ready"]}}

    async def patch_namespaced_custom_object_scale(self, group, version, namespace, plural, name, body, **kw):
        self.scale_writes.append((name, body["spec"]["replicas"]))
        self.targets[name]["replicas"] = body["spec"]["replicas"]

    async def patch_namespaced_custom_object_status(
        self, group, version, namespace, plural, name, body, **kw
    ):
        self.status_writes.append((name, body["status"]))


class FakeCore:
    def __init__(self):
        self.events = []

    async def create_namespaced_event(self, namespace, body):
        self.events.append((body["reason"], body["type"], body["message"]))


class FakePrometheus:
    def __init__(self, values, sample_age_s=5.0):
        self.values = values  # signal name -> value or None
        self.sample_age_s = sample_age_s  # what the freshness query answers (None: no engine series)

    async def query(self, promql, at=None):
        assert promql.startswith("time() - max(timestamp("), promql  # only the freshness query comes here
        age = self.sample_age_s
        return Reading(age, "" if age is not None else "no data")

    kv_sizes = VectorReading(None, "Prometheus unreachable")  # what the KV cache sizes query answers
    asked: list[str] = []  # every query, in order

    async def query_vector(self, promql, at=None):
        self.asked.append(promql)
        return self.kv_sizes

    async def query_many(self, queries, at=None):
        self.asked.extend(queries.values())
        out = {}
        for name in queries:
            v = self.values.get(name)
            out[name] = Reading(v, "" if v is not None else "Prometheus unreachable")
        return out


class FakeElector:
    identity = "test"

    async def ensure_leader(self):
        return True

    async def release(self):
        pass


def autoscaler(name, target, mode="Auto"):
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {**SPEC, "scaleTargetRef": {**SPEC["scaleTargetRef"], "name": target}, "mode": mode},
    }


def make_controller(autoscalers, targets, values, clock):
    controller = AutoscalerController(
        client.ApiClient(), FakePrometheus(values), metrics=AutoscalerMetrics(), clock=clock
    )
    controller.custom = FakeCustomObjects(autoscalers, targets)
    controller.core = FakeCore()
    controller.elector = FakeElector()
    return controller


async def passes(controller, clock_box, seconds, step=1.0):
    for _ in range(int(seconds / step)):
        await controller.reconcile_all()
        clock_box[0] += step


async def test_auto_mode_scales_up_writes_status_and_an_event():
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama")],
        {"llama": {"replicas": 2, "ready": 2}},
        {"KVCacheUsage": 0.98, "QueuedTokens": 0.0},
        lambda: clock[0],
    )
    await passes(c, clock, 5)
    assert c.custom.scale_writes and c.custom.scale_writes[0] == ("llama", 3)  # ceil(2 x 0.98 / 0.7)
    status = c.custom.status_writes[-1][1]
    assert status["currentReplicas"] >= 2 and status["lastDecision"]["direction"] in ("Up", "Hold")
    assert any(reason == "SuccessfulRescale" for reason, _, _ in c.core.events)
    text = generate_latest(c.metrics.registry).decode()
    assert 'tokenyard_autoscaler_scale_actions_total{autoscaler="a",direction="Up",namespace="ns"}' in text


async def test_a_calm_autoscaler_exports_its_error_and_scale_counters_at_zero():
    metrics = AutoscalerMetrics()
    for stage in ("loop", "reconcile"):  # from the start, before any autoscaler is seen
        assert metrics.registry.get_sample_value("tokenyard_autoscaler_errors_total", {"stage": stage}) == 0
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama")],
        {"llama": {"replicas": 2, "ready": 2}},
        {"KVCacheUsage": 0.7, "QueuedTokens": 0.0},  # exactly at target: nothing to scale
        lambda: clock[0],
    )
    await passes(c, clock, 2)
    assert c.custom.scale_writes == []
    for direction in ("Up", "Down"):
        labels = {"namespace": "ns", "autoscaler": "a", "direction": direction}
        assert c.metrics.registry.get_sample_value("tokenyard_autoscaler_scale_actions_total", labels) == 0


async def test_samples_from_before_a_prometheus_outage_hold_the_count():
    """Prometheus back from a restart answers from its lookback window: an idle-looking target whose newest
    engine sample is minutes old is not scaled down; once the samples are fresh it is."""
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama")],
        {"llama": {"replicas": 3, "ready": 3}},
        {"KVCacheUsage": 0.05, "QueuedTokens": 0.0},
        lambda: clock[0],
    )
    c.prometheus.sample_age_s = 95.0
    await passes(c, clock, 60)
    assert c.custom.scale_writes == []
    status = c.custom.status_writes[-1][1]
    assert "95s old" in str(status), status
    c.prometheus.sample_age_s = 3.0
    await passes(c, clock, 600)
    assert c.custom.scale_writes and c.custom.scale_writes[-1][1] < 3


def test_only_values_are_made_stale_and_an_unknown_age_changes_nothing():
    readings = {"a": Reading(0.1, "", 5.0), "b": Reading(None, "no data")}
    old = without_stale_values(readings, Reading(61.0), 60.0)
    assert old["a"].value is None and "61s old" in old["a"].problem and old["a"].sampled_at == 5.0
    assert old["b"] is readings["b"]
    assert without_stale_values(readings, Reading(59.0), 60.0) is readings
    assert without_stale_values(readings, Reading(None, "Prometheus unreachable"), 60.0) is readings


async def test_status_names_each_signal_with_its_last_value():
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama")],
        {"llama": {"replicas": 2, "ready": 2}},
        {"KVCacheUsage": 0.42, "QueuedTokens": None},
        lambda: clock[0],
    )
    await passes(c, clock, 2)
    signals = {s["name"]: s for s in c.custom.status_writes[-1][1]["signals"]}
    assert signals.keys() == {"KVCacheUsage", "QueuedTokens"}
    assert (signals["KVCacheUsage"]["value"], signals["KVCacheUsage"]["target"]) == (0.42, 0.7)
    assert "value" not in signals["QueuedTokens"]  # no data: no value, never a zero


async def test_the_default_token_load_is_written_with_the_cache_sizes_read_just_before():
    clock = [1000.0]
    obj = autoscaler("a", "llama")
    obj["spec"]["signals"] = [{"kind": "TokenLoad", "target": 50000}]
    c = make_controller(
        [obj], {"llama": {"replicas": 2, "ready": 2}}, {"TokenLoad": 40000.0}, lambda: clock[0]
    )
    c.prometheus.asked = []
    c.prometheus.kv_sizes = VectorReading((Sample({"num_gpu_blocks": "1000", "block_size": "16"}, 1.0),))
    await passes(c, clock, 1)
    sizes_query, token_load = c.prometheus.asked
    assert sizes_query.startswith(
        "count by (kv_cache_size_tokens, num_gpu_blocks, block_size) (vllm:cache_config_info{"
    )
    assert 'num_gpu_blocks="1000",block_size="16"' in token_load and "* 16000" in token_load
    # the sizes cannot be read: the same tick still reads the token load, by the estimate
    c.prometheus.asked = []
    c.prometheus.kv_sizes = VectorReading(None, "Prometheus unreachable")
    await passes(c, clock, 1)
    _, token_load = c.prometheus.asked
    assert "cache_config_info" not in token_load and "vllm:num_requests_running" in token_load
    # a signal with a query of its own needs no sizes
    obj["spec"]["signals"] = [{"kind": "TokenLoad", "target": 50000, "query": "sum(up)"}]
    c.prometheus.asked = []
    await passes(c, clock, 1)
    assert c.prometheus.asked == ["sum(up)"]


async def test_recommend_only_never_writes_the_scale():
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama", mode="RecommendOnly")],
        {"llama": {"replicas": 2, "ready": 2}},
        {"KVCacheUsage": 0.98, "QueuedTokens": 0.0},
        lambda: clock[0],
    )
    await passes(c, clock, 5)
    assert c.custom.scale_writes == []
    assert c.custom.status_writes[-1][1]["desiredReplicas"] == 3
    assert any(reason == "Recommendation" for reason, _, _ in c.core.events)


async def test_prometheus_down_holds_and_says_so_once():
    clock = [1000.0]
    c = make_controller(
        [autoscaler("a", "llama")], {"llama": {"replicas": 4, "ready": 4}}, {}, lambda: clock[0]
    )
    await passes(c, clock, 10)
    assert c.custom.scale_writes == []
    status = c.custom.status_writes[-1][1]
    active = next(x for x in status["conditions"] if x["type"] == "ScalingActive")
    assert active["status"] == "False" and "unreachable" in active["message"]
    assert [r for r, _, _ in c.core.events].count("MissingData") == 1
    text = generate_latest(c.metrics.registry).decode()
    assert math.isnan(
        float(
            next(
                line.split()[-1]
                for line in text.splitlines()
                if line.startswith("tokenyard_autoscaler_signal_value{") and "KVCache" in line
            )
        )
    )


async def test_one_broken_autoscaler_does_not_stop_the_others():
    clock = [1000.0]
    c = make_controller(
        [autoscaler("broken", "missing"), autoscaler("ok", "llama")],
        {"llama": {"replicas": 2, "ready": 2}},
        {"KVCacheUsage": 0.98, "QueuedTokens": 0.0},
        lambda: clock[0],
    )
    await passes(c, clock, 5)
    assert ("llama", 3) in c.custom.scale_writes
    broken = [s for n, s in c.custom.status_writes if n == "broken"][-1]
    assert broken["conditions"][0]["reason"] == "FailedGetScale"


async def test_the_loop_survives_an_exception_and_stops_on_the_event():
    clock = [1000.0]
    c = make_controller([], {}, {}, lambda: clock[0])
    c.tick_seconds = 0.01
    calls = 0

    async def flaky():
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("API server hiccup")

    c.reconcile_all = flaky
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    deadline = asyncio.get_running_loop().time() + 5
    while calls < 3 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert calls >= 3
    assert (
        'tokenyard_autoscaler_errors_total{stage="loop"} 1.0' in generate_latest(c.metrics.registry).decode()
    )


# ---- leader election ----------------------------------------------------------------------------------------
class FakeLeases:
    """coordination.k8s.io/v1 Leases in memory, with resourceVersion conflicts like the API server's."""

    def __init__(self):
        self.body = None
        self.version = 0

    def _lease(self):
        spec = self.body["spec"]
        parse = lambda v: datetime.strptime(v, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC) if v else None  # noqa: E731
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name="l", resource_version=str(self.version)),
            spec=client.V1LeaseSpec(
                holder_identity=spec.get("holderIdentity"),
                lease_duration_seconds=spec.get("leaseDurationSeconds"),
                renew_time=parse(spec.get("renewTime")),
                acquire_time=parse(spec.get("acquireTime")),
                lease_transitions=spec.get("leaseTransitions"),
            ),
        )

    async def read_namespaced_lease(self, name, namespace):
        if self.body is None:
            raise ApiException(status=404, reason="Not Found")
        return self._lease()

    async def create_namespaced_lease(self, namespace, body):
        if self.body is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.body, self.version = body, 1

    async def replace_namespaced_lease(self, name, namespace, body):
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409, reason="Conflict")
        self.body, self.version = body, self.version + 1

    async def patch_namespaced_lease(self, name, namespace, body, **kw):
        self.body["spec"].update(body["spec"])
        self.version += 1


async def test_two_replicas_do_not_both_lead_and_a_stale_lease_is_taken_over():
    leases = FakeLeases()
    first = LeaseElector(leases, "default", identity="a", lease_seconds=15)
    second = LeaseElector(leases, "default", identity="b", lease_seconds=15)
    assert await first.ensure_leader() is True
    assert await second.ensure_leader() is False
    assert await first.ensure_leader() is True  # renewing keeps it
    # The first replica dies without releasing: once the lease is older than its duration, the second takes it.
    leases.body["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"
    assert await second.ensure_leader() is True
    assert await first.ensure_leader() is False
    assert leases.body["spec"]["leaseTransitions"] == 1
    # A clean stop hands over at once.
    await second.release()
    assert await first.ensure_leader() is True
