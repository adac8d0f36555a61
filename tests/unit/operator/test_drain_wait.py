"""The engine leader's preStop hook (operator/tokenyard/operator/drain_wait.py), on a fake clock: what it reads
from an exposition and when it lets SIGTERM through. Against a real engine on a socket:
tests/integration/sim/test_drain_wait.py."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest
from tokenyard.core.engines import EngineKind
from tokenyard.operator import drain_wait
from tokenyard.operator.manifests import OPEN_REQUEST_GAUGES, pre_stop

VLLM = {"vllm:num_requests_running", "vllm:num_requests_waiting"}

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a {b} \\"c\\" d"} 3.0
vllm:num_requests_running{engine="1",model_name="x"} 1.0 1712345678000
vllm:num_requests_running_total{engine="0"} 99.0
vllm:num_requests_waiting 2
vllm:num_requests_waiting_extra 7
"""


def test_the_open_requests_are_the_named_gauges_summed_whatever_their_labels():
    # Braces, spaces and escaped quotes inside a label value, a timestamp after the value, a name that only
    # starts like a wanted one: 3 + 1 running and 2 waiting.
    assert drain_wait.open_requests(EXPOSITION, VLLM) == 6.0
    assert drain_wait.open_requests(EXPOSITION, {"sglang:num_running_reqs"}) is None
    assert drain_wait.open_requests("vllm:num_requests_running 0.0\n", VLLM) == 0.0


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(monkeypatch, answers, drain_s=30.0):
    """wait() against a scripted engine: each read takes the next (listening, text) of ``answers`` (the last
    repeats); returns why it stopped, when, and the times it read."""
    fake, reads = FakeTime(), []

    def read(url):
        reads.append(fake.now)
        return answers[min(len(reads) - 1, len(answers) - 1)]

    monkeypatch.setattr(drain_wait, "read", read)
    why = drain_wait.wait("http://127.0.0.1:8000/metrics", drain_s, VLLM, clock=fake.clock, sleep=fake.sleep)
    return why, fake.now, reads


def busy(n: int) -> tuple[bool, str]:
    return True, f"vllm:num_requests_running {n}\nvllm:num_requests_waiting 0\n"


def test_an_idle_engine_lets_sigterm_through_after_the_settle_and_two_idle_readings(monkeypatch):
    why, at, reads = run(monkeypatch, [busy(0)])
    assert why == "idle" and reads[0] == drain_wait.SETTLE_S and at == pytest.approx(drain_wait.SETTLE_S + 1)


def test_a_busy_engine_is_waited_on_until_its_last_request_ends(monkeypatch):
    why, at, _ = run(monkeypatch, [busy(4), busy(2), busy(0), busy(1), busy(0), busy(0)])
    # idle at the third reading, busy again at the fourth (a late request): only two idle readings in a row count
    assert why == "idle" and at == pytest.approx(drain_wait.SETTLE_S + 5)


@pytest.mark.parametrize(
    "answer",
    [
        (True, None),  # the engine does not answer (timeout, 500)
        (True, "# no such gauges here\nother_metric 0\n"),  # it answers, but not with the named gauges
        busy(1),  # a stream longer than the drain
    ],
)
def test_whenever_it_cannot_tell_or_the_engine_stays_busy_it_waits_out_the_whole_drain(monkeypatch, answer):
    why, at, _ = run(monkeypatch, [answer], drain_s=30.0)
    assert why == "drain over" and at == pytest.approx(30.0)


def test_nothing_listening_means_nothing_to_drain(monkeypatch):
    why, at, _ = run(monkeypatch, [(False, None)])
    assert why == "gone" and at == pytest.approx(drain_wait.SETTLE_S)


def test_a_drain_shorter_than_the_settle_ends_with_the_drain():
    fake = FakeTime()
    assert drain_wait.wait("http://127.0.0.1:1/metrics", 2.0, VLLM, fake.clock, fake.sleep) == "drain over"
    assert fake.now == pytest.approx(2.0)


def test_bad_arguments_never_fail_the_hook(capsys):
    assert drain_wait.main(["-c", "http://127.0.0.1:1/metrics", "soon"]) == 0
    assert "usage" in capsys.readouterr().err


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.SGLANG])
def test_the_pods_hook_is_the_module_itself_without_its_docstrings(kind):
    command = pre_stop(kind, 8000, 45, leader=True)["exec"]["command"]
    source = command[2]
    tree = ast.parse(source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"open_requests", "read", "wait", "main"} <= functions
    assert '"""' not in source and len(source) < 4000
    assert command[4] == "45"
    prefix = "vllm:" if kind is EngineKind.VLLM else "sglang:"
    assert all(name.startswith(prefix) for name in command[5:]) and len(command[5:]) == 2


def test_a_port_nothing_listens_on_reads_as_gone():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert drain_wait.read(f"http://127.0.0.1:{port}/metrics") == (False, None)


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


@pytest.mark.parametrize(
    ("fixture", "kind"), [("vllm_v0.13.0.prom", EngineKind.VLLM), ("sglang.prom", EngineKind.SGLANG)]
)
def test_the_hook_reads_the_gauges_the_engines_document(fixture, kind):
    """The expositions of tests/fixtures/metrics follow each engine's own sources and docs (their header says
    which): the names the operator puts in the hook are there, busy reads as busy, and the same exposition with
    those gauges at 0 reads as idle (the hook counts every copy: ranks, priorities and data-parallel engines)."""
    names = set(OPEN_REQUEST_GAUGES[kind])
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    assert drain_wait.open_requests(text, names) > 0
    idle = "\n".join(
        line.rsplit(" ", 1)[0] + " 0.0" if line.split("{", 1)[0] in names else line
        for line in text.splitlines()
    )
    assert drain_wait.open_requests(idle, names) == 0.0
