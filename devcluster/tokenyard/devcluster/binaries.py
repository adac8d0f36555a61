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
        result = subprocess.run(
            [
                "bash",
                str(BUILD_SCRIPT),
                str(cache_dir()),
                KUBERNETES_VERSION,
                ETCD_VERSION,
                KWOK_VERSION,
                HELM_VERSION,
                PROMETHEUS_MODULE_VERSION,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode != 0:
            tail = "\n".join(result.stdout.splitlines()[-15:])
            raise BinaryError(f"building {', '.join(missing)} failed (exit {result.returncode}):\n{tail}")
    found = {name: _find(name, folders) for name in NAMES}
    still_missing = [name for name in required if found[name] is None]
    if still_missing:
        raise BinaryError(f"missing {', '.join(still_missing)} in {', '.join(map(str, folders))}")
    return Binaries(**{name.replace("-", "_"): path for name, path in found.items()})  # type: ignore[arg-type]
