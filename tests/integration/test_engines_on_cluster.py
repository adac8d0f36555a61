"""End to end on the local cluster: the operator places groups, the simulator serves each leader on its pod IP."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kubernetes import client
from tokenyard.core import labels

from tests.integration.conftest import operator_process, sim_pods_process, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(devcluster, tmp_path_factory):
    logs = tmp_path_factory.mktemp("stack")
    operator = operator_process(devcluster.kubeconfig, logs / "operator.log").start()
    pods = sim_pods_process(devcluster.kubeconfig, logs / "sim-pods.log").start()
    yield {"operator": operator, "pods": pods}
    pods.stop()
    operator.stop()


def post_json(url: str, body: dict, timeout: float = 10) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def test_each_group_leader_serves_the_model_on_its_pod_ip(stack, kube_api, namespace):
    custom, core = client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)
    body = {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": "served"},
        "spec": {
            "model": {"servedModelName": "team/llama-8b", "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
            # The simulator reads the rendered `vllm serve` command line, as a vLLM pod would: the model (and
            # so its preset) from the weights URI, the tensor-parallel size from spec.parallelism.
            "engine": {"image": "vllm/vllm-openai:v0.13.0", "args": ["--max-model-len=8192"]},
            "parallelism": {"tensor": 16, "gpusPerPod": 8},
            "replicas": 2,
        },
    }
    custom.create_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, "modeldeployments", body)

    def leaders_ready():
        pods = core.list_namespaced_pod(namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=served").items
        leaders = [
            p for p in pods if p.metadata.labels[labels.ROLE] == labels.ROLE_LEADER and p.status.pod_ip
        ]
        return leaders if len(pods) == 4 and len(leaders) == 2 else None

    leaders = wait_for(leaders_ready, timeout=60, what="2 groups of 2 pods")

    def answers(ip):
        def check():
            reply = post_json(
                f"http://{ip}:8000/v1/completions",
                {"model": "team/llama-8b", "prompt": "hi", "max_tokens": 4},
            )
            return reply["usage"]["completion_tokens"] == 4 and reply

        return check

    for pod in leaders:
        assert pod.status.pod_ip.startswith("127.")
        wait_for(answers(pod.status.pod_ip), timeout=30, what=f"the engine on {pod.status.pod_ip}")
    # Workers run no engine of their own: a multi-pod engine serves through its leader.
    workers = core.list_namespaced_pod(
        namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=served,{labels.ROLE}=worker"
    ).items
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{workers[0].status.pod_ip}:8000/health", timeout=2)
