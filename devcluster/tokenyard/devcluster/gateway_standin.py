"""Builds the gateway stand-in (``devcluster/gateway-standin``, Go on Envoy's go-control-plane), which plays a
gateway's side of the Inference Extension's endpoint picker protocol in the tests.

Built like the control-plane binaries (``binaries.py``): into the cache folder outside the work tree, once per
version of its source (the folder is named by a hash of go.mod, go.sum and main.go, so an edit rebuilds it and
an unchanged checkout reuses it); the first build fetches its modules through the Go module proxy (about a
minute on 2 cores), later ones take seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tokenyard.devcluster.binaries import BinaryError, cache_root

SOURCE_DIR = Path(__file__).resolve().parents[2] / "gateway-standin"
SOURCE_FILES = ("go.mod", "go.sum", "main.go")
BUILD_TIMEOUT_S = 900


def source_digest(source: Path = SOURCE_DIR) -> str:
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        digest.update(name.encode() + b"\0" + (source / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def ensure_gateway_standin(source: Path = SOURCE_DIR) -> Path:
    """The stand-in's binary, built when this version of its source has not been built yet."""
    if not all((source / name).is_file() for name in SOURCE_FILES):
        raise BinaryError(
            f"the gateway stand-in's source is not in {source} (expected {', '.join(SOURCE_FILES)})"
        )
    binary = cache_root() / "bin" / f"gateway-standin-{source_digest(source)}" / "gateway-standin"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise BinaryError(f"no `go` on PATH to build the gateway stand-in from {source}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    result = subprocess.run(
        [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), "."],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise BinaryError(
            f"building the gateway stand-in in {source} failed (exit {result.returncode}):\n{tail}"
        )
    partial.replace(binary)  # atomic: a concurrent test session sees the whole binary or none
    return binary
