"""`devcluster down` signals only the processes it started, even when state.json holds pids reused since."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict

import pytest
from tokenyard.devcluster.cluster import ClusterState, DevCluster, _alive, _start_ticks


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _write_state(tmp_path, pid: int, started: int | None) -> DevCluster:
    state = ClusterState(
        1, 2, 3, 4, 5, 6, pids={"kwok": pid}, started={"kwok": started} if started is not None else {}
    )
    (tmp_path / "state.json").write_text(json.dumps(asdict(state)))
    return DevCluster(tmp_path)


def test_down_leaves_alone_a_process_whose_start_time_differs(tmp_path, sleeper):
    cluster = _write_state(tmp_path, sleeper.pid, started=_start_ticks(sleeper.pid) - 1)
    assert cluster.status()["processes"]["kwok"]["alive"] is False
    cluster.stop(grace=0.5)
    assert sleeper.poll() is None and _alive(sleeper.pid)
    assert not (tmp_path / "state.json").exists()


def test_down_stops_the_process_it_started(tmp_path, sleeper):
    cluster = _write_state(tmp_path, sleeper.pid, started=_start_ticks(sleeper.pid))
    assert cluster.status()["processes"]["kwok"]["alive"] is True
    cluster.stop(grace=5)
    assert sleeper.wait(timeout=5) is not None


def test_a_state_file_without_start_times_is_still_honoured(tmp_path, sleeper):
    cluster = _write_state(tmp_path, sleeper.pid, started=None)
    cluster.stop(grace=5)
    assert sleeper.wait(timeout=5) is not None
