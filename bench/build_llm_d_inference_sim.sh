#!/usr/bin/env bash
# Builds llm-d-inference-sim, the engine `BENCH_ENGINE=llm-d make bench-router` runs the routers on, into the
# binaries cache ($TOKENYARD_CACHE/bin, default ~/.cache/tokenyard/bin), once.
#
# v0.9.2 is the last release before the simulator took github.com/llm-d/llm-d-router as a dependency. Where
# the Go module proxy serves its modules, `go build` fetches them. Where it refuses some (the proxy this
# project's CI machines use answered 403 for github.com/llm-d/llm-d-inference-sim itself and for
# github.com/llm-d/llm-d-kv-cache v0.7.1 on 2026-12-06), give checkouts of both at their tags:
#   LLMD_SIM_SRC=/path/to/llm-d-inference-sim (at v0.9.2)  LLMD_KV_CACHE_SRC=/path/to/llm-d-kv-cache (at v0.7.1)
# and the build uses them (a `replace` in a scratch copy; nothing of theirs is kept here).
set -euo pipefail
VERSION=v0.9.2
KV_CACHE_VERSION=v0.7.1
BIN_DIR="${TOKENYARD_CACHE:-$HOME/.cache/tokenyard}/bin"
TARGET="$BIN_DIR/llm-d-inference-sim-$VERSION"
if [ -x "$TARGET" ]; then
  echo "$TARGET"
  exit 0
fi
mkdir -p "$BIN_DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -n "${LLMD_SIM_SRC:-}" ]; then
  cp -r "$LLMD_SIM_SRC" "$WORK/sim"
else
  git clone -q --depth 1 --branch "$VERSION" https://github.com/llm-d/llm-d-inference-sim "$WORK/sim"
fi
cd "$WORK/sim"
if [ -n "${LLMD_KV_CACHE_SRC:-}" ]; then
  go mod edit -replace "github.com/llm-d/llm-d-kv-cache=$LLMD_KV_CACHE_SRC"
fi
# pure Go since v0.8 (its ZMQ publisher no longer needs cgo)
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o "$TARGET.tmp" ./cmd/llm-d-inference-sim
mv "$TARGET.tmp" "$TARGET"
echo "$TARGET"
