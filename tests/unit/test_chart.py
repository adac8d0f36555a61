"""The Helm chart (charts/tokenyard) rendered by the real helm binary: lint, object shape, least-privilege RBAC
derived from the operator's own API calls, the operator's arguments accepted by its real CLI, and dashboards and
alerts that only name metrics the code defines.

Needs the helm binary of the local toolchain (`python -m tokenyard.devcluster binaries` builds it); skipped with
the reason when it is missing. A handful of `helm template` runs: a few seconds in all.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from tokenyard.devcluster.binaries import BinaryError, cache_dir, ensure_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tokenyard"
RELEASE, NAMESPACE = "ty", "tokenyard-system"
MONITORING_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1/PodMonitor",
)
KUBE_VERSION = "1.35.4"
# Where the metric names are defined: every Python source of the components (prometheus_client constructors).
METRIC_SOURCES = [ROOT / c for c in ("operator", "router", "autoscaler", "sim", "core")]
METRIC_PREFIXES = ("tokenyard_", "vllm:")
# Series every Prometheus has without any code of ours.
PROMETHEUS_BUILTINS = {"up"}


def _find_helm() -> Path | None:
    try:
        return ensure_binaries(build=False).helm
    except BinaryError:
        pass  # another binary may be missing; helm alone is enough here
    candidate = cache_dir() / "helm"
    if candidate.is_file():
        return candidate
    found = shutil.which("helm")
    return Path(found) if found else None


HELM = _find_helm()
pytestmark = pytest.mark.skipif(
    HELM is None,
    reason=f"no helm binary in {cache_dir()} or on PATH: build it with `python -m tokenyard.devcluster binaries`",
)


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)


@cache
def render(*options: str, monitoring: bool = True) -> tuple[dict, ...]:
    """`helm template` of the chart with `--set` options; the objects it renders, in order."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if monitoring:
        for api in MONITORING_APIS:
            args += ["--api-versions", api]
    for option in options:
        args += ["--set", option]
    result = helm(*args)
    assert result.returncode == 0, f"helm template {' '.join(options)} failed:\n{result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects_of(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str, name_suffix: str = "") -> dict:
    found = [d for d in objects_of(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (
        f"expected one {kind} named *{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def operator_container(docs) -> dict:
    workloads = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith("-operator")
    ]
    assert len(workloads) == 1, "expected exactly one operator workload"
    return workloads[0]["spec"]["template"]["spec"]["containers"][0]


# ----------------------------------------------------------------------------------------------- lint & shape


@pytest.mark.parametrize(
    "options",
    [
        (),
        # the other side of each template branch: standalone operator, namespaced peering, Redis, overrides
        ("operator.peering.enabled=false", "autoscaler.enabled=false", "grafanaDashboards.enabled=false"),
        ("operator.watchNamespaces={a,b}", "router.redisUrl=redis://redis:6379/0", "autoscaler.image=x/y:1"),
    ],
)
def test_helm_lint_passes_strict(options):
    sets = [arg for option in options for arg in ("--set", option)]
    result = helm("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *sets)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("monitoring", [True, False])
def test_every_object_is_well_formed_and_unique(monitoring):
    docs = render(monitoring=monitoring)
    seen = set()
    for doc in docs:
        assert doc.get("apiVersion"), f"object without apiVersion: {doc}"
        assert doc.get("kind"), f"object without kind: {doc}"
        name = doc.get("metadata", {}).get("name")
        assert name, f"{doc['kind']} without metadata.name"
        assert len(name) <= 63, f"{doc['kind']} {name}: longer than a DNS label"
        key = (doc["apiVersion"], doc["kind"], doc["metadata"].get("namespace"), name)
        assert key not in seen, f"rendered twice: {key}"
        seen.add(key)


def test_monitoring_objects_follow_the_cluster_capabilities_and_the_values():
    kinds_with = {d["kind"] for d in render()}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds_with
    kinds_without = {d["kind"] for d in render(monitoring=False)}
    assert not {"ServiceMonitor", "PrometheusRule"} & kinds_without, (
        "monitoring.coreos.com objects without the CRDs"
    )
    switched_off = render("serviceMonitor.enabled=false", "prometheusRules.enabled=false")
    assert not [
        d
        for d in switched_off
        if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-operator")
    ]
    assert not objects_of(switched_off, "PrometheusRule")


# ----------------------------------------------------------------------------------------------- RBAC

# kubernetes_asyncio method -> (API group, resource) of the objects it touches; verbs from the method's prefix.
_CORE_CALL = re.compile(
    r"\.(create|delete|patch|replace|read|list)_namespaced_(pod|service|event|config_map)\("
)
_CUSTOM_CALL = re.compile(
    r"\.(create|delete|patch|replace|get|list)_(?:namespaced|cluster)_custom_object(_status|_scale)?\(\s*"
    r"keys\.GROUP,\s*keys\.VERSION,(?:\s*\w+,)?\s*\"(\w+)\""
)
# The InferencePool calls (kube_writes.InferencePools), granted only with inferencePool.enabled.
_POOL_CALL = re.compile(
    r"\.(create|delete|patch|replace|get|list)_namespaced_custom_object\(\s*POOL_GROUP,\s*POOL_VERSION,"
)
POOL_RESOURCE = ("inference.networking.k8s.io", "inferencepools")
_OTHER_CALL = re.compile(r"\.((?:create|delete|patch|replace|read|list)_\w+)\(")
_VERB = {
    "create": "create",
    "delete": "delete",
    "patch": "patch",
    "replace": "update",
    "read": "get",
    "get": "get",
    "list": "list",
}
_PLURAL = {"pod": "pods", "service": "services", "event": "events", "config_map": "configmaps"}
# Kopf handlers on a resource (index, watch, daemon, timer, change handlers) list and watch it.
_KOPF_RESOURCE = re.compile(
    r"@kopf\.(?:index|daemon|timer|on\.\w+)\(\s*(?:keys\.GROUP,\s*keys\.VERSION,\s*)?\"(\w+)\""
)


def operator_process_modules() -> list[Path]:
    """The operator's modules that `python -m tokenyard.operator` imports (not, say, the kubectl plug-in)."""
    folder = ROOT / "operator" / "tokenyard" / "operator"
    seen: set[str] = set()
    pending = ["__main__"]
    while pending:
        module = pending.pop()
        if module in seen or not (folder / f"{module}.py").is_file():
            continue
        seen.add(module)
        tree = ast.parse((folder / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "tokenyard.operator":
                pending += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokenyard.operator."):
                pending.append(node.module.rsplit(".", 1)[1])
    assert "handlers" in seen, f"the operator's entry point no longer imports its handlers: {sorted(seen)}"
    return [folder / f"{m}.py" for m in sorted(seen)]


def operator_api_needs() -> set[tuple[str, str, str]]:
    """(group, resource, verb) for every Kubernetes call in the operator's source and every resource Kopf watches."""
    needs: set[tuple[str, str, str]] = set()
    for path in operator_process_modules():
        source = path.read_text()
        for verb, kind in _CORE_CALL.findall(source):
            needs.add(("", _PLURAL[kind], _VERB[verb]))
        for verb, sub, plural in _CUSTOM_CALL.findall(source):
            needs.add(("tokenyard.dev", plural + (f"/{sub[1:]}" if sub else ""), _VERB[verb]))
        for resource in _KOPF_RESOURCE.findall(source):
            group = "tokenyard.dev" if resource in ("modeldeployments", "inferenceautoscalers") else ""
            needs |= {(group, resource, "list"), (group, resource, "watch")}
        for verb in _POOL_CALL.findall(source):
            needs.add((*POOL_RESOURCE, _VERB[verb]))
            if verb == "patch" and "application/apply-patch" in source:
                needs.add((*POOL_RESOURCE, "create"))  # a server-side apply that creates needs create too
        if "kopf.info(" in source or "kopf.warn(" in source or "kopf.event(" in source:
            needs.add(("", "events", "create"))
        known = (
            {m.group(0) for m in _CORE_CALL.finditer(source)}
            | {m.group(0) for m in _CUSTOM_CALL.finditer(source)}
            | {m.group(0) for m in _POOL_CALL.finditer(source)}
        )
        for match in _OTHER_CALL.finditer(source):
            name = match.group(1)
            if "namespaced" in name or "custom_object" in name or name.startswith(("list_node", "read_node")):
                assert any(name in k for k in known), (
                    f"{path.name}: API call {name}() is not mapped to a permission in tests/unit/test_chart.py; "
                    "map it here and grant it in templates/operator-rbac.yaml"
                )
    return needs


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def test_operator_cluster_role_has_no_wildcards_and_no_secrets():
    role = one(render(), "ClusterRole", "-operator")
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), f"wildcard in {field}: {rule}"
        assert "secrets" not in rule["resources"], f"the operator reads no secrets: {rule}"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), f"privilege verbs: {rule}"


def test_operator_cluster_role_grants_every_call_the_operator_makes():
    needs = operator_api_needs()
    assert ("", "pods", "create") in needs and (
        "tokenyard.dev",
        "modeldeployments/status",
        "patch",
    ) in needs, f"the source scan found too little: {sorted(needs)}"
    # Kopf itself: finalizer and progress annotations on the ModelDeployments.
    needs.add(("tokenyard.dev", "modeldeployments", "patch"))
    pool_needs = {n for n in needs if n[:2] == POOL_RESOURCE}
    assert {v for *_, v in pool_needs} == {"get", "create", "patch"}, (
        f"InferencePool calls: {sorted(pool_needs)}"
    )
    kopf_framework = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    pools_on = ("router.epp.enabled=true", "inferencePool.enabled=true")
    for options, expected in (((), needs - pool_needs), (pools_on, needs)):
        grants = granted(one(render(*options), "ClusterRole", "-operator")["rules"])
        missing = expected - grants
        assert not missing, f"operator ClusterRole ({options}) lacks {sorted(missing)}"
        # Least privilege: nothing beyond the code's needs, Kopf's CRD observation and Kopf peering.
        extra = {g for g in grants - expected - kopf_framework if g[0] != "kopf.dev"}
        assert not extra, f"operator ClusterRole ({options}) grants more than the code uses: {sorted(extra)}"


def test_peering_rbac_is_narrowed_to_the_release_peering_object():
    rules = one(render(), "ClusterRole", "-operator")["rules"]
    peering = [r for r in rules if r["apiGroups"] == ["kopf.dev"]]
    named = [r for r in peering if "patch" in r["verbs"]]
    assert named and all(r.get("resourceNames") == ["tokenyard"] for r in named), peering
    standalone = one(render("operator.peering.enabled=false"), "ClusterRole", "-operator")["rules"]
    assert not [r for r in standalone if "kopf.dev" in r["apiGroups"]], "standalone needs no peering access"
    namespaced = one(render("operator.watchNamespaces={ml,research}"), "ClusterRole", "-operator")["rules"]
    assert ("kopf.dev", "kopfpeerings", "patch") in granted(namespaced)
    assert ("", "namespaces", "watch") in granted(namespaced)


# ----------------------------------------------------------------------------------------------- operator workload


def _cli_args(container: dict) -> list[str]:
    """The container's arguments after `tokenyard operator`, with $(VAR) expanded as the kubelet does."""
    env = {e["name"]: e.get("value", "7") for e in container["env"]}  # fieldRef values stand in as 7
    command = container.get("command", []) + container["args"]
    assert command[:2] == ["tokenyard", "operator"], command
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in command[2:]]


def test_peering_mode_is_a_statefulset_whose_ordinal_is_the_priority():
    docs = render()
    workload = one(docs, "StatefulSet", "-operator")
    assert workload["spec"]["replicas"] == 2
    container = operator_container(docs)
    priority_env = next(e for e in container["env"] if e["name"] == "TOKENYARD_PEERING_PRIORITY")
    assert (
        priority_env["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    from tokenyard.operator.__main__ import parse_args

    parsed = parse_args(_cli_args(container))
    assert (parsed.peering, parsed.priority, parsed.metrics_host) == ("tokenyard", 7, "0.0.0.0")
    peering = one(docs, "ClusterKopfPeering", "tokenyard")
    assert peering["apiVersion"] == "kopf.dev/v1"


def test_standalone_mode_is_one_recreated_replica():
    docs = render("operator.peering.enabled=false", "operator.replicas=3")
    workload = one(docs, "Deployment", "-operator")
    assert workload["spec"]["replicas"] == 1
    assert workload["spec"]["strategy"] == {"type": "Recreate"}
    assert not objects_of(docs, "ClusterKopfPeering")
    from tokenyard.operator.__main__ import parse_args

    parsed = parse_args(_cli_args(operator_container(docs)))
    assert parsed.peering is None and parsed.standalone


def test_inference_pools_name_the_router_epp_port_the_chart_renders():
    """inferencePool.enabled: the operator's settings, read from its rendered env as it reads them at start-up,
    name a router Service of the release with a port `epp` that reaches the router container's `epp` port."""
    from tokenyard.operator.settings import OperatorSettings

    docs = render("router.epp.enabled=true", "router.epp.port=9100", "inferencePool.enabled=true")
    env = {e["name"]: e["value"] for e in operator_container(docs)["env"] if "value" in e}
    settings = OperatorSettings.from_environment(env)
    assert settings.inference_pool == "auto"
    picker = settings.endpoint_picker
    service = one(docs, "Service", picker.service)
    assert service["metadata"]["name"] == picker.service
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "epp"]
    assert (port["port"], port["targetPort"], port["appProtocol"]) == (
        picker.port,
        "epp",
        "kubernetes.io/h2c",
    )
    router = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "epp", "containerPort": 9100} in router["ports"]
    assert "--epp-port=9100" in router["args"]


def test_inference_pools_and_the_epp_port_are_off_by_default_and_need_each_other():
    docs = render()
    env = {e["name"]: e.get("value") for e in operator_container(docs)["env"]}
    assert env["TOKENYARD_INFERENCE_POOL"] == "off"
    router = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in router["args"] if a.startswith("--epp-port")]
    assert "epp" not in {p["name"] for p in one(docs, "Service", "-router")["spec"]["ports"]}
    args = [
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "inferencePool.enabled=true",
    ]
    refused = helm(*args)
    assert refused.returncode != 0 and "inferencePool.enabled needs router.epp.enabled" in refused.stderr


def test_operator_pod_is_locked_down_and_probed_on_kopf_liveness():
    docs = render()
    container = operator_container(docs)
    pod = one(docs, "StatefulSet", "-operator")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness_arg = next(a for a in container["args"] if a.startswith("--liveness="))
    assert liveness_arg == f"--liveness=http://0.0.0.0:{ports['liveness']}/healthz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert f"--metrics-port={ports['metrics']}" in container["args"]


def test_services_and_budget_select_the_operator_pods():
    docs = render()
    pod_labels = one(docs, "StatefulSet", "-operator")["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", "-operator-metrics")
    budget = one(docs, "PodDisruptionBudget", "-operator")
    monitor = one(docs, "ServiceMonitor", "-operator")
    for selector in (
        service["spec"]["selector"],
        budget["spec"]["selector"]["matchLabels"],
        monitor["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pod_labels.items(), (
            f"{selector} does not select the operator pods {pod_labels}"
        )
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # Router pods carry the same instance label: the operator's selectors must not catch them.
    router_labels = one(docs, "Deployment", "-router")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= router_labels.items()


# ----------------------------------------------------------------------------------------------- dashboards & alerts


@cache
def defined_metric_names() -> frozenset[str]:
    names = set()
    literal = re.compile(r"[\"']((?:tokenyard_|vllm:)[A-Za-z0-9_:]+)[\"']")
    for folder in METRIC_SOURCES:
        for path in folder.rglob("*.py"):
            names.update(literal.findall(path.read_text()))
    return frozenset(names)


def undefined_metrics(promql: str) -> set[str]:
    """Metric names of our prefixes (and bare identifiers before a selector) that no Python source defines."""
    defined = defined_metric_names()
    used = set(re.findall(r"\b(?:tokenyard_|vllm:)[A-Za-z0-9_:]+", promql))
    missing = set()
    for name in used:
        base = re.sub(r"_(bucket|sum|count|created)$", "", name)
        if not ({name, base, name.removesuffix("_total")} & defined):
            missing.add(name)
    for name in re.findall(r"(?<![\w:$\"])([a-z_][a-z0-9_]*)\{", promql):
        if not name.startswith(METRIC_PREFIXES) and name not in PROMETHEUS_BUILTINS:
            missing.add(name)
    return missing


def dashboard_files() -> list[Path]:
    return sorted((CHART / "dashboards").glob("*.json"))


def test_operator_dashboard_exists_with_the_issue_panels():
    panels = json.loads((CHART / "dashboards" / "operator.json").read_text())["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    for metric in (
        "tokenyard_operator_groups{",
        "tokenyard_operator_placement_seconds_bucket",
        "tokenyard_operator_pending_groups",
        "tokenyard_operator_gpus",
        "tokenyard_operator_reconcile_errors_total",
        "tokenyard_operator_groups_recreated_total",
    ):
        assert metric in exprs, f"operator dashboard has no panel on {metric}"
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs


@pytest.mark.parametrize("path", dashboard_files(), ids=lambda p: p.name)
def test_dashboard_is_valid_and_names_only_defined_metrics(path):
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            missing = undefined_metrics(target["expr"])
            assert not missing, (
                f"{path.name} panel {panel['title']!r} queries undefined metrics {sorted(missing)}"
            )


def test_every_dashboard_ships_in_a_labelled_config_map():
    maps = [
        d
        for d in objects_of(render(), "ConfigMap")
        if d["metadata"]["name"].startswith(f"{RELEASE}-dashboard-")
    ]
    shipped = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        for key, text in config_map["data"].items():
            shipped[key] = json.loads(text)
    expected = {f"tokenyard-{p.stem}.json": json.loads(p.read_text()) for p in dashboard_files()}
    assert shipped == expected


def test_alert_rules_name_only_defined_metrics():
    rule_object = one(render(), "PrometheusRule", "-alerts")
    alerts = [rule for group in rule_object["spec"]["groups"] for rule in group["rules"]]
    names = {a["alert"] for a in alerts}
    assert {"TokenyardInsufficientCapacity", "TokenyardReconcileErrors", "TokenyardRouter5xxRatio"} <= names
    capacity = next(a for a in alerts if a["alert"] == "TokenyardInsufficientCapacity")
    assert capacity["for"] == "10m"
    for alert in alerts:
        missing = undefined_metrics(alert["expr"])
        assert not missing, f"alert {alert['alert']} queries undefined metrics {sorted(missing)}"
        # Prometheus' own templates must survive Helm's: the annotations keep {{ $labels.x }} / {{ $value }}.
        assert "{{ $" in alert["annotations"]["summary"] + alert["annotations"]["description"], alert["alert"]


# ----------------------------------------------------------------------------------------------- PromQL syntax

PROMTOOL = shutil.which("promtool")
# Grafana's variables, replaced by values Prometheus accepts so that promtool can parse the queries.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promtool_check_rules(groups: list[dict], tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH (Debian package prometheus)")
def test_alert_rules_pass_promtool(tmp_path):
    promtool_check_rules(one(render(), "PrometheusRule", "-alerts")["spec"]["groups"], tmp_path)


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH (Debian package prometheus)")
def test_dashboard_queries_parse(tmp_path):
    rules = []
    for path in dashboard_files():
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                expr = re.sub(r"\$\{?\w+\}?", ".*", expr)  # template variables: used in =~ matchers
                rules.append(
                    {"record": f"dashboard:{path.stem}:panel{panel['id']}{target['refId']}", "expr": expr}
                )
    assert rules
    promtool_check_rules([{"name": "dashboards", "rules": rules}], tmp_path)


# ----------------------------------------------------------------------------------------------- engine PodMonitor


def _prometheus_label(pod_label: str) -> str:
    """The meta label Prometheus' Kubernetes discovery makes of a pod label (every invalid character -> _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def test_engine_pod_monitor_scrapes_group_leaders_with_the_labels_the_autoscaler_selects():
    from tokenyard.autoscaler.prometheus import DEFAULT_SELECTOR
    from tokenyard.core import labels
    from tokenyard.operator.manifests import GroupNames, group_labels

    monitor = one(render(), "PodMonitor", "-engine-monitor")
    leader = {
        **group_labels(GroupNames("llama", "team-a", "abc123", 0)),
        labels.RANK: "0",
        labels.ROLE: labels.ROLE_LEADER,
    }
    worker = {**leader, labels.RANK: "1", labels.ROLE: labels.ROLE_WORKER}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= leader.items(), "the PodMonitor does not select the operator's leader pods"
    assert not selector.items() <= worker.items(), "workers serve no engine metrics; they must not be scraped"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == labels.ENGINE_PORT_NAME and endpoint["path"] == "/metrics"
    copied = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    # Every series label the default PromQL selects on, except `namespace` (the Prometheus Operator sets it).
    selected = set(re.findall(r"(\w+)=", DEFAULT_SELECTOR)) - {"namespace"}
    assert selected == {"model_deployment"} and selected <= copied.keys()
    assert copied["model_deployment"] == [_prometheus_label(labels.MODEL_DEPLOYMENT)]
    assert copied["revision"] == [_prometheus_label(labels.REVISION)]


def test_engine_pod_monitor_follows_its_flag_the_capabilities_and_the_namespaces():
    assert not objects_of(render("enginePodMonitor.enabled=false"), "PodMonitor")
    assert not objects_of(render(monitoring=False), "PodMonitor")
    narrowed = one(render("enginePodMonitor.namespaces={team-a,team-b}"), "PodMonitor", "-engine-monitor")
    assert narrowed["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


# ----------------------------------------------------------------------------------------------- alerts and panels
# that must not lie on a default install (issue 16)


def _alert_names(*options: str) -> set[str]:
    rule_object = one(render(*options), "PrometheusRule", "-alerts")
    return {rule.get("alert") for group in rule_object["spec"]["groups"] for rule in group["rules"]}


def test_redis_down_alert_exists_only_when_the_routers_have_a_redis():
    # tokenyard_router_redis_up is 0 on a router without Redis as well: on the default install (no Redis) an
    # alert on it would fire forever.
    assert "TokenyardRouterRedisDown" not in _alert_names()
    assert "TokenyardRouterRedisDown" in _alert_names("router.redisUrl=redis://redis:6379/0")
    assert "TokenyardRouterRedisDown" in _alert_names("router.extraArgs={--redis-url=redis://redis:6379/0}")


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH (Debian package prometheus)")
def test_alert_rules_with_redis_pass_promtool(tmp_path):
    rules = one(render("router.redisUrl=redis://redis:6379/0"), "PrometheusRule", "-alerts")
    promtool_check_rules(rules["spec"]["groups"], tmp_path)


def _panel_expr(dashboard: str, title: str, ref_id: str = "A") -> str:
    panels = json.loads((CHART / "dashboards" / dashboard).read_text())["panels"]
    (panel,) = [p for p in panels if p["title"] == title]
    (target,) = [t for t in panel["targets"] if t["refId"] == ref_id]
    expr = target["expr"]
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def run_promtool_test(test: dict, tmp_path: Path) -> None:
    test_file = tmp_path / "panel_test.yaml"
    test_file.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH (Debian package prometheus)")
def test_redis_panel_and_alert_tell_down_from_not_configured(tmp_path):
    """Three routers: one without Redis (the default install), one sharing, one whose Redis is down. The panel
    shows 0, 2 and 1, and the alert fires for the third only."""
    rules = one(render("router.redisUrl=redis://redis:6379/0"), "PrometheusRule", "-alerts")
    (redis_down,) = [
        rule
        for group in rules["spec"]["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "TokenyardRouterRedisDown"
    ]
    (tmp_path / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "redis", "rules": [redis_down]}]})
    )
    gauge = '{}{{namespace="team-a", pod="{}"}}'
    state = {"alone": (0, 0), "sharing": (1, 1), "cut-off": (1, 0)}
    test = {
        "rule_files": [str(tmp_path / "rules.yaml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": gauge.format(metric, pod), "values": f"{value}x15"}
                    for pod, (configured, up) in state.items()
                    for metric, value in (
                        ("tokenyard_router_redis_configured", configured),
                        ("tokenyard_router_redis_up", up),
                    )
                ],
                "promql_expr_test": [
                    {
                        "expr": _panel_expr("router.json", "State sharing through Redis (per router pod)"),
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": '{namespace="team-a", pod="alone"}', "value": 0},
                            {"labels": '{namespace="team-a", pod="sharing"}', "value": 2},
                            {"labels": '{namespace="team-a", pod="cut-off"}', "value": 1},
                        ],
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "TokenyardRouterRedisDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "namespace": "team-a",
                                    "pod": "cut-off",
                                    **redis_down["labels"],
                                },
                                "exp_annotations": {
                                    key: re.sub(r"\{\{\s*\$labels\.pod\s*\}\}", "cut-off", text)
                                    for key, text in redis_down["annotations"].items()
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    run_promtool_test(test, tmp_path)


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool on PATH (Debian package prometheus)")
def test_shadow_mismatch_panel_reads_zero_before_the_first_mismatch(tmp_path):
    """The match="false" series is born at the first mismatch: until then the ratio must read 0, not no data."""
    series = 'tokenyard_router_shadow_output_match_total{{namespace="team-a", model="llama", revision="{}", match="{}"}}'
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # r1: shadow pairs, every output equal; r2: one pair in four differs
                    {"series": series.format("r1", "true"), "values": "0+12x15"},
                    {"series": series.format("r2", "true"), "values": "0+9x15"},
                    {"series": series.format("r2", "false"), "values": "0+3x15"},
                ],
                "promql_expr_test": [
                    {
                        "expr": _panel_expr("router.json", "Shadow greedy output mismatch ratio"),
                        "eval_time": "10m",
                        "exp_samples": [
                            {"labels": '{revision="r1"}', "value": 0},
                            {"labels": '{revision="r2"}', "value": 0.25},
                        ],
                    }
                ],
            }
        ],
    }
    run_promtool_test(test, tmp_path)
