"""The operator's metrics: declared on an injected registry, under the names the dashboard and alerts read."""

from prometheus_client import CollectorRegistry
from tokenyard.operator.groups import GroupView, MemberView
from tokenyard.operator.metrics import ROLLOUT_PHASES, OperatorMetrics, gpu_states, group_phase_counts
from tokenyard.operator.placement import GroupShape, Node
from tokenyard.operator.rollout import Phase, RolloutState


def _samples(family):
    return [s for m in family.collect() for s in m.samples]


def value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels)


def test_two_instances_on_their_own_registries_do_not_collide():
    first, second = OperatorMetrics(CollectorRegistry()), OperatorMetrics(CollectorRegistry())
    first.reconcile_errors.labels("ns", "llm").inc()
    assert value(first, "tokenyard_operator_reconcile_errors_total", namespace="ns", deployment="llm") == 1
    assert (
        value(second, "tokenyard_operator_reconcile_errors_total", namespace="ns", deployment="llm") is None
    )


def test_the_metric_names_are_unchanged():
    metrics = OperatorMetrics()
    names = {family.name for family in metrics.registry.collect()}
    assert names == {
        "tokenyard_operator_groups",
        "tokenyard_operator_pending_groups",
        "tokenyard_operator_placement_seconds",
        "tokenyard_operator_gpus",
        "tokenyard_operator_reconcile_errors",  # a counter's family name drops _total
        "tokenyard_operator_groups_recreated",
        "tokenyard_rollout_phase",
        "tokenyard_rollout_step",
        "tokenyard_rollout_traffic_weight",
        "tokenyard_rollout_analysis_statistic",
        "tokenyard_rollout_analysis_threshold",
        "tokenyard_rollout_transitions",
    }


def test_forgetting_a_deployment_drops_only_its_series():
    metrics = OperatorMetrics()
    metrics.pending_groups.labels("ns", "gone", "InsufficientCapacity").set(1)
    metrics.pending_groups.labels("ns", "kept", "InsufficientCapacity").set(1)
    metrics.rollout_weight.labels("ns", "gone", "abc").set(50)
    metrics.forget_deployment("ns", "gone")
    pending = {s.labels["deployment"] for s in _samples(metrics.pending_groups)}
    assert "gone" not in pending and "kept" in pending
    assert all(s.labels["deployment"] != "gone" for s in _samples(metrics.rollout_weight))


def group(index, phase_node="n0", ready=True):
    member = MemberView(f"llm-{index}-0", 0, phase_node, "Running" if phase_node else "Pending", ready=ready)
    return GroupView(index, "rev", 1, (member,), (phase_node or "p",), ())


def test_export_groups_counts_phases_capacity_and_gpus():
    metrics = OperatorMetrics()
    nodes = [
        Node("n0", {}, 8, 8, "H100"),
        Node("n1", {}, 8, 2, "H100"),
        Node("n2", {}, 8, 0, "H100", ready=False),
    ]
    groups = [group(0), group(1, ready=False)]
    metrics.export_groups(
        ("ns", "llm"), groups, "1 group(s) cannot be placed: x", nodes, [GroupShape(1, 8, None)]
    )
    phases = group_phase_counts(groups)
    for phase, count in phases.items():
        assert (
            value(metrics, "tokenyard_operator_groups", namespace="ns", deployment="llm", phase=phase)
            == count
        )
    assert value(metrics, "tokenyard_operator_groups", namespace="ns", deployment="llm", phase="Failed") == 0
    pending = value(
        metrics,
        "tokenyard_operator_pending_groups",
        namespace="ns",
        deployment="llm",
        reason="InsufficientCapacity",
    )
    assert pending == 1
    # n2 is not ready: not eligible, not counted; n1's 6 free GPUs cannot hold an 8-GPU pod
    assert value(metrics, "tokenyard_operator_gpus", state="allocated") == 10
    assert value(metrics, "tokenyard_operator_gpus", state="free") == 6
    assert value(metrics, "tokenyard_operator_gpus", state="stranded") == 6


def test_a_calm_deployment_exports_its_event_counters_at_zero_after_its_first_reconcile():
    metrics = OperatorMetrics()
    key = dict(namespace="ns", deployment="llm")
    assert value(metrics, "tokenyard_operator_reconcile_errors_total", **key) is None
    metrics.export_groups(("ns", "llm"), [group(0)], None, [], [])
    assert value(metrics, "tokenyard_operator_reconcile_errors_total", **key) == 0
    assert value(metrics, "tokenyard_operator_groups_recreated_total", **key) == 0
    for phase in ROLLOUT_PHASES:
        assert value(metrics, "tokenyard_rollout_transitions_total", **key, phase=phase) == 0
    # Declaring again never resets a counter that has counted.
    metrics.reconcile_errors.labels("ns", "llm").inc()
    metrics.export_groups(("ns", "llm"), [group(0)], None, [], [])
    assert value(metrics, "tokenyard_operator_reconcile_errors_total", **key) == 1
    metrics.forget_deployment("ns", "llm")
    assert value(metrics, "tokenyard_rollout_transitions_total", **key, phase="Healthy") is None


def test_gpu_states_of_no_nodes_are_zero():
    assert gpu_states([], []) == {"allocated": 0, "free": 0, "stranded": 0}


def test_export_rollout_sets_the_phase_counts_transitions_and_drops_revisions_out_of_traffic():
    metrics = OperatorMetrics()
    key = ("ns", "llm")
    healthy = RolloutState(stable_revision="a")
    progressing = RolloutState(
        stable_revision="a", phase=Phase.PROGRESSING, canary_revision="b", step_index=1
    )
    analysis = {"metrics": [{"metric": "errors", "statistic": 0.5, "threshold": 2.9}]}
    traffic = [{"revision": "a", "weight": 90}, {"revision": "b", "weight": 10}]
    metrics.export_rollout(key, progressing, healthy, traffic, analysis)
    labels = {"namespace": "ns", "deployment": "llm"}
    assert value(metrics, "tokenyard_rollout_phase", **labels, phase="Progressing") == 1
    assert value(metrics, "tokenyard_rollout_phase", **labels, phase="Healthy") == 0
    assert value(metrics, "tokenyard_rollout_transitions_total", **labels, phase="Progressing") == 1
    assert value(metrics, "tokenyard_rollout_step", **labels) == 1
    assert value(metrics, "tokenyard_rollout_traffic_weight", **labels, revision="b") == 10
    assert value(metrics, "tokenyard_rollout_analysis_statistic", **labels, metric="errors") == 0.5
    assert value(metrics, "tokenyard_rollout_analysis_threshold", **labels, metric="errors") == 2.9
    # the same phase again is no transition; revision b leaves the traffic and loses its series
    metrics.export_rollout(key, progressing, progressing, [{"revision": "a", "weight": 100}], None)
    assert value(metrics, "tokenyard_rollout_transitions_total", **labels, phase="Progressing") == 1
    assert value(metrics, "tokenyard_rollout_traffic_weight", **labels, revision="b") is None
    assert value(metrics, "tokenyard_rollout_traffic_weight", **labels, revision="a") == 100


def test_ttft_slo_is_read_from_an_existing_router_bucket():
    from tokenyard.operator.canary import _le

    assert _le(0.5) == "0.5"
    assert _le(0.3) == "0.25"  # no 0.3 bucket: the largest bound below it
    assert _le(0.001) == "0.005"
