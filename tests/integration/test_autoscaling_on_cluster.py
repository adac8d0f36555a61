"""The autoscaler on the local cluster with a real Prometheus scraping simulated engines through Kubernetes
service discovery: load raises the queue and the groups, the load stops and they come back down, and a
Prometheus that goes away holds the count."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from kubernetes import client
from tokenyard.autoscaler.policy import SignalKind
from tokenyard.autoscaler.prometheus import kv_cache_sizes, kv_cache_sizes_query, signal_query
from tokenyard.core import labels
from tokenyard.core.prometheus import Sample, VectorReading

from tests.integration.conftest import (
    ManagedProcess,
    engine_scrape_config,
    operator_process,
    prometheus_process,
    prometheus_query,
    sim_pods_process,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(devcluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("autoscaling")
    prometheus, url = prometheus_process(folder, [engine_scrape_config(devcluster)])
    operator = operator_process(devcluster.kubeconfig, folder / "operator.log").start()
    pods = sim_pods_process(devcluster.kubeconfig, folder / "sim-pods.log", time_scale=1.0).start()
    autoscaler = ManagedProcess(
        [
            "tokenyard.autoscaler",
            "--prometheus-url",
            url,
            "--kubeconfig",
            str(devcluster.kubeconfig),
            "--interval",
            "1",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            "0",
        ],
        folder / "autoscaler.log",
    ).start()
    yield {"prometheus": prometheus, "url": url}
    for process in (autoscaler, pods, operator, prometheus):
        process.stop()


def load(ip: str, model: str, stop: threading.Event, concurrency: int) -> list[threading.Thread]:
    """Long fixed-length requests, `concurrency` at a time, until `stop` is set."""

    def worker():
        body = json.dumps(
            {"model": model, "prompt": "tell me a long story " * 50, "max_tokens": 400, "ignore_eos": True}
        )
        while not stop.is_set():
            request = urllib.request.Request(
                f"http://{ip}:8000/v1/completions", body.encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    response.read()
            except OSError:
                stop.wait(0.2)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    return threads


def token_load_reads_the_engines_caches(url: str, namespace: str, target: str) -> None:
    """The default TokenLoad on real scrapes of busy engines: the engines' cache size is found in
    vllm:cache_config_info's labels, and each engine's occupancy is matched to it by scrape target and engine
    index (a join that fails leaves the query empty, not zero)."""
    answer = prometheus_query(url, kv_cache_sizes_query(namespace, target))
    sizes = kv_cache_sizes(VectorReading(tuple(Sample(s["metric"], float(s["value"][1])) for s in answer)))
    assert len(sizes) == 1 and sizes[0].tokens > 0, answer
    selector = f'namespace="{namespace}",model_deployment="{target}"'
    occupied = f"sum(vllm:kv_cache_usage_perc{{{selector}}}) * {sizes[0].tokens}"
    held = (
        f"({signal_query(SignalKind.TOKEN_LOAD, namespace, target, kv_sizes=sizes)})"
        f" - ({signal_query(SignalKind.QUEUED_TOKENS, namespace, target)})"
    )

    def both():
        rows = prometheus_query(
            url,
            f'label_replace({occupied}, "part", "occupied", "", "") or label_replace({held}, "part", "held", "", "")',
        )
        values = {r["metric"].get("part"): float(r["value"][1]) for r in rows}
        return values if len(values) == 2 and values["occupied"] > 0 else None

    values = wait_for(both, timeout=60, what="the token load and the occupied cache, with some cache in use")
    assert values["held"] == pytest.approx(values["occupied"])


def test_queue_scales_groups_up_then_down_and_missing_data_holds(stack, kube_api, namespace):
    custom, core = client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)
    mdep = {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "busy"},
        "spec": {
            "model": {"servedModelName": "busy", "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
            "engine": {
                "image": "vllm/vllm-openai:v0.13.0",
                # At most 2 running requests per engine, so that extra load waits in its queue (vLLM's own
                # flag: the simulator reads it from the rendered command line).
                "args": ["--max-num-seqs=2"],
            },
            "parallelism": {"tensor": 1},
            "replicas": 1,
        },
    }
    autoscaler = {
        "apiVersion": labels.API_VERSION,
        "kind": "InferenceAutoscaler",
        "metadata": {"name": "busy"},
        "spec": {
            "scaleTargetRef": {"name": "busy"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "intervalSeconds": 1,
            "stableWindowSeconds": 3,
            "panicWindowSeconds": 2,
            "signals": [{"kind": "WaitingRequests", "target": 2}],
            "scaleUp": {"maxGroups": 2, "periodSeconds": 1},
            "scaleDown": {"maxGroups": 2, "periodSeconds": 1, "stabilizationWindowSeconds": 5},
            "coldStartSeconds": 0,
        },
    }
    custom.create_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, "modeldeployments", mdep)

    def get():
        return custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, "modeldeployments", "busy"
        )

    def leader_ip():
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=busy,{labels.ROLE}=leader"
        ).items
        ready = [p for p in pods if p.status.pod_ip and get().get("status", {}).get("readyReplicas") == 1]
        return ready[0].status.pod_ip if ready else None

    ip = wait_for(leader_ip, timeout=60, what="the first group")
    wait_for(
        lambda: prometheus_query(stack["url"], f'vllm:num_requests_waiting{{namespace="{namespace}"}}'),
        timeout=30,
        what="Prometheus to discover and scrape the engine",
    )
    custom.create_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, "inferenceautoscalers", autoscaler
    )

    stop = threading.Event()
    threads = load(ip, "busy", stop, concurrency=10)
    try:
        scaled = wait_for(
            lambda: get()["spec"]["replicas"] >= 2 and get(), timeout=90, what="a scale-up from the queue"
        )
        assert scaled["spec"]["replicas"] <= 3
        status = custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, "inferenceautoscalers", "busy"
        )["status"]
        assert status["lastDecision"]["direction"].lower() == "up"
        token_load_reads_the_engines_caches(stack["url"], namespace, "busy")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=150)
    wait_for(
        lambda: get()["spec"]["replicas"] == 1, timeout=120, what="the scale-down once the queue is gone"
    )

    # Prometheus gone: no data is never read as zero; the count holds and a condition says why.
    stack["prometheus"].stop()

    def read():
        return custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, "inferenceautoscalers", "busy"
        )["status"]

    def says_no_data():
        active = {c["type"]: c for c in read().get("conditions", [])}.get("ScalingActive", {})
        return active.get("status") == "False" and active

    wait_for(says_no_data, timeout=60, what="ScalingActive=False once Prometheus is gone")
    # A person scales by hand while the data is missing: the autoscaler sees it and leaves it alone.
    custom.patch_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, "modeldeployments", "busy", {"spec": {"replicas": 2}}
    )
    before = read().get("lastDecision", {}).get("time")
    wait_for(
        lambda: read().get("currentReplicas") == 2 and read().get("lastDecision", {}).get("time") != before,
        timeout=60,
        what="the autoscaler to decide again after the manual scale",
    )
    assert get()["spec"]["replicas"] == 2, "the autoscaler scaled without data"
    assert read()["lastDecision"]["direction"].lower() == "hold"
