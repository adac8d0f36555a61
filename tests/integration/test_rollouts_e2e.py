"""Rollouts end to end under steady client load: the operator (with its analysis reading a real Prometheus),
simulated engines on the pod IPs, and the router splitting traffic by the weights in the status.

(1) a good revision is promoted through its steps with no client error; (2) a bad revision (its engines' error
rate raised) is rolled back by itself, the rollback adding no client error and the stable revision never
losing a ready group; (3) a shadow step never changes what the client receives.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from kubernetes import client
from tokenyard.core import labels
from tokenyard.devcluster.cluster import free_port

from tests.integration.conftest import (
    ManagedProcess,
    WorkerThreads,
    operator_process,
    prometheus_process,
    sim_pods_process,
    wait_for,
)

pytestmark = pytest.mark.integration

MODEL = "rollout-model"


@pytest.fixture
def stack(devcluster, namespace, tmp_path):
    router_port, metrics_port = free_port(), free_port()
    prometheus, url = prometheus_process(
        tmp_path, [{"job_name": "router", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}]
    )
    processes = [
        prometheus,
        operator_process(devcluster.kubeconfig, tmp_path / "operator.log", "--prometheus-url", url).start(),
        sim_pods_process(devcluster.kubeconfig, tmp_path / "sim-pods.log", time_scale=0.02).start(),
        ManagedProcess(
            [
                "tokenyard.router",
                "--kubeconfig",
                str(devcluster.kubeconfig),
                "--namespace",
                namespace,
                "--port",
                str(router_port),
                "--grpc-port",
                "-1",
                "--metrics-port",
                str(metrics_port),
            ],
            tmp_path / "router.log",
        ).start(),
    ]
    yield {"router": f"http://127.0.0.1:{router_port}", "prometheus": url, "processes": processes}
    for process in reversed(processes):
        process.stop()


class Load(WorkerThreads):
    """Steady client load through the router; records each answer's status, revision and end time."""

    def __init__(self, router: str, workers: int = 4):
        super().__init__(workers)
        self.router = router
        self.results: list[tuple[float, int, str]] = []

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            body = json.dumps({"model": MODEL, "prompt": f"user {worker} asks question {n}", "max_tokens": 8})
            request = urllib.request.Request(
                f"{self.router}/v1/completions", body.encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
                    result = (time.time(), response.status, response.headers.get("x-tokenyard-revision", ""))
            except urllib.error.HTTPError as e:
                result = (time.time(), e.code, e.headers.get("x-tokenyard-revision", ""))
            except OSError:
                result = (time.time(), 0, "")
            with self.lock:
                self.results.append(result)

    def errors(self, since: float = 0.0) -> list[tuple[float, int, str]]:
        with self.lock:
            return [r for r in self.results if r[0] >= since and r[1] != 200]

    def by_revision(self) -> Counter:
        with self.lock:
            return Counter(r[2] for r in self.results if r[1] == 200)


def deployment(rollout: dict, env: list[dict] | None = None) -> dict:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "web"},
        "spec": {
            "model": {"servedModelName": MODEL, "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
            "engine": {"image": "vllm/vllm-openai:v0.13.0", "env": env or []},
            "parallelism": {"tensor": 1},
            "replicas": 2,
            "rollout": rollout,
        },
    }


def start(kube_api, namespace, body, router):
    custom = client.CustomObjectsApi(kube_api)
    custom.create_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, "modeldeployments", body)

    def get():
        return custom.get_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, "modeldeployments", "web"
        )

    wait_for(lambda: get().get("status", {}).get("readyReplicas") == 2, timeout=60, what="2 stable groups")

    def served():
        request = urllib.request.Request(
            f"{router}/v1/completions",
            json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status == 200

    wait_for(served, timeout=60, what="the router to serve the model")
    return custom, get


def update(custom, namespace, patch):
    custom.patch_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, "modeldeployments", "web", {"spec": patch}
    )


