"""group_manifests: the Service and pods of one placed group, as the operator creates them."""

from tokenyard.core import labels as keys
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.manifests import GroupNames, group_manifests, planned_node

SPEC = ModelDeploymentSpec.parse(
    {
        "model": {"weights": {"uri": "hf://m"}},
        "engine": {"image": "vllm:1", "port": 8123},
        "parallelism": {"tensor": 16, "gpusPerPod": 8},
    }
)
OWNER = {
    "apiVersion": keys.API_VERSION,
    "kind": "ModelDeployment",
    "name": "llm",
    "uid": "u-1",
    "controller": True,
}


def test_a_group_is_a_headless_service_and_one_pinned_pod_per_rank_all_owned():
    names = GroupNames("llm", "ns", "abcdef0123", 2)
    service, pods = group_manifests(OWNER, SPEC, names, ("n1", "n2"))
    assert service["metadata"]["name"] == names.service and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["port"] == 8123
    assert service["metadata"]["ownerReferences"] == [OWNER]
    assert [p["metadata"]["name"] for p in pods] == [names.pod(0), names.pod(1)]
    assert [planned_node(p) for p in pods] == ["n1", "n2"]
    for rank, pod in enumerate(pods):
        assert pod["metadata"]["ownerReferences"] == [OWNER]
        assert pod["metadata"]["labels"][keys.RANK] == str(rank)
        assert pod["metadata"]["annotations"][keys.ANNOTATION_GROUP_NODES] == "n1,n2"
