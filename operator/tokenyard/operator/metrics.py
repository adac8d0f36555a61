"""The operator's Prometheus metrics (prefix tokenyard_operator_)."""

from prometheus_client import Counter, Gauge, Histogram

GROUPS = Gauge(
    "tokenyard_operator_groups", "Replica groups by phase", ["namespace", "deployment", "phase"]
)
PENDING_GROUPS = Gauge(
    "tokenyard_operator_pending_groups", "Groups that cannot be placed, by reason", ["namespace", "deployment", "reason"]
)
PLACEMENT_SECONDS = Histogram(
    "tokenyard_operator_placement_seconds",
    "Time to plan the placement of one reconcile's new groups",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
GPUS = Gauge("tokenyard_operator_gpus", "GPUs on eligible nodes by state (allocated, free, stranded)", ["state"])
RECONCILE_ERRORS = Counter(
    "tokenyard_operator_reconcile_errors_total", "Reconciles that raised an error", ["namespace", "deployment"]
)
GROUPS_RECREATED = Counter(
    "tokenyard_operator_groups_recreated_total", "Groups deleted to be recreated whole", ["namespace", "deployment"]
)
