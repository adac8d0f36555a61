"""Stopping a child process the way Kubernetes stops a pod: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, timeout: float = 20.0, sig: int = signal.SIGTERM) -> int | None:
    """Signal `proc` (when it still runs), wait up to `timeout` seconds, then kill it; return its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
