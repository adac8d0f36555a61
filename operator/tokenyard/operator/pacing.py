"""When the reconcile loop of one ModelDeployment runs next: the pure rule, no clock of its own."""

from __future__ import annotations

# A group's pods change together (created, bound, running, ready within tens of milliseconds of each other):
# a short pause after the first event lets its siblings land in the same reconcile.
DEBOUNCE_SECONDS = 0.02
# At most this many reconciles per second per ModelDeployment, however many pod events arrive.
MIN_INTERVAL_SECONDS = 0.2


def delay_before_reconcile(
    now: float,
    last_started: float,
    debounce: float = DEBOUNCE_SECONDS,
    min_interval: float = MIN_INTERVAL_SECONDS,
) -> float:
    """Seconds to wait, once woken, before the next reconcile. A wake after a quiet spell is served after the
    debounce alone (a killed pod's group is recreated at once); a burst of wakes is folded into at most one
    reconcile per `min_interval`, counted from when the last one started."""
    return max(debounce, last_started + min_interval - now)