def watch_stable_capacity(get, stable: str, stop: threading.Event, lowest: list[int]) -> threading.Thread:
    def run():
        while not stop.is_set():
            groups = get().get("status", {}).get("groups", [])
            lowest[0] = min(
                lowest[0], sum(1 for g in groups if g["revision"] == stable and g["phase"] == "Ready")
            )
            stop.wait(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


ANALYSED = {
    "strategy": "Canary",
    "drainSeconds": 2,
    "analysis": {"minRequests": 40, "alpha": 0.05, "margin": 0.02},
    "steps": [{"setWeight": 50}, {"analysis": {"timeoutSeconds": 40}}],
}


def test_good_revision_is_promoted_with_no_client_error(stack, kube_api, namespace):
    custom, get = start(kube_api, namespace, deployment(ANALYSED), stack["router"])
    stable = get()["status"]["currentRevision"]
    with Load(stack["router"]) as load:
        update(custom, namespace, {"engine": {"image": "vllm/vllm-openai:v0.12.0", "env": []}})
        obj = wait_for(
            lambda: (
                (o := get())["status"].get("rollout", {}).get("phase") == "Healthy"
                and o["status"]["currentRevision"] != stable
                and o
            ),
            timeout=150,
            interval=0.5,
            what="the good revision promoted",
        )
    new = obj["status"]["currentRevision"]
    assert obj["status"]["rollout"]["analysis"]["decision"] == "Pass", obj["status"]["rollout"]
    assert load.errors() == [], f"client errors during a good rollout: {load.errors()[:5]}"
    assert load.by_revision()[new] > 0 and load.by_revision()[stable] > 0


def test_bad_revision_is_rolled_back_without_errors_of_its_own(stack, kube_api, namespace):
    custom, get = start(kube_api, namespace, deployment(ANALYSED), stack["router"])
    stable = get()["status"]["currentRevision"]
    stop, lowest = threading.Event(), [2]
    watcher = watch_stable_capacity(get, stable, stop, lowest)
    with Load(stack["router"]) as load:
        update(
            custom,
            namespace,
            {
                "engine": {
                    "image": "vllm/vllm-openai:v0.12.0",
                    "env": [{"name": labels.ENV_SIM_ERROR_RATE, "value": "0.5"}],
                }
            },
        )
        obj = wait_for(
            lambda: (o := get())["status"].get("rollout", {}).get("phase") == "RolledBack" and o,
            timeout=150,
            interval=0.2,
            what="the automatic rollback",
        )
        rolled_back_at = time.time()
        # Keep the load on until the bad revision's groups are gone.
        wait_for(
            lambda: {g["revision"] for g in get()["status"]["groups"]} == {stable},
            timeout=60,
            what="the canary removed",
        )
        settled = time.time()
    stop.set()
    watcher.join()
    analysis = obj["status"]["rollout"]["analysis"]
    assert analysis["decision"] == "Fail", analysis
    assert lowest[0] == 2, "the stable revision lost a ready group during the rollout"
    assert {t["revision"]: t["weight"] for t in obj["status"]["traffic"]}[stable] == 100
    # The canary's own errors reached clients before the verdict; nothing after it, while its streams drained.
    late = [e for e in load.errors(since=rolled_back_at + 1.0)]
    assert late == [], f"errors after the rollback: {late[:5]}"
    assert settled > rolled_back_at


def test_shadow_step_never_changes_what_the_client_receives(stack, kube_api, namespace):
    rollout = {
        "strategy": "Canary",
        "drainSeconds": 1,
        "analysis": {"minRequests": 20},
        "steps": [{"shadow": {"fraction": 0.5, "durationSeconds": 15}}, {"pause": {}}],
    }
    custom, get = start(kube_api, namespace, deployment(rollout), stack["router"])
    stable = get()["status"]["currentRevision"]
    with Load(stack["router"]) as load:
        update(
            custom,
            namespace,
            {
                "engine": {
                    "image": "vllm/vllm-openai:v0.12.0",
                    "env": [{"name": labels.ENV_SIM_ERROR_RATE, "value": "0.3"}],
                }
            },
        )
        # The shadow revision fails a third of the copies; the shadow step must not pass, and no client may notice.
        wait_for(lambda: get()["status"].get("shadow"), timeout=60, what="the shadow step to start")
        try:
            wait_for(
                lambda: get()["status"].get("rollout", {}).get("phase") in ("RolledBack", "RollingBack"),
                timeout=90,
                interval=0.5,
                what="the failing shadow revision to be rolled back",
            )
        except BaseException as failure:
            status = get()["status"]
            raise AssertionError(
                f"rollout: {status.get('rollout')}; shadow: {status.get('shadow')}"
            ) from failure
    assert load.errors() == [], f"shadow copies leaked errors to clients: {load.errors()[:5]}"
    assert set(load.by_revision()) == {stable}, (
        f"a client was answered by the shadow revision: {load.by_revision()}"
    )


def test_prometheus_stopped_mid_analysis_pauses_the_rollout(stack, kube_api, namespace):
    rollout = {
        "strategy": "Canary",
        "analysis": {
            "minRequests": 1000000
        },  # never enough: the analysis stays pending while Prometheus answers
        "steps": [{"setWeight": 50}, {"analysis": {"timeoutSeconds": 120}}],
    }
    custom, get = start(kube_api, namespace, deployment(rollout), stack["router"])
    with Load(stack["router"], workers=2):
        update(custom, namespace, {"engine": {"image": "vllm/vllm-openai:v0.12.0", "env": []}})
        wait_for(
            lambda: (get()["status"].get("rollout") or {}).get("analysis", {}).get("decision") == "Pending",
            timeout=90,
            interval=0.5,
            what="the analysis to run",
        )
        stack["processes"][0].stop()  # Prometheus

        def paused():
            rollout_status = get()["status"].get("rollout") or {}
            return rollout_status.get("phase") == "Paused" and rollout_status

        paused_status = wait_for(paused, timeout=60, interval=0.5, what="the rollout to pause")
    assert paused_status["state"]["pauseReason"] == "AnalysisInconclusive"
    assert "Prometheus" in paused_status["analysis"]["reason"], paused_status["analysis"]
    assert paused_status["canaryRevision"] and paused_status["step"] == 1, (
        "the rollout neither promoted nor rolled back"
    )
