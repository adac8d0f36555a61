"""The CRDs and the local control plane, against the real API server (issue 2's checks)."""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tokenyard.core import labels
from tokenyard.devcluster.topology import Topology

from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = labels.GROUP, labels.VERSION, "modeldeployments"


def example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def minimal(name: str = "m", **spec_overrides) -> dict:
    spec = {"model": {"weights": {"uri": "hf://org/model"}}, "engine": {"image": "vllm/vllm-openai:v0.13.0"}}
    spec.update(spec_overrides)
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
def crd_api(kube_api):
    return client.CustomObjectsApi(kube_api)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_applies_and_reads_back_with_defaults(kubectl, namespace, path):
    doc = yaml.safe_load(path.read_text())
    kubectl.apply(path.read_text(), namespace)
    kind = doc["kind"].lower()
    got = yaml.safe_load(
        kubectl.run("get", kind, doc["metadata"]["name"], "-n", namespace, "-o", "yaml").stdout
    )
    if doc["kind"] == "ModelDeployment":
        spec = got["spec"]
        assert spec["engine"]["port"] == 8000
        assert spec["parallelism"]["pipeline"] == 1
        assert [lvl["name"] for lvl in spec["placement"]["topology"]] == ["nvlink", "rack", "zone"]
        assert spec["rollout"]["maxSurge"] == 1 and spec["rollout"]["analysis"]["alpha"] == 0.05
        assert spec["routing"]["weights"]["outstandingTokens"] == 1
    else:
        assert got["spec"]["mode"] == "Auto"
        assert got["spec"]["scaleDown"]["stabilizationWindowSeconds"] == 300
        assert got["spec"]["scaleTargetRef"]["kind"] == "ModelDeployment"


