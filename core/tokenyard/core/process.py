"""Child processes: started with their output in a log file, stopped the way Kubernetes stops a pod (SIGTERM, a
grace period, then SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def stop_process(proc: subprocess.Popen, timeout: float = 20.0, sig: int = signal.SIGTERM) -> int | None:
    """Signal `proc` (when it still runs), wait up to `timeout` seconds, then kill it; return its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


class ManagedProcess:
    """A child process with its output in a log file, stopped by its pid (never by name: other people's processes
    run on the same machine). `python -m <args>` by default, or `program` (a binary such as Prometheus)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        program: list[str] | None = None,
    ):
        self.args, self.log_path, self.env = args, log_path, env or {}
        self.program = program or [sys.executable, "-m"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.program, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                # Its own session: a Ctrl-C at the terminal reaches the parent only, which stops its children
                # in the order it chooses (by pid), not all at once.
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=timeout, sig=sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
