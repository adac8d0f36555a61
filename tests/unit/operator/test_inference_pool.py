"""The InferencePool of a ModelDeployment: the pure manifest (checked against the published CRD's schema), the
drift that decides a write, the settings that name the endpoint picker, and the publisher's discovery cadence
and log-once behaviour (its Kubernetes calls run against the real API server in
tests/integration/test_inference_pool.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from tokenyard.core import labels as keys
from tokenyard.operator.kube_writes import InferencePools
from tokenyard.operator.manifests import (
    POOL_API_VERSION,
    EndpointPicker,
    inference_pool_drift,
    inference_pool_manifest,
    selector,
)
from tokenyard.operator.settings import OperatorSettings, SettingError

CRD = (
    Path(__file__).resolve().parents[2]
    / "fixtures"
    / "crds"
    / "inference.networking.k8s.io_inferencepools.yaml"
)
OWNER = {
    "apiVersion": keys.API_VERSION,
    "kind": "ModelDeployment",
    "name": "llm",
    "uid": "u-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
PICKER = EndpointPicker("ty-router", 9002, "FailOpen")


def pool(port: int = 8123, picker: EndpointPicker = PICKER) -> dict:
    return inference_pool_manifest(OWNER, "llm", "ml", port, picker)


def crd_schema() -> tuple[str, dict]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    return f"{crd['spec']['group']}/{version['name']}", version["schema"]["openAPIV3Schema"]


def schema_problems(value, schema: dict, path: str = "") -> list[str]:
    """What the API server would prune or refuse: unknown fields (pruned silently, the worst kind), missing
    required ones, values outside an enum or a numeric range, wrong types."""
    problems = []
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        properties = schema.get("properties")
        problems += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, sub in value.items():
            if properties is not None and key not in properties:
                problems.append(f"{path}.{key}: unknown field (the API server prunes it)")
            elif properties is not None:
                problems += schema_problems(sub, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                problems += schema_problems(sub, schema["additionalProperties"], f"{path}.{key}")
    elif kind == "array":
        if not isinstance(value, list) or not schema.get("minItems", 0) <= len(value) <= schema.get(
            "maxItems", 1e9
        ):
            return [f"{path}: not an array of the allowed length"]
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{path}[{i}]")
    elif kind == "integer":
        if not isinstance(value, int) or not schema.get("minimum", -1e18) <= value <= schema.get(
            "maximum", 1e18
        ):
            problems.append(f"{path}: {value!r} not an integer in range")
    elif kind == "string" and not isinstance(value, str):
        problems.append(f"{path}: {value!r} not a string")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not one of {schema['enum']}")
    return problems


def test_the_manifest_speaks_the_published_crd_exactly():
    api_version, schema = crd_schema()
    manifest = pool()
    assert manifest["apiVersion"] == api_version == POOL_API_VERSION
    spec_schema = schema["properties"]["spec"]
    assert schema_problems(manifest["spec"], spec_schema, "spec") == []
    # The check itself catches the mistakes that matter: the v1alpha2 spelling is pruned, not refused.
    old = {**manifest["spec"], "targetPortNumber": 8000}
    assert schema_problems(old, spec_schema, "spec") == [
        "spec.targetPortNumber: unknown field (the API server prunes it)"
    ]


def test_the_pool_selects_the_group_leaders_on_the_engine_port_and_names_the_router():
    manifest = pool(port=8123)
    match = manifest["spec"]["selector"]["matchLabels"]
    assert match == {keys.MODEL_DEPLOYMENT: "llm", keys.ROLE: keys.ROLE_LEADER}
    # the same pods as the scale subresource counts: one leader per group
    assert selector("llm") == ",".join(f"{k}={v}" for k, v in match.items())
    assert manifest["spec"]["targetPorts"] == [{"number": 8123}]
    ref = manifest["spec"]["endpointPickerRef"]
    assert (ref["kind"], ref["name"], ref["port"], ref["failureMode"]) == (
        "Service",
        "ty-router",
        {"number": 9002},
        "FailOpen",
    )
    meta = manifest["metadata"]
    assert (meta["name"], meta["namespace"], meta["ownerReferences"]) == ("llm", "ml", [OWNER])


def read_back(manifest: dict) -> dict:
    """The pool as the API server returns it: defaults filled in, server fields and others' labels added."""
    back = yaml.safe_load(yaml.safe_dump(manifest))
    back["metadata"].update(resourceVersion="7", uid="p-1", generation=1)
    back["metadata"]["labels"]["team"] = "ml"
    back["status"] = {"parents": []}
    return back


