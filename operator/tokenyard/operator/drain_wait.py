"""Run as an engine pod's preStop hook: return once the engine has no request left, or when the drain ends.

The operator puts this file's source in the leader's preStop hook (``python3 -c <source> URL DRAIN NAME...``),
so it must stand alone: standard library only, Python 3.8 and later (the vLLM and SGLang images both carry a
python3). The kubelet sends the engine SIGTERM when the hook returns. A pod being deleted has already left the
router's endpoints, so no new request comes after the first seconds, and the requests still running finish
here. vLLM v0.13.0 aborts whatever is running at SIGTERM (later releases only with ``--shutdown-timeout``,
vllm-project/vllm#36666), so the drain has to happen before it. A fixed sleep of the drain period did that too,
but kept every removed group's GPUs for the whole period however soon its last stream ended.

Arguments: the engine's metrics URL, the drain in seconds, then the gauges whose sum is the engine's open
requests (vLLM ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``; SGLang
``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``). The hook first waits ``SETTLE_S`` (routers that had
not yet seen the pod leave may still send it a request), then returns once two readings ``POLL_S`` apart both sum
to zero. It waits out the whole drain, as the fixed sleep did, whenever it cannot tell: the URL does not answer,
or none of the gauges is in the answer. It returns at once only when nothing listens on the port (the engine has
already exited: there is nothing left to drain). It never fails: a failing preStop hook only delays SIGTERM.

vLLM's gauges do reach zero when the last request ends normally: the v1 scheduler drops the requests that
stopped from its running queue before it makes the step's stats, and sends those stats even when the step has
no other output (vllm/v1/core/sched/scheduler.py, ``update_from_output``). They can stay up after requests are
aborted with no step to follow (vllm-project/vllm#22545), which here only means waiting out the drain.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

SETTLE_S = 5.0
POLL_S = 1.0
FETCH_TIMEOUT_S = 2.0


def open_requests(exposition: str, names: set[str]) -> float | None:
    """The sum of the named gauges' samples in a Prometheus text exposition, None when none of them is there."""
    total, seen = 0.0, False
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        end = 0
        while end < len(line) and line[end] not in "{ \t":
            end += 1
        if line[:end] not in names:
            continue
        rest = line[end:]
        if rest.startswith("{"):  # skip the label set; a quoted value may hold braces and spaces
            quoted, escaped, i = False, False, 1
            while i < len(rest) and (quoted or rest[i] != "}"):
                if escaped:
                    escaped = False
                elif rest[i] == "\\":
                    escaped = True
                elif rest[i] == '"':
                    quoted = not quoted
                i += 1
            rest = rest[i + 1 :]
        fields = rest.split()
        try:
            total += float(fields[0])
        except (IndexError, ValueError):
            continue
        seen = True
    return total if seen else None


def read(url: str) -> tuple[bool, str | None]:
    """(whether anything listens, the answer's text when it came)."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:
            return True, answer.read().decode("utf-8", "replace")
    except urllib.error.URLError as e:  # a failed connection (urllib wraps the socket's error)
        return not isinstance(e.reason, ConnectionRefusedError), None
    except (OSError, ValueError):  # the answer broke off, or was not HTTP
        return True, None


def wait(url: str, drain_s: float, names: set[str], clock=time.monotonic, sleep=time.sleep) -> str:
    """Wait as the module says; return why it stopped ("idle", "gone" or "drain over")."""
    deadline = clock() + drain_s
    sleep(max(0.0, min(SETTLE_S, deadline - clock())))
    idle_readings = 0
    while clock() < deadline:
        listening, text = read(url)
        if not listening:
            return "gone"
        load = open_requests(text, names) if text is not None else None
        idle_readings = idle_readings + 1 if load == 0 else 0
        if idle_readings >= 2:
            return "idle"
        sleep(max(0.0, min(POLL_S, deadline - clock())))
    return "drain over"


def main(argv: list[str]) -> int:
    try:
        url, drain_s, names = argv[1], float(argv[2]), set(argv[3:])
    except (IndexError, ValueError):
        print("usage: drain_wait.py METRICS_URL DRAIN_SECONDS GAUGE...", file=sys.stderr)
        return 0
    print(f"drain_wait: {wait(url, drain_s, names)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
