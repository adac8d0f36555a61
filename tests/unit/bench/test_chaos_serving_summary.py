"""bench/chaos_serving_summary.py: how a request ended, a scenario's figures and the pass/fail verdict."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "bench" / "chaos_serving_summary.py"
_spec = importlib.util.spec_from_file_location("chaos_serving_summary", _PATH)
cs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cs  # its dataclasses look their module up by name
_spec.loader.exec_module(cs)

TOLERATES_CUTS = cs.Scenario("router-kill", zero_outcomes=(), times=("settle",))
NO_CUTS = cs.Scenario("redis-restart", zero_outcomes=(cs.CUT_MID_STREAM,), times=("redis_back", "settle"))


def record(status=200, done=True, replica="e0", started=0.0, attempts=1, max_wait_s=0.1):
    return cs.RequestRecord(
        router="a", started=started, attempts=attempts, status=status, replica=replica, done=done,
        max_wait_s=max_wait_s,
    )  # fmt: skip


def test_a_request_ends_ok_cut_mid_stream_or_failed_before_its_stream():
    assert record().outcome == cs.OK
    assert record(done=False).outcome == cs.CUT_MID_STREAM
    assert record(status=None, done=False, replica="").outcome == cs.FAILED_BEFORE_STREAM
    assert record(status=503, done=False).outcome == cs.FAILED_BEFORE_STREAM
    assert record(status=502, done=False).outcome == cs.FAILED_BEFORE_STREAM
    assert record(attempts=2).retried and not record().retried
    assert record(max_wait_s=cs.STALL_SECONDS).stalled and not record(max_wait_s=0.5).stalled


def test_a_calm_scenario_passes_and_its_times_are_summarised():
    trials = [
        cs.Trial(fault_at_s=1.0, records=[record(), record(done=False)], times={"settle": 0.5}),
        cs.Trial(fault_at_s=2.0, records=[record(attempts=2)], times={"settle": 1.5}),
        cs.Trial(fault_at_s=3.0, records=[record()], times={"settle": 1.0}),
    ]
    summary = cs.summarize(TOLERATES_CUTS, trials)
    assert (summary["requests"], summary["ok"], summary["cut_mid_stream"], summary["retried"]) == (4, 3, 1, 1)
    assert (summary["settle_p50_seconds"], summary["settle_max_seconds"], summary["settle_missing"]) == (
        1.0,
        1.5,
        0,
    )
    assert cs.violations(TOLERATES_CUTS, summary) == []  # a cut stream is expected when a router dies


def test_each_must_be_zero_quantity_and_each_missing_time_fails_the_verdict():
    trials = [
        cs.Trial(
            fault_at_s=1.0,
            records=[record(done=False), record(status=None, done=False)],
            times={"redis_back": None, "settle": None},
            drift_tokens=-24,
            drift_requests=1,
        )
    ]
    summary = cs.summarize(NO_CUTS, trials)
    found = cs.violations(NO_CUTS, summary)
    for quantity in (
        "failed_before_stream = 1",
        "drift_tokens = 24",
        "drift_requests = 1",
        "cut_mid_stream = 1",
    ):
        assert any(quantity in v for v in found), (quantity, found)
    assert any("redis_back never happened in 1 trial" in v for v in found)
    assert any("settle never happened" in v for v in found)
    rows = cs.table([NO_CUTS], {NO_CUTS.name: summary})
    assert len(rows) == 2 and rows[1].startswith("redis-restart") and rows[1].endswith("FAIL")


def test_routing_quality_is_read_per_phase_from_the_records_started_in_it():
    trial = cs.Trial(
        fault_at_s=1.0,
        records=[
            record(replica="e0", started=0.5),
            record(replica="e1", started=0.6),
            record(replica="e0", started=1.5),
            record(replica="e0", started=1.6),
            record(replica="e0", started=1.7),
            record(replica="e1", started=1.8),
        ],  # fmt: skip
        phases={"baseline": (0.0, 1.0), "outage": (1.0, 2.0)},
        cache_tokens={"baseline": (90.0, 100.0), "outage": (30.0, 100.0)},
        counts={"routed_into_hang": 2},
    )
    summary = cs.summarize(NO_CUTS, [trial, trial])
    assert summary["prefix_hit_rate_baseline"] == 0.9 and summary["prefix_hit_rate_outage"] == 0.3
    assert summary["imbalance_baseline"] == 1.0 and summary["imbalance_outage"] == 1.5
    assert summary["routed_into_hang"] == 4
    assert "hit rate 0.90 / 0.30" in cs.quality_lines({NO_CUTS.name: summary})[0]


def test_imbalance_and_hit_rate_of_nothing_are_unknown():
    assert cs.imbalance([record(replica="")]) is None
    assert cs.hit_rate([(0.0, 0.0)]) is None


def test_the_errors_of_requests_that_did_not_end_well_are_counted_by_kind():
    records = [record(), record(done=False), record(status=None, done=False), record(status=None, done=False)]
    records[2].error = records[3].error = "a: ClientConnectorError(...)"
    kinds = cs.error_kinds(records)
    assert kinds == {
        "a: ClientConnectorError(...)": 2,
        "status 200": 1,
    }  # most frequent first; ok ones left out
    assert cs.summarize(TOLERATES_CUTS, [cs.Trial(fault_at_s=0.0, records=records)])["errors"] == kinds
