"""The pure parts of `make demo`'s stack: the load's rate and arrivals, the demo's overlays on the examples, and the
chart's plain-Prometheus scrape configuration that the demo runs (same series labels as the chart's PodMonitor,
and it finds the pods that stand for the demo's component processes)."""

from __future__ import annotations

import random
import re

import pytest
import yaml
from tokenyard.core import labels
from tokenyard.devcluster import prometheus
from tokenyard.devcluster.load import RateCycle, arrivals, request_body
from tokenyard.devcluster.stack import (
    DEMO_ENGINE_ARGS,
    EXAMPLE_AUTOSCALER,
    component_pod,
    demo_autoscaler,
    demo_deployment,
    merged,
)

from tests.unit.test_chart import HELM, NAMESPACE, RELEASE, one, render

# ---------------------------------------------------------------------------------------------------------- load


def test_rate_rises_to_the_peak_and_falls_back():
    cycle = RateCycle(low=1.0, peak=9.0, period_s=100.0)
    assert cycle.rate_at(0) == pytest.approx(1.0)
    assert cycle.rate_at(25) == pytest.approx(5.0)
    assert cycle.rate_at(50) == pytest.approx(9.0)
    assert cycle.rate_at(100) == pytest.approx(1.0)
    assert cycle.rate_at(150) == pytest.approx(9.0), "it repeats"
    assert RateCycle(1.0, 9.0, 100.0, cycles=1).rate_at(150) == 1.0, "after its cycles it stays low"


@pytest.mark.parametrize(
    ("low", "peak", "period", "cycles", "message"),
    [
        (2, 1, 10, None, "low <= peak"),
        (0, 0, 10, None, "peak > 0"),
        (0, 1, 0, None, "period_s"),
        (0, 1, 1, 0, "cycles"),
    ],
)
def test_rate_cycle_refuses_what_makes_no_load(low, peak, period, cycles, message):
    with pytest.raises(ValueError, match=message):
        RateCycle(low, peak, period, cycles)


def test_arrivals_follow_the_rate():
    cycle = RateCycle(low=1.0, peak=21.0, period_s=100.0)
    times = []
    for t in arrivals(cycle, random.Random(7)):
        if t >= 1000:
            break
        times.append(t)
    assert times == sorted(times)
    # ten cycles of a mean rate of 11/s; the busiest tenth of each cycle holds far more than the quietest
    assert len(times) == pytest.approx(11_000, rel=0.05)
    peak_tenth = sum(1 for t in times if 45 <= t % 100 < 55)
    quiet_tenth = sum(1 for t in times if t % 100 < 5 or t % 100 >= 95)
    assert peak_tenth > 5 * quiet_tenth


def test_request_body_is_a_completion_without_early_stop():
    body = request_body("m", random.Random(1), prompt_words=50, max_tokens=32, stream=True)
    assert body["model"] == "m" and body["max_tokens"] == 32 and body["ignore_eos"] and body["stream"]
    assert len(body["prompt"].split()) > 50


# ---------------------------------------------------------------------------------------------- demo overlays


def test_merged_overlays_mappings_and_leaves_its_inputs_alone():
    base = {"a": {"b": 1, "c": 2}, "d": [1]}
    assert merged(base, {"a": {"b": 9}, "d": [2]}) == {"a": {"b": 9, "c": 2}, "d": [2]}
    assert base == {"a": {"b": 1, "c": 2}, "d": [1]}


def test_demo_autoscaler_is_the_example_with_seconds_for_minutes():
    example = yaml.safe_load(EXAMPLE_AUTOSCALER.read_text())
    demo = demo_autoscaler()["spec"]
    assert demo["signals"] == example["spec"]["signals"]
    assert demo["scaleTargetRef"] == example["spec"]["scaleTargetRef"]
    # the CRD's cross-field rules
    assert demo["intervalSeconds"] <= demo["panicWindowSeconds"] <= demo["stableWindowSeconds"]


def test_demo_deployment_is_the_example_with_few_sequences_per_engine():
    mdep = demo_deployment(replicas=1)
    assert mdep["spec"]["replicas"] == 1
    assert mdep["spec"]["engine"]["args"][-len(DEMO_ENGINE_ARGS) :] == DEMO_ENGINE_ARGS
    assert mdep["metadata"]["name"] == demo_autoscaler()["spec"]["scaleTargetRef"]["name"]


# ------------------------------------------------------------------------------ the chart's plain scrape config

needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary")


def _meta(pod: dict, port_name: str) -> dict[str, str]:
    """The meta labels Prometheus' Kubernetes pod discovery gives one container port of `pod`."""
    meta = {
        "__meta_kubernetes_namespace": pod["metadata"]["namespace"],
        "__meta_kubernetes_pod_name": pod["metadata"]["name"],
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_container_name": pod["spec"]["containers"][0]["name"],
        "__meta_kubernetes_pod_container_port_name": port_name,
    }
    for key, value in pod["metadata"]["labels"].items():
        meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    return meta


