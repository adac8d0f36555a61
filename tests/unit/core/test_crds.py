"""The CRD YAML in the chart is generated from the types; these tests catch drift and schema mistakes."""

from pathlib import Path

import pytest
import yaml
from tokenyard.core import crdgen, types

ROOT = Path(__file__).resolve().parents[3]
CRD_DIR = ROOT / "charts" / "tokenyard" / "crds"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_chart_crds_match_the_types():
    # Fails when someone edits types.py without `make crds`, or edits the YAML by hand.
    assert crdgen.main(["--check", str(CRD_DIR)]) == 0


def _walk(node, path="$"):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", sorted(crdgen.crds()))
def test_schema_is_structural_and_described(name):
    schema = crdgen.crds()[name]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema["properties"]["spec"], "spec"):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        assert not {"$ref", "anyOf", "allOf", "title"} & set(node), (
            f"{path} is not structural: {sorted(node)}"
        )
        if path != "spec":
            assert node.get("description") or path.endswith("[]"), (
                f"{path} has no description for kubectl explain"
            )
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, f"{path}: OpenAPI v3.0 bounds"


def test_object_defaults_are_written_in_full():
    spec = crdgen.crds()["tokenyard.dev_modeldeployments.yaml"]["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]["properties"]["spec"]
    assert spec["properties"]["placement"]["default"]["strategy"] == "BestFit"
    assert spec["properties"]["rollout"]["default"]["maxSurge"] == 1
    assert [lvl["name"] for lvl in spec["properties"]["placement"]["properties"]["topology"]["default"]] == [
        "nvlink",
        "rack",
        "zone",
    ]


@pytest.mark.parametrize(
    "path", [p for p in EXAMPLES if "ModelDeployment" in p.read_text()], ids=lambda p: p.name
)
def test_examples_parse_as_model_deployments(path):
    spec = types.ModelDeploymentSpec.parse(yaml.safe_load(path.read_text())["spec"])
    assert spec.parallelism.group_gpus % spec.parallelism.pod_gpus == 0


def test_parallelism_derives_pods_per_group():
    assert types.Parallelism(tensor=16, gpus_per_pod=8).pods_per_group == 2
    assert types.Parallelism(tensor=4).pods_per_group == 1
    assert types.Parallelism(tensor=32).pod_gpus == 8  # capped at one 8-GPU node
