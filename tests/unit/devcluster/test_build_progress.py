"""The cold build is not silent: each step is announced as it starts, and a progress line names the step, its
elapsed time and what it usually takes while it runs (issue 16)."""

from __future__ import annotations

from tokenyard.devcluster.binaries import _run_build, progress_line


def test_progress_line_names_the_step_its_time_and_its_usual_duration():
    line = progress_line("Kubernetes v1.35.4 binaries (cold: 10-25 minutes on 2 cores)", 250, 262)
    assert line.startswith("binaries: Kubernetes v1.35.4")
    assert "4m10s so far" in line and "10-25 min" in line and "4m22s in total" in line
    assert "takes" not in progress_line("something unknown", 5, 5)


def test_a_running_build_reports_its_steps_and_a_heartbeat(capsys):
    script = (
        "echo 'building kwok v0.7.0' >&2; sleep 0.35; echo 'building helm v4.3.2' >&2; sleep 0.35; "
        "echo 'binaries ready in /tmp/x' >&2"
    )
    code, lines = _run_build(["bash", "-c", script], heartbeat_s=0.1)
    err = capsys.readouterr().err
    assert code == 0 and lines[-1] == "binaries ready in /tmp/x"
    assert "binaries: building kwok v0.7.0" in err and "binaries: building helm v4.3.2" in err
    assert "binaries: kwok v0.7.0: 0m00s so far (a cold build takes 1-2 min on 2 cores)" in err
    assert "binaries: helm v4.3.2:" in err


def test_a_failed_build_returns_its_code_and_output():
    code, lines = _run_build(
        ["bash", "-c", "echo 'building etcd v3.6.8' >&2; echo boom; exit 3"], heartbeat_s=5
    )
    assert code == 3 and lines == ["building etcd v3.6.8", "boom"]