def _relabel(rules: list[dict], meta: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' relabelling for the actions the chart uses (keep, drop, replace); None when dropped."""
    target = dict(meta)
    for rule in rules:
        value = ";".join(target.get(label, "") for label in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            target[rule["target_label"]] = match.expand(rule.get("replacement", "$1").replace("$1", r"\1"))
    return {k: v for k, v in target.items() if not k.startswith("__")}


@pytest.fixture(scope="module")
def scrape_jobs() -> dict[str, dict]:
    return {job["job_name"]: job for job in prometheus.chart_scrape_configs(HELM, NAMESPACE, release=RELEASE)}


@needs_helm
def test_engine_job_labels_series_as_the_pod_monitor_does(scrape_jobs):
    from tokenyard.operator.manifests import GroupNames, group_labels

    leader_labels = {
        **group_labels(GroupNames("llama", "team-a", "abc123", 0)),
        labels.RANK: "0",
        labels.ROLE: labels.ROLE_LEADER,
    }
    leader = {
        "metadata": {"name": "llama-abc123-0-0", "namespace": "team-a", "labels": leader_labels},
        "spec": {"containers": [{"name": "engine"}]},
    }
    worker = {
        **leader,
        "metadata": {**leader["metadata"], "labels": {**leader_labels, labels.ROLE: "worker"}},
    }
    rules = scrape_jobs["tokenyard-engines"]["relabel_configs"]
    series = _relabel(rules, _meta(leader, labels.ENGINE_PORT_NAME))
    assert series is not None, "the engine job does not scrape a group leader"
    assert series["namespace"] == "team-a" and series["model_deployment"] == "llama"
    assert _relabel(rules, _meta(worker, labels.ENGINE_PORT_NAME)) is None, "workers serve no metrics"
    assert _relabel(rules, _meta(leader, "metrics")) is None, "only the engine's http port"

    monitor = one(render(), "PodMonitor", "-engine-monitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    monitor_labels = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert monitor_labels <= series.keys(), "the plain config misses a label the PodMonitor gives"


@needs_helm
def test_components_job_finds_the_demo_pods_and_keeps_their_namespace_label(scrape_jobs):
    job = scrape_jobs["tokenyard-components"]
    assert job["honor_labels"] is True, (
        "the components' own `namespace` label would become exported_namespace"
    )
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": [NAMESPACE]}}]
    for component in ("operator", "router", "autoscaler"):
        pod = component_pod(component, {"metrics": 9090, "http": 8080})
        pod["metadata"]["namespace"] = NAMESPACE
        pod["metadata"]["labels"]["app.kubernetes.io/instance"] = RELEASE
        series = _relabel(job["relabel_configs"], _meta(pod, "metrics"))
        assert series == {
            "namespace": NAMESPACE,
            "pod": pod["metadata"]["name"],
            "container": component,
            "job": f"{RELEASE}-{component}",
        }
        assert _relabel(job["relabel_configs"], _meta(pod, "http")) is None


@needs_helm
def test_out_of_cluster_points_every_discovery_at_the_api_server(scrape_jobs):
    jobs = list(scrape_jobs.values())
    adapted = prometheus.out_of_cluster(jobs, "https://127.0.0.1:6443", "token")
    for job in adapted:
        for discovery in job["kubernetes_sd_configs"]:
            assert discovery["api_server"] == "https://127.0.0.1:6443"
            assert discovery["authorization"] == {"credentials": "token"}
    assert all("api_server" not in d for job in jobs for d in job["kubernetes_sd_configs"]), "input changed"


@needs_helm
def test_scrape_config_is_rendered_only_when_asked(scrape_jobs):
    assert not [o for o in render() if o["metadata"]["name"].endswith("-prometheus-scrape-config")]
    config_map = one(render("prometheusScrapeConfig.enabled=true"), "ConfigMap", "-prometheus-scrape-config")
    assert yaml.safe_load(config_map["data"][prometheus.SCRAPE_FILE_KEY])["scrape_configs"]


# ------------------------------------------------------------------------------------------ pod IP ranges


def test_a_new_cluster_takes_a_pod_range_where_nothing_listens(monkeypatch):
    """Two local clusters with one pod range would put their engines on the same 127.x addresses."""
    import socket

    from tokenyard.devcluster import cluster

    offered: list[list[int]] = []
    monkeypatch.setattr(cluster.random, "choice", lambda seq: offered.append(list(seq)) or seq[0])
    with socket.create_server(("127.77.0.1", 0)):
        cidr = cluster.unused_pod_cidr()
    (candidates,) = offered
    assert 77 not in candidates and 0 not in candidates and 96 not in candidates
    assert cidr == f"127.{candidates[0]}.0.0/16"