INVALID_MODEL_DEPLOYMENTS = [
    ("tensor-not-power-of-two", {"parallelism": {"tensor": 6}}, "spec.parallelism.tensor", "power of two"),
    ("tensor-zero", {"parallelism": {"tensor": 0}}, "spec.parallelism.tensor", "greater than or equal to 1"),
    (
        "gpus-per-pod-not-dividing",
        {"parallelism": {"tensor": 8, "gpusPerPod": 3}},
        "spec.parallelism.gpusPerPod",
        "divide",
    ),
    (
        "gpus-per-pod-too-big",
        {"parallelism": {"tensor": 2, "gpusPerPod": 4}},
        "spec.parallelism.gpusPerPod",
        "exceed",
    ),
    ("negative-replicas", {"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
    ("unknown-required-level", {"placement": {"required": "datacenter"}}, "spec.placement.required", "level"),
    ("unknown-preferred-level", {"placement": {"preferred": "row"}}, "spec.placement.preferred", "level"),
    ("bad-strategy", {"placement": {"strategy": "WorstFit"}}, "spec.placement.strategy", "Unsupported value"),
    (
        "canary-weight-over-100",
        {"rollout": {"strategy": "Canary", "steps": [{"setWeight": 150}]}},
        "spec.rollout.steps[0].setWeight",
        "less than or equal to 100",
    ),
    (
        "step-with-two-actions",
        {"rollout": {"strategy": "Canary", "steps": [{"setWeight": 10, "pause": {}}]}},
        "spec.rollout.steps[0]",
        "exactly one",
    ),
    ("canary-without-steps", {"rollout": {"strategy": "Canary"}}, "spec.rollout.steps", "at least one step"),
    ("no-surge-no-unavailable", {"rollout": {"maxSurge": 0}}, "spec.rollout.maxSurge", "cannot both be 0"),
    (
        "alpha-out-of-range",
        {"rollout": {"analysis": {"alpha": 0.7}}},
        "spec.rollout.analysis.alpha",
        "less than 0.5",
    ),
    (
        "bad-port",
        {"engine": {"image": "x", "port": 70000}},
        "spec.engine.port",
        "less than or equal to 65535",
    ),
    ("empty-image", {"engine": {"image": ""}}, "spec.engine.image", "at least 1"),
    (
        "bad-digest",
        {"model": {"weights": {"uri": "hf://org/model", "digest": "md5"}}},
        "spec.model.weights.digest",
        "should match",
    ),
    # The engine contract (issue 13): what a vLLM or SGLang pod is rendered from must be loadable and must not
    # be contradicted by a user argument.
    (
        "vllm-cannot-load-s3",
        {"model": {"weights": {"uri": "s3://bucket/llama"}}},
        "spec.model.weights.uri",
        "hf://[ORG/]NAME[@REVISION], pvc://CLAIM/PATH",
    ),
    (
        "sglang-tokenizer-over-http",
        {
            "engine": {"kind": "SGLang", "image": "lmsysorg/sglang:v0.5.5"},
            "model": {"weights": {"uri": "hf://org/model"}, "tokenizer": {"uri": "https://example.com/tok"}},
        },
        "spec.model.tokenizer.uri",
        "tokenizer URI must be",
    ),
    (
        "vllm-args-contradict-parallelism",
        {"engine": {"image": "x", "args": ["--max-model-len=4096", "--tensor-parallel-size=8"]}},
        "spec.engine.args",
        "--tensor-parallel-size=8 sets a flag the operator renders for engine kind vLLM",
    ),
    (
        "vllm-underscore-spelling",
        {"engine": {"image": "x", "args": ["--served_model_name", "other"]}},
        "spec.engine.args",
        "--served_model_name sets a flag",
    ),
    (
        "sglang-args-set-the-port",
        {"engine": {"kind": "SGLang", "image": "x", "args": ["--port", "9000"]}},
        "spec.engine.args",
        "--port sets a flag the operator renders for engine kind SGLang",
    ),
    (
        "unknown-engine-kind",
        {"engine": {"kind": "TensorRT", "image": "x"}},
        "spec.engine.kind",
        "Unsupported value",
    ),
    (
        "model-cache-both-sources",
        {"engine": {"image": "x", "modelCache": {"claimName": "hf", "sizeLimit": "10Gi"}}},
        "spec.engine.modelCache",
        "exactly one of claimName",
    ),
]


def test_custom_engines_take_any_uri_and_any_args(crd_api, namespace):
    """Kind Custom leaves the command line to the image: the engine-contract rules do not apply to it."""
    body = minimal(
        "custom",
        model={"weights": {"uri": "s3://bucket/llama"}},
        engine={"kind": "Custom", "image": "my/engine:1", "args": ["--tensor-parallel-size=8", "--port=9"]},
    )
    created = crd_api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert created["spec"]["engine"]["args"] == ["--tensor-parallel-size=8", "--port=9"]
    assert created["spec"]["engine"]["startupTimeoutSeconds"] == 1800


@pytest.mark.parametrize(
    "case,overrides,field,words", INVALID_MODEL_DEPLOYMENTS, ids=[c[0] for c in INVALID_MODEL_DEPLOYMENTS]
)
def test_invalid_model_deployment_is_rejected_naming_the_field(
    crd_api, namespace, case, overrides, field, words
):
    body = minimal(case)
    for key, value in overrides.items():
        body["spec"][key] = value if key not in body["spec"] else {**body["spec"][key], **value}
    with pytest.raises(ApiException) as rejected:
        crd_api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert rejected.value.status == 422, rejected.value.body
    assert field in rejected.value.body and words in rejected.value.body, rejected.value.body


INVALID_AUTOSCALERS = [
    (
        "min-above-max",
        {"minReplicas": 5, "maxReplicas": 2},
        "spec.minReplicas",
        "must not exceed maxReplicas",
    ),
    (
        "promql-without-query",
        {"signals": [{"kind": "PromQL", "target": 1}]},
        "spec.signals[0].query",
        "needs a query",
    ),
    (
        "zero-target",
        {"signals": [{"kind": "KVCacheUsage", "target": 0}]},
        "spec.signals[0].target",
        "greater than 0",
    ),
    ("bad-mode", {"mode": "Sometimes"}, "spec.mode", "Unsupported value"),
]


@pytest.mark.parametrize(
    "case,overrides,field,words", INVALID_AUTOSCALERS, ids=[c[0] for c in INVALID_AUTOSCALERS]
)
def test_invalid_autoscaler_is_rejected_naming_the_field(crd_api, namespace, case, overrides, field, words):
    spec = {"scaleTargetRef": {"name": "m"}, "maxReplicas": 4, **overrides}
    body = {
        "apiVersion": labels.API_VERSION,
        "kind": "InferenceAutoscaler",
        "metadata": {"name": case},
        "spec": spec,
    }
    with pytest.raises(ApiException) as rejected:
        crd_api.create_namespaced_custom_object(GROUP, VERSION, namespace, "inferenceautoscalers", body)
    assert rejected.value.status == 422
    assert field in rejected.value.body and words in rejected.value.body, rejected.value.body


def test_scale_subresource_follows_kubernetes_semantics(crd_api, kubectl, namespace):
    crd_api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, minimal("scaled"))
    kubectl.run("scale", "mdep", "scaled", "--replicas=3", "-n", namespace)
    obj = crd_api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert obj["spec"]["replicas"] == 3
    # The scale subresource reads status.replicas and status.selector, which the operator writes.
    crd_api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "scaled", {"status": {"replicas": 2, "selector": "a=b"}}
    )
    scale = crd_api.get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "scaled")
    assert scale["spec"]["replicas"] == 3
    assert scale["status"]["replicas"] == 2 and scale["status"]["selector"] == "a=b"
    crd_api.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "scaled", {"spec": {"replicas": 5}}
    )
    assert (
        crd_api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "scaled")["spec"]["replicas"]
        == 5
    )


