"""Every query of every panel of every dashboard in charts/tokenyard/dashboards/ returns data from a live Prometheus.

The stack is `make demo`'s (tokenyard.devcluster.stack: operator, simulated engines, router, autoscaler, and a real
Prometheus with the chart's plain-Prometheus scrape configuration), with a shorter load cycle, and the events that
some panels wait for: a canary rollout with a shadow step and an analysis on a second ModelDeployment (under its own
steady load), a group whose pod is deleted (recreated whole), and a ModelDeployment no NVLink domain can hold.

Each dashboard template variable is resolved as Grafana would resolve "All" (its label_values query, against the
same Prometheus), and each query runs as a range query over the test's window, as a panel does over its time
range: it must return at least one series with at least one number.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
import urllib.request
import uuid

import pytest
from kubernetes import client
from tokenyard.core import labels
from tokenyard.devcluster import prometheus
from tokenyard.devcluster.cluster import DevCluster
from tokenyard.devcluster.load import LoadGenerator, RateCycle
from tokenyard.devcluster.stack import Stack, demo_deployment, merged

from tests.dashboards import (
    load_dashboards,
    panel_queries,
    parse_label_values,
    query_variables,
    regex_of,
    substitute,
)
from tests.integration.conftest import OPERATOR_ENV, wait_for

pytestmark = pytest.mark.integration

DASHBOARDS = load_dashboards()
QUERIES = panel_queries(DASHBOARDS)
VARIABLES = [(name, variable["name"]) for name, d in DASHBOARDS.items() for variable in query_variables(d)]
SCRAPE_INTERVAL_S = 1
STEP_S = 2
# Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)
BUILTINS = {
    "__rate_interval": f"{max(STEP_S + SCRAPE_INTERVAL_S, 4 * SCRAPE_INTERVAL_S)}s",
    "__interval": f"{STEP_S}s",
}

CANARY = "canary"
TOO_BIG = "too-big"


def _has_a_number(result: list[dict]) -> bool:
    return any(not math.isnan(float(value)) for series in result for _, value in series["values"])


def _label_values(url: str, selector: str | None, label: str, start: float, end: float) -> list[str]:
    """Grafana's label_values(selector, label) over the time range: the label's values on matching series."""
    params = [("start", start), ("end", end)] + ([("match[]", selector)] if selector else [])
    address = f"{url}/api/v1/label/{label}/values?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(address, timeout=30) as response:
        return json.loads(response.read())["data"]


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory):
    """A control plane of this module's own: the stack's cluster-wide components (a cluster-scoped operator,
    the autoscaler, the sim pod runner, kwok stages it leaves behind) and the ModelDeployments it leaves with
    their finalizers would otherwise share the session's cluster with later tests (a later operator's groups
    were seen stuck at "2 of 3 ready" with the pods Ready, after this module ran in the same cluster)."""
    cluster = DevCluster(tmp_path_factory.mktemp("dashboards-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def live(own_cluster, tmp_path_factory):
    """The stack after one load cycle and the events; yields what the tests read."""
    devcluster = own_cluster
    namespace = f"dash-{uuid.uuid4().hex[:6]}"
    stack = Stack(
        devcluster, tmp_path_factory.mktemp("dashboards-live"), namespace=namespace, operator_env=OPERATOR_ENV
    )
    custom = client.CustomObjectsApi(devcluster.api())
    core = client.CoreV1Api(devcluster.api())
    loads: list[LoadGenerator] = []
    observed = {"peak": 0, "final": None}
    try:
        stack.start(say=lambda _text: None)
        started = time.time()
        name, model = stack.apply_demo_model(replicas=1)

        def get(mdep: str) -> dict:
            return custom.get_namespaced_custom_object(
                labels.GROUP, labels.VERSION, namespace, "modeldeployments", mdep
            )

        # a second, steady model for the rollout, and one that no NVLink domain (16 GPUs) can hold
        canary = merged(
            demo_deployment(replicas=1),
            {
                "metadata": {"name": CANARY},
                "spec": {"model": {"servedModelName": CANARY}, "parallelism": {"tensor": 1}},
            },
        )
        stack.kubectl.apply(canary, namespace)
        too_big = merged(
            demo_deployment(replicas=1),
            # its own model name: two ModelDeployments serving one name would share the router's model
            {
                "metadata": {"name": TOO_BIG},
                "spec": {"model": {"servedModelName": TOO_BIG}, "parallelism": {"tensor": 32}},
            },
        )
        stack.kubectl.apply(too_big, namespace)
        wait_for(
            lambda: stack.groups(name)[1] >= 1 and stack.groups(CANARY)[1] >= 1, 90, what="the first groups"
        )

        completions = f"{stack.router_url}/v1/completions"
        wait_for(
            lambda: _answers(completions, model) and _answers(completions, CANARY), 60, what="the router"
        )
        loads.append(LoadGenerator(completions, model, RateCycle(0.5, 8.0, 60.0, cycles=1)).start())
        loads.append(LoadGenerator(completions, CANARY, RateCycle(3.0, 3.0, 60.0), seed=2).start())

        # the canary: a new revision with a shadow step, a traffic split and an analysis, then a pause that holds
        custom.patch_namespaced_custom_object(
            labels.GROUP,
            labels.VERSION,
            namespace,
            "modeldeployments",
            CANARY,
            {
                "spec": {
                    "engine": {"args": [*canary["spec"]["engine"]["args"], "--max-num-batched-tokens=4096"]},
                    "rollout": {
                        "strategy": "Canary",
                        "analysis": {"minRequests": 10, "intervalSeconds": 2},
                        "steps": [
                            {"shadow": {"fraction": 0.5, "durationSeconds": 10}},
                            {"setWeight": 50},
                            {"analysis": {"timeoutSeconds": 30}},
                            {"pause": {}},
                        ],
                    },
                }
            },
        )

        def desired_groups() -> int:
            stack.check_alive()
            desired = stack.groups(name)[0]
            observed["peak"] = max(observed["peak"], desired)
            return desired

        wait_for(lambda: desired_groups() >= 2, 60, interval=1, what="the load to scale the example out")

        # a group whose leader pod goes is recreated whole
        (leader,) = core.list_namespaced_pod(
            namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}={CANARY},{labels.ROLE}={labels.ROLE_LEADER}"
        ).items[:1]
        core.delete_namespaced_pod(leader.metadata.name, namespace)

        wait_for(
            lambda: desired_groups() == 1,
            150,
            interval=1,
            what="the example to scale back in once the load falls",
        )
        observed["final"] = stack.groups(name)[0]
        wait_for(
            lambda: (get(CANARY).get("status", {}).get("rollout") or {}).get("phase") == "Paused",
            60,
            what="the canary to reach its pause",
        )
        yield {"url": stack.prometheus_url, "start": started, "observed": observed, "namespace": namespace}
    finally:
        for load in loads:
            load.stop()
        stack.stop()


def _answers(url: str, model: str) -> bool:
    body = json.dumps({"model": model, "prompt": "warm up", "max_tokens": 1}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status == 200


@pytest.fixture(scope="module")
def variables(live):
    """Each dashboard's template variables as Grafana resolves "All": every value its query finds."""
    end = time.time()
    resolved: dict[str, dict[str, str]] = {}
    for name, dashboard in DASHBOARDS.items():
        values: dict[str, str] = {"datasource": "prometheus"}
        for variable in query_variables(dashboard):
            selector, label = parse_label_values(variable["query"])
            if selector:
                selector = substitute(selector, values, BUILTINS)
            found = _label_values(live["url"], selector, label, live["start"], end)
            values[variable["name"]] = regex_of(found) if found else ""
        resolved[name] = values
    return resolved


