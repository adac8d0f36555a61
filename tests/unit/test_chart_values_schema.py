"""values.schema.json of the chart: the defaults pass `helm lint --strict`, and a wrong value (a string for a
number, an unknown key, a negative count, a bad enum, a malformed URL or duration) is refused by `helm template`
with the path of the field in the message, before anything reaches a cluster."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.unit.test_chart import CHART, HELM, KUBE_VERSION, helm

SCHEMA = CHART / "values.schema.json"

pytestmark = pytest.mark.skipif(HELM is None, reason="no helm binary (see tests/unit/test_chart.py)")


def template(*options: str):
    args = ["template", "ty", str(CHART), "--kube-version", KUBE_VERSION]
    for option in options:
        args += ["--set", option]
    return helm(*args)


def test_defaults_pass_strict_lint_against_the_schema():
    assert json.loads(SCHEMA.read_text())["additionalProperties"] is False
    result = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)
    assert result.returncode == 0, result.stdout + result.stderr


def _schema_keys(schema: dict, root: dict) -> set[str]:
    if "$ref" in schema:
        schema = root["definitions"][schema["$ref"].rsplit("/", 1)[1]]
    return set(schema.get("properties", {}))


def test_schema_describes_every_key_of_values_yaml():
    """values.yaml and the schema move together: a new value needs its schema entry (or the defaults fail)."""
    schema = json.loads(SCHEMA.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: dict, node: dict, path: str):
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        if node.get("additionalProperties") is not False:
            return  # a free-form map (labels, Kubernetes objects)
        missing = set(value) - set(node["properties"])
        assert not missing, f"{path or '.'}: no schema for {sorted(missing)}"
        for key, sub in value.items():
            if isinstance(sub, dict):
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


@pytest.mark.parametrize(
    ("option", "field", "why"),
    [
        ("router.replicas=two", "/router/replicas", "want integer"),
        ("operator.replicas=-1", "/operator/replicas", "minimum"),
        ("autoscaler.replicas=0", "/autoscaler/replicas", "minimum"),
        ("operator.metricsPortt=9090", "/operator", "metricsPortt"),
        ("routr.replicas=3", "", "routr"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy", "IfNotPresent"),
        ("router.httpPort=70000", "/router/httpPort", "maximum"),
        ("serviceMonitor.interval=15", "/serviceMonitor/interval", "want string"),
        (
            "prometheusRules.insufficientCapacityFor=ten minutes",
            "/prometheusRules/insufficientCapacityFor",
            "",
        ),
        ("prometheusRules.router5xxRatio=5", "/prometheusRules/router5xxRatio", "maximum"),
        ("prometheusUrl=prometheus:9090", "/prometheusUrl", "pattern"),
        ("router.redisUrl=localhost:6379", "/router/redisUrl", "pattern"),
        ("operator.peering.enabled=yes", "/operator/peering/enabled", "want boolean"),
        ("operator.resources.request.cpu=1", "/operator/resources", "request"),
        ("operator.watchNamespaces={Team_A}", "/operator/watchNamespaces/0", "pattern"),
        ("router.epp.port=0", "/router/epp/port", "minimum"),
        ("inferencePool.failureMode=Open", "/inferencePool/failureMode", "FailClose"),
    ],
)
def test_a_wrong_value_is_refused_naming_the_field(option, field, why):
    result = template(option)
    assert result.returncode != 0, f"--set {option} was accepted"
    assert "schema" in result.stderr and f"at '{field}'" in result.stderr and why in result.stderr, (
        result.stderr
    )


@pytest.mark.parametrize(
    "option",
    [
        "router.image=registry.example.com/tokenyard:dev",
        "operator.image.tag=0.2.0",
        "operator.podDisruptionBudget.maxUnavailable=50%",
        "router.redisUrl=redis://redis.tokenyard-system:6379/0",
        "operator.prometheusUrl=https://thanos.example.com",
        "router.replicas=0",
    ],
)
def test_legitimate_overrides_pass(option):
    result = template(option)
    assert result.returncode == 0, result.stderr
