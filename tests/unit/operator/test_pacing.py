import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.operator.pacing import DEBOUNCE_SECONDS, MIN_INTERVAL_SECONDS, delay_before_reconcile


def test_a_wake_after_a_quiet_spell_waits_only_the_debounce():
    assert delay_before_reconcile(now=100.0, last_started=90.0) == DEBOUNCE_SECONDS


def test_a_wake_right_after_a_reconcile_waits_out_the_interval():
    assert delay_before_reconcile(now=100.05, last_started=100.0) == pytest.approx(
        MIN_INTERVAL_SECONDS - 0.05
    )


@given(
    last_started=st.floats(0, 1e6),
    elapsed=st.floats(0, 10),
    debounce=st.floats(0, 1),
    min_interval=st.floats(0, 5),
)
def test_reconciles_start_at_most_once_per_interval_and_never_before_the_debounce(
    last_started, elapsed, debounce, min_interval
):
    now = last_started + elapsed
    delay = delay_before_reconcile(now, last_started, debounce, min_interval)
    assert delay >= debounce
    assert now + delay >= last_started + min_interval - 1e-9