def test_the_load_scales_the_example_out_and_back_in(live):
    assert live["observed"]["peak"] >= 2, live["observed"]
    assert live["observed"]["final"] == 1, live["observed"]


def test_prometheus_finds_engines_and_components_through_the_chart_scrape_config(live):
    up = [t["labels"] for t in prometheus.active_targets(live["url"]) if t["health"] == "up"]
    components = {(target["job"], target.get("container")) for target in up}
    for component in ("operator", "router", "autoscaler"):
        assert (f"tokenyard-{component}", component) in components, components
    engines = {
        (target["namespace"], target.get("model_deployment"))
        for target in up
        if target["job"] == "tokenyard-engines"
    }
    assert {(live["namespace"], "llama-8b"), (live["namespace"], CANARY)} <= engines, engines


@pytest.mark.parametrize(("dashboard", "variable"), VARIABLES, ids=[f"{d}:{v}" for d, v in VARIABLES])
def test_template_variable_finds_values(live, variables, dashboard, variable):
    assert variables[dashboard][variable], f"{dashboard}: variable {variable} found no values"


@pytest.mark.parametrize("query", QUERIES, ids=[q.name for q in QUERIES])
def test_panel_query_returns_data(live, variables, query):
    expr = substitute(
        query.expr,
        variables[query.dashboard],
        {**BUILTINS, "__range": f"{int(time.time() - live['start'])}s"},
    )
    result = prometheus.query_range(live["url"], expr, live["start"], time.time(), STEP_S)
    assert _has_a_number(result), f"{query.name}: no data for {expr}"