def test_a_pool_read_back_unchanged_needs_no_write():
    assert inference_pool_drift(pool(), read_back(pool())) == []


def test_drift_names_what_changed():
    assert inference_pool_drift(pool(), None) == ["metadata.name"]
    assert inference_pool_drift(pool(port=9000), read_back(pool(port=8000))) == ["spec.targetPorts"]
    other_picker = EndpointPicker("ty-router", 9003, "FailOpen")
    assert inference_pool_drift(pool(picker=other_picker), read_back(pool())) == ["spec.endpointPickerRef"]
    edited = read_back(pool())
    edited["spec"]["selector"]["matchLabels"].pop(keys.ROLE)  # a hand edit that would select every worker
    del edited["metadata"]["labels"][keys.MANAGED_BY]
    edited["metadata"]["ownerReferences"] = []
    assert inference_pool_drift(pool(), edited) == [
        "spec.selector",
        "metadata.labels",
        "metadata.ownerReferences",
    ]


def test_the_endpoint_picker_comes_from_the_environment():
    settings = OperatorSettings.from_environment(
        {
            "TOKENYARD_INFERENCE_POOL": "off",
            "TOKENYARD_EPP_SERVICE": "ty-router",
            "TOKENYARD_EPP_PORT": "9100",
            "TOKENYARD_EPP_FAILURE_MODE": "FailOpen",
        }
    )
    assert settings.inference_pool == "off"
    assert settings.endpoint_picker == EndpointPicker("ty-router", 9100, "FailOpen")
    defaults = OperatorSettings.from_environment({})
    assert defaults.inference_pool == "auto" and defaults.endpoint_picker == EndpointPicker()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TOKENYARD_INFERENCE_POOL", "yes"),
        ("TOKENYARD_EPP_SERVICE", "Router_1"),
        ("TOKENYARD_EPP_PORT", "70000"),
        ("TOKENYARD_EPP_PORT", "epp"),
        ("TOKENYARD_EPP_FAILURE_MODE", "failopen"),
    ],
)
def test_a_bad_pool_setting_is_refused_with_its_name(name, value):
    with pytest.raises(SettingError, match=f"{name}='{value}'"):
        OperatorSettings.from_environment({name: value})


class ScriptedDiscovery(InferencePools):
    """The publisher with discovery answered from a script: its cadence and its log, without a server."""

    def __init__(self, answers: list[bool], clock) -> None:
        super().__init__(api=None, picker=PICKER, recheck_seconds=10, clock=clock)
        self.answers, self.asked = answers, 0

    async def _discover(self) -> bool:
        self.asked += 1
        return self.answers.pop(0)


async def test_discovery_is_asked_once_per_interval_and_logged_once_per_change(caplog):
    now = [100.0]
    pools = ScriptedDiscovery([False, False, True, True], clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="tokenyard.operator")
    answers = []
    for t in (100, 101, 109, 110, 111, 120, 125, 130):  # seconds; many passes of many deployments
        now[0] = t
        answers.append(await pools.served())
    assert answers == [False, False, False, False, False, True, True, True]
    assert pools.asked == 4  # at 100, 110, 120, 130
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "does not serve inferencepools" in said[0] and "asked again every 10s" in said[0]
    assert "publishing one InferencePool per ModelDeployment" in said[1] and "ty-router port 9002" in said[1]
