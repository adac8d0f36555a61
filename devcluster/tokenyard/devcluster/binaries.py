"""Finds the control-plane binaries, building them from their Go modules when they are missing.

Search order, per binary:
1. `$KUBEBUILDER_ASSETS` (a folder of prebuilt binaries, as controller-runtime's envtest uses), as is;
2. the cache folder `$TOKENYARD_CACHE/bin/k8s-<version>` (default `~/.cache/tokenyard`), outside the work
   tree on purpose: CI runs in a fresh clone, and a cache inside the clone would be rebuilt every run;
3. otherwise `build-binaries.sh` builds the missing ones into the cache (10-25 minutes cold on 2 cores,
   seconds once Go's build cache is warm).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Pinned versions. The Go module proxy serves k8s.io/kubernetes v1.34-v1.37; v1.35 builds with the Go 1.26
# on the machines here without fetching another toolchain.
KUBERNETES_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.7.0"
HELM_VERSION = "v4.3.2"
# Prometheus v3.16.0 (published as module v0.316.0): Debian's package lacks Kubernetes service discovery.
PROMETHEUS_MODULE_VERSION = "v0.316.0"

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
# helm and prometheus serve the tests and the demo, not the control plane itself
NAMES = (*CONTROL_PLANE, "helm", "prometheus")
BUILD_SCRIPT = Path(__file__).with_name("build-binaries.sh")


class BinaryError(RuntimeError):
    """A binary is missing and could not be built."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    helm: Path | None
    prometheus: Path | None


def cache_root() -> Path:
    return Path(os.environ.get("TOKENYARD_CACHE", Path.home() / ".cache" / "tokenyard"))


def cache_dir() -> Path:
    return cache_root() / "bin" / f"k8s-{KUBERNETES_VERSION}"


def _find(name: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


# What a cold build of each step takes on 2 cores (measured on the machines here), for the progress line.
STEP_ESTIMATES = {
    "Kubernetes": "10-25 min",
    "etcd": "2-4 min",
    "kwok": "1-2 min",
    "helm": "2-4 min",
    "prometheus": "4-8 min",
}
HEARTBEAT_SECONDS = 30.0


def progress_line(step: str, step_elapsed_s: float, total_elapsed_s: float) -> str:
    """One line of the cold build's progress: what is building, for how long, and what it usually takes."""
    estimate = next((e for key, e in STEP_ESTIMATES.items() if key.lower() in step.lower()), None)
    usual = f" (a cold build takes {estimate} on 2 cores)" if estimate else ""
    return f"binaries: {step}: {_minutes(step_elapsed_s)} so far{usual}; {_minutes(total_elapsed_s)} in total"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _run_build(command: list[str], heartbeat_s: float = HEARTBEAT_SECONDS) -> tuple[int, list[str]]:
    """Run the build script, passing its step lines ("building ...") to stderr as they come and printing a
    progress line every `heartbeat_s` while a step runs, so a newcomer's cold first run is not silent for
    twenty minutes. Returns the exit code and every output line (for the error message)."""
    import sys
    import threading
    import time

    started = time.monotonic()
    state = {"step": "preparing the Go modules", "since": started}
    lines: list[str] = []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(heartbeat_s):
            now = time.monotonic()
            print(
                progress_line(state["step"], now - state["since"], now - started), file=sys.stderr, flush=True
            )

    ticker = threading.Thread(target=heartbeat, daemon=True)
    ticker.start()
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.rstrip("\n")
        lines.append(line)
        if line.startswith(("building ", "binaries ready")):
            state["step"], state["since"] = line.removeprefix("building "), time.monotonic()
            print(f"binaries: {line} ({_minutes(state['since'] - started)} in)", file=sys.stderr, flush=True)
    returncode = process.wait()
    done.set()
    return returncode, lines


def ensure_binaries(build: bool = True, required: tuple[str, ...] = CONTROL_PLANE) -> Binaries:
    """Every binary's path (None for an optional one not there), building the missing `required` ones
    (and the optional ones with them) when `build` is true."""
    folders = []
    if os.environ.get("KUBEBUILDER_ASSETS"):
        folders.append(Path(os.environ["KUBEBUILDER_ASSETS"]))
    folders.append(cache_dir())
    missing = [name for name in required if _find(name, folders) is None]
    if missing and build:
        if shutil.which("go") is None:
            raise BinaryError(
                f"missing {', '.join(missing)} in {', '.join(map(str, folders))} and no `go` on PATH to build them"
            )
        returncode, output = _run_build(
            [
                "bash",
                str(BUILD_SCRIPT),
                str(cache_dir()),
                KUBERNETES_VERSION,
                ETCD_VERSION,
                KWOK_VERSION,
                HELM_VERSION,
                PROMETHEUS_MODULE_VERSION,
            ]
        )
        if returncode != 0:
            tail = "\n".join(output[-15:])
            raise BinaryError(f"building {', '.join(missing)} failed (exit {returncode}):\n{tail}")
    found = {name: _find(name, folders) for name in NAMES}
    still_missing = [name for name in required if found[name] is None]
    if still_missing:
        raise BinaryError(f"missing {', '.join(still_missing)} in {', '.join(map(str, folders))}")
    return Binaries(**{name.replace("-", "_"): path for name, path in found.items()})  # type: ignore[arg-type]
