"""The operator's Prometheus metrics (prefixes tokenyard_operator_ and tokenyard_rollout_), declared on the
registry they are given (the operator's start-up passes prometheus_client's default one, which the metrics
server exposes; tests pass their own). The Grafana dashboard and the alert rules of the chart read these names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from tokenyard.operator.groups import FAILED, READY, GroupView
from tokenyard.operator.placement import GroupShape, Node, stranded_gpus
from tokenyard.operator.rollout import RolloutState

DEPLOYMENT = ["namespace", "deployment"]
GROUP_PHASES = ("Pending", "Placed", READY, FAILED, "Terminating")
ROLLOUT_PHASES = ("Healthy", "Progressing", "Paused", "Promoting", "RollingBack", "RolledBack")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.groups = Gauge(
            "tokenyard_operator_groups", "Replica groups by phase", [*DEPLOYMENT, "phase"], registry=r
        )
        self.pending_groups = Gauge(
            "tokenyard_operator_pending_groups",
            "Groups that cannot be placed, by reason",
            [*DEPLOYMENT, "reason"],
            registry=r,
        )
        self.placement_seconds = Histogram(
            "tokenyard_operator_placement_seconds",
            "Time to plan the placement of one reconcile's new groups",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.gpus = Gauge(
            "tokenyard_operator_gpus",
            "GPUs on eligible nodes by state (allocated, free, stranded)",
            ["state"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "tokenyard_operator_reconcile_errors_total",
            "Reconciles that raised an error",
            DEPLOYMENT,
            registry=r,
        )
        self.groups_recreated = Counter(
            "tokenyard_operator_groups_recreated_total",
            "Groups deleted to be recreated whole",
            DEPLOYMENT,
            registry=r,
        )
        self.rollout_phase = Gauge(
            "tokenyard_rollout_phase",
            "1 for the rollout's current phase, 0 for the others",
            [*DEPLOYMENT, "phase"],
            registry=r,
        )
        self.rollout_step = Gauge(
            "tokenyard_rollout_step", "Index of the rollout's current step", DEPLOYMENT, registry=r
        )
        self.rollout_weight = Gauge(
            "tokenyard_rollout_traffic_weight",
            "Traffic weight (percent) per revision",
            [*DEPLOYMENT, "revision"],
            registry=r,
        )
        self.rollout_analysis_statistic = Gauge(
            "tokenyard_rollout_analysis_statistic",
            "Log-likelihood ratio of 'the new revision is worse' per metric (rollback at the threshold)",
            [*DEPLOYMENT, "metric"],
            registry=r,
        )
        self.rollout_analysis_threshold = Gauge(
            "tokenyard_rollout_analysis_threshold",
            "log(1/alpha) per metric",
            [*DEPLOYMENT, "metric"],
            registry=r,
        )
        self.rollout_transitions = Counter(
            "tokenyard_rollout_transitions_total",
            "Rollout transitions, by the phase entered",
            [*DEPLOYMENT, "phase"],
            registry=r,
        )
        # (namespace, deployment) -> the revisions with a traffic weight series, to drop those that leave
        self._weighted_revisions: dict[tuple[str, str], set[str]] = {}

    def export_groups(
        self,
        key: tuple[str, str],
        groups: Sequence[GroupView],
        capacity_problem: str | None,
        nodes: Sequence[Node],
        shapes_in_use: Iterable[GroupShape],
    ) -> None:
        """After a reconcile: its groups by phase, whether some cannot be placed, and the GPUs of the cluster
        (stranded against the shapes of every deployment this operator runs)."""
        namespace, name = key
        self.declare_deployment(namespace, name)
        phases = group_phase_counts(groups)
        for phase in GROUP_PHASES:
            self.groups.labels(namespace, name, phase).set(phases.get(phase, 0))
        self.pending_groups.labels(namespace, name, "InsufficientCapacity").set(1 if capacity_problem else 0)
        for state, value in gpu_states(nodes, shapes_in_use).items():
            self.gpus.labels(state).set(value)

    def declare_deployment(self, namespace: str, name: str) -> None:
        """Export the deployment's event counters at zero before their first event (errors, recreated groups,
        a transition into each rollout phase), so that a dashboard or alert reads 0 in a calm fleet rather
        than "No data". ``labels()`` without an increment creates a child at 0 and leaves an existing one be."""
        self.reconcile_errors.labels(namespace, name)
        self.groups_recreated.labels(namespace, name)
        for phase in ROLLOUT_PHASES:
            self.rollout_transitions.labels(namespace, name, phase)

    def export_rollout(
        self,
        key: tuple[str, str],
        new_state: RolloutState,
        old_state: RolloutState,
        traffic: Sequence[Mapping[str, Any]],
        analysis: Mapping[str, Any] | None,
    ) -> None:
        """After a step of the canary state machine: its phase, step, traffic weights and analysis."""
        namespace, name = key
        for phase in ROLLOUT_PHASES:
            self.rollout_phase.labels(namespace, name, phase).set(1 if str(new_state.phase) == phase else 0)
        if new_state.phase != old_state.phase:
            self.rollout_transitions.labels(namespace, name, str(new_state.phase)).inc()
        self.rollout_step.labels(namespace, name).set(new_state.step_index)
        revisions = {weight["revision"] for weight in traffic}
        for gone in self._weighted_revisions.get(key, set()) - revisions:
            self.rollout_weight.remove(
                namespace, name, gone
            )  # a revision out of the traffic loses its series
        self._weighted_revisions[key] = revisions
        for weight in traffic:
            self.rollout_weight.labels(namespace, name, weight["revision"]).set(weight["weight"])
        for verdict in (analysis or {}).get("metrics", []):
            if verdict.get("statistic") is not None:
                self.rollout_analysis_statistic.labels(namespace, name, verdict["metric"]).set(
                    verdict["statistic"]
                )
            self.rollout_analysis_threshold.labels(namespace, name, verdict["metric"]).set(
                verdict["threshold"]
            )

    def forget_deployment(self, namespace: str, deployment: str) -> None:
        """Drop a deleted deployment's series, so that its last values (an InsufficientCapacity, say) do not
        linger and keep alerts firing."""
        self._weighted_revisions.pop((namespace, deployment), None)
        for family in (
            self.groups,
            self.pending_groups,
            self.rollout_phase,
            self.rollout_step,
            self.rollout_weight,
            self.rollout_analysis_statistic,
            self.rollout_analysis_threshold,
            self.rollout_transitions,
            self.reconcile_errors,
            self.groups_recreated,
        ):
            for labels in list(family._metrics):  # prometheus_client keeps children by their label values
                if labels[:2] == (namespace, deployment):
                    family.remove(*labels)


def group_phase_counts(groups: Iterable[GroupView]) -> dict[str, int]:
    phases: dict[str, int] = {}
    for group in groups:
        phases[group.phase] = phases.get(group.phase, 0) + 1
    return phases


def gpu_states(nodes: Iterable[Node], shapes_in_use: Iterable[GroupShape]) -> dict[str, int]:
    """GPUs of the eligible nodes: allocated, free, and stranded (free but unusable by any shape in use)."""
    eligible = [n for n in nodes if n.eligible]
    return {
        "allocated": sum(min(n.gpu_used, n.gpu_allocatable) for n in eligible),
        "free": sum(n.gpu_free for n in eligible),
        "stranded": stranded_gpus(eligible, list(set(shapes_in_use))),
    }
