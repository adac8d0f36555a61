"""indexes: what Kopf's indexes keep of each pod and node, from the objects' fields."""

from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.indexes import engine_pod_entry, gpus_of, node_entry, pod_gpus_entry
from tokenyard.operator.manifests import GroupNames, pod_manifest
from tokenyard.operator.status import timestamp

SPEC = ModelDeploymentSpec.parse(
    {
        "model": {"weights": {"uri": "hf://m"}},
        "engine": {"image": "vllm:1"},
        "parallelism": {"tensor": 16, "gpusPerPod": 8},
    }
)


def gpu_container(limits=None, requests=None):
    return {"name": "c", "resources": {"limits": limits or {}, "requests": requests or {}}}


def test_gpus_are_the_containers_limits_or_requests():
    spec = {
        "containers": [
            gpu_container(limits={keys.GPU_RESOURCE: "4"}),
            gpu_container(requests={keys.GPU_RESOURCE: 2}),
            gpu_container(),
        ]
    }
    assert gpus_of(spec) == 6
    assert gpus_of({}) == 0


def test_a_live_gpu_pod_counts_on_its_bound_or_pinned_node():
    bound = {"nodeName": "n1", "containers": [gpu_container(limits={keys.GPU_RESOURCE: 8})]}
    assert pod_gpus_entry("p", "ns", bound, {"phase": "Running"}) == {"n1": ("ns/p", 8)}
    pinned = pod_manifest(SPEC, GroupNames("llm", "ns", "rev", 0), 0, "n2", ("n2", "n3"))["spec"]
    assert pod_gpus_entry("q", "ns", pinned, {}) == {"n2": ("ns/q", 8)}


def test_finished_gpu_less_and_unplaced_pods_hold_nothing():
    gpu = [gpu_container(limits={keys.GPU_RESOURCE: 8})]
    assert pod_gpus_entry("p", "ns", {"nodeName": "n1", "containers": gpu}, {"phase": "Succeeded"}) is None
    assert pod_gpus_entry("p", "ns", {"nodeName": "n1", "containers": [gpu_container()]}, {}) is None
    assert pod_gpus_entry("p", "ns", {"containers": gpu}, {}) is None


def test_an_engine_pod_is_summarised_for_its_deployment():
    names = GroupNames("llm", "ns", "rev", 3)
    pod = pod_manifest(SPEC, names, 1, "n2", ("n1", "n2"))
    status = {
        "phase": "Pending",
        "podIP": "127.0.0.9",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": timestamp(60),
            },
            {"type": "Ready", "status": "False"},
        ],
    }
    meta = pod["metadata"]
    entry = engine_pod_entry(meta["name"], "ns", meta["labels"], meta["annotations"], pod["spec"], status, {})
    assert entry == {
        ("ns", "llm"): {
            "name": meta["name"],
            "group": 3,
            "rank": 1,
            "revision": "rev",
            "size": 2,
            "node": None,
            "planned": "n2",
            "group_nodes": ("n1", "n2"),
            "phase": "Pending",
            "ready": False,
            "unschedulable_since": 60.0,
            "terminating": False,
            "ip": "127.0.0.9",
        }
    }
    terminating = engine_pod_entry("p", "ns", meta["labels"], {}, {}, {}, {"deletionTimestamp": "x"})
    assert terminating[("ns", "llm")]["terminating"] and terminating[("ns", "llm")]["size"] == 1


def test_a_pod_without_its_deployment_label_is_not_indexed():
    assert engine_pod_entry("p", "ns", {}, {}, {}, {}, {}) is None


def test_a_node_summary_says_gpus_readiness_and_schedulability():
    ready = {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {keys.GPU_RESOURCE: "8"}}
    entry = node_entry("n1", {"zone": "z"}, {}, ready)
    assert entry == {
        None: {"name": "n1", "labels": {"zone": "z"}, "gpus": 8, "ready": True, "schedulable": True}
    }
    assert node_entry("n1", {}, {"unschedulable": True}, ready)[None]["schedulable"] is False
    tainted = {"taints": [{"key": "k", "effect": "NoSchedule"}]}
    assert node_entry("n1", {}, tainted, ready)[None]["schedulable"] is False
    tolerable = {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}
    assert node_entry("n1", {}, tolerable, ready)[None]["schedulable"] is True
    assert node_entry("n1", {}, {}, {})[None] == {
        "name": "n1",
        "labels": {},
        "gpus": 0,
        "ready": False,
        "schedulable": True,
    }