def test_status_subresource_separates_spec_and_status(crd_api, namespace):
    created = crd_api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, minimal("split"))
    generation = created["metadata"]["generation"]
    # Writing status through the main resource is ignored ...
    body = copy.deepcopy(created)
    body["status"] = {"readyReplicas": 7}
    updated = crd_api.replace_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "split", body)
    assert "status" not in updated or updated["status"].get("readyReplicas") != 7
    # ... and writing it through /status does not bump the generation nor touch the spec.
    after = crd_api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "split", {"status": {"readyReplicas": 7}, "spec": {"replicas": 9}}
    )
    assert after["status"]["readyReplicas"] == 7
    assert after["spec"]["replicas"] == 1
    assert after["metadata"]["generation"] == generation
    # A spec change bumps it.
    changed = crd_api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "split", {"spec": {"replicas": 2}}
    )
    assert changed["metadata"]["generation"] == generation + 1


def test_kwok_nodes_carry_the_topology_and_gpus(kube_api):
    topology = Topology()
    nodes = client.CoreV1Api(kube_api).list_node(label_selector="type=kwok").items
    assert len(nodes) == len(topology.nodes())
    for node in nodes:
        assert node.status.allocatable[labels.GPU_RESOURCE] == str(topology.gpus_per_node)
        assert node.metadata.labels[labels.NODE_GPU_PRODUCT] == topology.gpu_product
        zone, rack, domain = (
            node.metadata.labels[k] for k in (labels.NODE_ZONE, labels.NODE_RACK, labels.NODE_NVLINK_DOMAIN)
        )
        assert domain.startswith(rack) and rack.startswith(zone)
    domains = {n.metadata.labels[labels.NODE_NVLINK_DOMAIN] for n in nodes}
    assert len(domains) == topology.zones * topology.racks_per_zone * topology.nvlink_domains_per_rack


def test_gpu_pod_is_scheduled_on_a_fake_node_with_a_loopback_ip(kube_api, namespace):
    core = client.CoreV1Api(kube_api)
    pod = {
        "metadata": {"name": "gpu-probe"},
        "spec": {
            "containers": [
                {"name": "c", "image": "none", "resources": {"limits": {labels.GPU_RESOURCE: "8"}}}
            ]
        },
    }
    core.create_namespaced_pod(namespace, pod)

    def running():
        p = core.read_namespaced_pod("gpu-probe", namespace)
        return p if p.status.phase == "Running" and p.status.pod_ip else None

    got = wait_for(running, timeout=30, what="the GPU pod to run")
    assert got.spec.node_name.startswith("gpu-")
    assert ipaddress.ip_address(got.status.pod_ip) in ipaddress.ip_network("127.0.0.0/8")


def test_pod_asking_more_gpus_than_any_node_stays_pending(kube_api, namespace):
    core = client.CoreV1Api(kube_api)
    pod = {
        "metadata": {"name": "too-big"},
        "spec": {
            "containers": [
                {"name": "c", "image": "none", "resources": {"limits": {labels.GPU_RESOURCE: "9"}}}
            ]
        },
    }
    core.create_namespaced_pod(namespace, pod)

    def unschedulable():
        p = core.read_namespaced_pod("too-big", namespace)
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable" for c in (p.status.conditions or [])
        )

    wait_for(unschedulable, timeout=30, what="the scheduler to report the pod Unschedulable")
