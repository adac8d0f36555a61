#!/usr/bin/env bash
# Builds the control-plane binaries of the local cluster from their Go modules
# into a cache folder, one sub-folder per pinned version, so later starts reuse them.
#
#   build-binaries.sh OUT_DIR KUBE_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION PROMETHEUS_MODULE_VERSION
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod requires every staging
# module at v0.0.0 and replaces it with a local path. A throw-away wrapper module
# requires k8s.io/kubernetes vX.Y.Z and replaces each staging module named in that
# go.mod with its published v0.Y.Z. etcd's server module has the same shape.
set -euo pipefail
out=$1 kube=$2 etcd=$3 kwok=$4 helm=$5 prom=$6
mkdir -p "$out"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wrapper() {  # wrapper DIR MODULE VERSION STAGING_PREFIX STAGING_VERSION
  local dir=$1 mod=$2 ver=$3 prefix=$4 sver=$5
  mkdir -p "$dir"
  local gomod
  gomod=$(go mod download -json "$mod@$ver" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module tokenyard.dev/wrapper"
    echo "go 1.25.0"
    echo "require $mod $ver"
    # every local-path replace of the upstream go.mod becomes a published version
    { grep -E "^\s*($prefix)\S* => \./" "$gomod" || true; } | awk -v v="$sver" '{print "replace " $1 " => " $1 " " v}'
    { grep -E "^replace ($prefix)\S* => \./" "$gomod" || true; } | awk -v v="$sver" '{print "replace " $2 " => " $2 " " v}'
  } > "$dir/go.mod"
  echo 'package wrapper' > "$dir/wrapper.go"
}

if [ ! -x "$out/kube-apiserver" ] || [ ! -x "$out/kube-controller-manager" ] || \
   [ ! -x "$out/kube-scheduler" ] || [ ! -x "$out/kubectl" ]; then
  minor=$(echo "$kube" | cut -d. -f2)
  wrapper "$work/kube" k8s.io/kubernetes "$kube" "k8s.io/" "v0.${kube#v1.}"
  cd "$work/kube"
  # tools.go-style import so `go mod tidy` keeps the requirement
  printf 'package wrapper\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver/app"\n' > tools.go
  go mod tidy >/dev/null 2>&1 || true
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  echo "building Kubernetes $kube binaries (cold: 10-25 minutes on 2 cores)" >&2
  go build -trimpath -tags selinux,notest -ldflags "$ld" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi

if [ ! -x "$out/etcd" ]; then
  wrapper "$work/etcd" go.etcd.io/etcd/server/v3 "$etcd" "go.etcd.io/etcd/" "$etcd"
  cd "$work/etcd"
  printf 'package wrapper\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' > tools.go
  go mod tidy >/dev/null 2>&1 || true
  echo "building etcd $etcd" >&2
  go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
fi

if [ ! -x "$out/kwok" ]; then
  echo "building kwok $kwok" >&2
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok"
fi
if [ ! -x "$out/helm" ]; then
  echo "building helm $helm" >&2
  GOBIN="$out" go install -trimpath -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@$helm"
fi
# Debian's prometheus package is built without Kubernetes service discovery; this one has it.
# Prometheus v3.Y.Z is published as the Go module version v0.3YY.Z.
if [ ! -x "$out/prometheus" ]; then
  mkdir -p "$work/prom" && cd "$work/prom"
  printf 'module tokenyard.dev/wrapper\ngo 1.25.0\nrequire github.com/prometheus/prometheus %s\n' "$prom" > go.mod
  printf 'package wrapper\nimport _ "github.com/prometheus/prometheus/cmd/prometheus"\n' > tools.go
  go mod tidy >/dev/null 2>&1 || true
  echo "building prometheus (module $prom)" >&2
  go build -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=$prom" \
    -o "$out/prometheus" github.com/prometheus/prometheus/cmd/prometheus
fi
echo "binaries ready in $out" >&2
