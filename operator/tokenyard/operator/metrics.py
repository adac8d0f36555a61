"""The operator's Prometheus metrics (prefix tokenyard_operator_)."""

from prometheus_client import Counter, Gauge, Histogram

GROUPS = Gauge("tokenyard_operator_groups", "Replica groups by phase", ["namespace", "deployment", "phase"])
PENDING_GROUPS = Gauge(
    "tokenyard_operator_pending_groups",
    "Groups that cannot be placed, by reason",
    ["namespace", "deployment", "reason"],
)
PLACEMENT_SECONDS = Histogram(
    "tokenyard_operator_placement_seconds",
    "Time to plan the placement of one reconcile's new groups",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
GPUS = Gauge(
    "tokenyard_operator_gpus", "GPUs on eligible nodes by state (allocated, free, stranded)", ["state"]
)
RECONCILE_ERRORS = Counter(
    "tokenyard_operator_reconcile_errors_total",
    "Reconciles that raised an error",
    ["namespace", "deployment"],
)
GROUPS_RECREATED = Counter(
    "tokenyard_operator_groups_recreated_total",
    "Groups deleted to be recreated whole",
    ["namespace", "deployment"],
)

ROLLOUT_PHASE = Gauge(
    "tokenyard_rollout_phase",
    "1 for the rollout's current phase, 0 for the others",
    ["namespace", "deployment", "phase"],
)
ROLLOUT_STEP = Gauge(
    "tokenyard_rollout_step", "Index of the rollout's current step", ["namespace", "deployment"]
)
ROLLOUT_WEIGHT = Gauge(
    "tokenyard_rollout_traffic_weight",
    "Traffic weight (percent) per revision",
    ["namespace", "deployment", "revision"],
)
ROLLOUT_ANALYSIS_STATISTIC = Gauge(
    "tokenyard_rollout_analysis_statistic",
    "Log-likelihood ratio of 'the new revision is worse' per metric (rollback at the threshold)",
    ["namespace", "deployment", "metric"],
)
ROLLOUT_ANALYSIS_THRESHOLD = Gauge(
    "tokenyard_rollout_analysis_threshold", "log(1/alpha) per metric", ["namespace", "deployment", "metric"]
)
ROLLOUT_TRANSITIONS = Counter(
    "tokenyard_rollout_transitions_total",
    "Rollout transitions, by the phase entered",
    ["namespace", "deployment", "phase"],
)


def forget_deployment(namespace: str, deployment: str) -> None:
    """Drop a deleted deployment's series, so that its last values (an InsufficientCapacity, say) do not
    linger and keep alerts firing."""
    for family in (
        GROUPS,
        PENDING_GROUPS,
        ROLLOUT_PHASE,
        ROLLOUT_STEP,
        ROLLOUT_WEIGHT,
        ROLLOUT_ANALYSIS_STATISTIC,
        ROLLOUT_ANALYSIS_THRESHOLD,
        ROLLOUT_TRANSITIONS,
        RECONCILE_ERRORS,
        GROUPS_RECREATED,
    ):
        for labels in list(family._metrics):  # prometheus_client keeps children by their label values
            if labels[:2] == (namespace, deployment):
                family.remove(*labels)
