"""`make demo`: the whole stack on one machine, no GPU, and a load that makes the fleet scale out and back in.

The local control plane with fake GPU nodes, the CRDs, the operator, the simulator serving every engine pod on its
127.x pod IP, the router, a real Prometheus scraping engines, router, operator and autoscaler with the chart's
scrape configuration, and the autoscaler acting on examples/autoscaler.yaml for examples/llama-8b-tp4.yaml
(tokenyard.devcluster.stack). A load generator then sends requests through the router at a rate that rises and
falls (tokenyard.devcluster.load), so that the groups grow with the queue and shrink after it. It prints where
to look and runs until Ctrl-C; `--once` stops after one load cycle. Every process it started is stopped on the way
out; the control plane keeps running (`make cluster-down` stops it).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tokenyard.devcluster.cluster import DevCluster
from tokenyard.devcluster.load import LoadGenerator, RateCycle
from tokenyard.devcluster.stack import SYSTEM_NAMESPACE, Stack, poll_until

# Requests per second through the router: low enough at the bottom for one group, high enough at the top for
# several (each simulated engine runs 4 sequences at a time; see stack.DEMO_ENGINE_ARGS).
LOW_RATE, PEAK_RATE = 0.5, 8.0
# After the cycle, how long `--once` waits for the groups to come back down before it stops anyway.
SCALE_IN_WAIT_S = 120.0


def _say(text: str) -> None:
    print(f"==> {text}", flush=True)


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _where_to_look(stack: Stack, name: str, model: str) -> None:
    kubectl = " ".join(stack.kubectl.command())
    ns = stack.namespace
    lines = {
        "router (OpenAI API)": f"{stack.router_url}/v1/completions",
        "  try": (
            f"curl -s {stack.router_url}/v1/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{model}", "prompt": "hello", "max_tokens": 8}}\''
        ),
        "Prometheus": f"{stack.prometheus_url}/graph?g0.expr=tokenyard_autoscaler_desired_groups",
        "watch the groups": f"{kubectl} -n {ns} get mdep -w",
        "the autoscaler": f"{kubectl} -n {ns} get inferenceautoscaler -w",
        "rollouts": f"{kubectl} -n {ns} get mdep {name} -o jsonpath='{{.status.rollout}}'; "
        f"{kubectl} -n {ns} describe mdep {name}",
        "the components' pods": f"{kubectl} -n {SYSTEM_NAMESPACE} get pods -o wide",
        "dashboards": "charts/tokenyard/dashboards/*.json (Grafana: import, data source = the Prometheus above)",
        "logs": str(stack.folder),
    }
    width = max(map(len, lines))
    for label, value in lines.items():
        print(f"   {label:<{width}}  {value}", flush=True)


def run(state_dir: Path, once: bool, period_s: float = 240.0) -> int:
    started = time.monotonic()
    cluster = DevCluster(state_dir)
    if cluster.load() and cluster.running():
        _say(f"reusing the control plane at {cluster.server}")
    else:
        _say("starting the local control plane (etcd, kube-apiserver, controller manager, scheduler, kwok)")
        cluster = DevCluster(state_dir)
        cluster.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stack = Stack(cluster, state_dir / "demo")
    load: LoadGenerator | None = None
    try:
        stack.start(_say)
        name, model = stack.apply_demo_model(replicas=1)
        _say(f"applied examples/llama-8b-tp4.yaml ({name}, 1 group) and examples/autoscaler.yaml")
        poll_until(lambda: stack.groups(name)[1] >= 1, 120, what="the first group to be Ready")
        probe = {"model": model, "prompt": "warm up", "max_tokens": 1}
        poll_until(
            lambda: _post(f"{stack.router_url}/v1/completions", probe), 60, what="the router to answer"
        )
        _say(f"first request answered through the router {time.monotonic() - started:.0f}s after start")
        _where_to_look(stack, name, model)

        cycle = RateCycle(LOW_RATE, PEAK_RATE, period_s, cycles=1 if once else None)
        load = LoadGenerator(f"{stack.router_url}/v1/completions", model, cycle).start()
        _say(
            f"load: {LOW_RATE:g} -> {PEAK_RATE:g} -> {LOW_RATE:g} requests/s every {period_s:.0f}s"
            + (" (one cycle, then stop)" if once else "; Ctrl-C stops what the demo started but the cluster")
        )
        peak_groups = 1
        while not stop.is_set():
            stop.wait(5)
            stack.check_alive()
            desired, ready = stack.groups(name)
            peak_groups = max(peak_groups, desired)
            s = load.stats
            print(
                f"   t={load.elapsed():4.0f}s  rate {load.rate_now():4.1f}/s  sent {s.sent} ok {s.ok} "
                f"failed {s.failed} in flight {s.in_flight}  groups {ready}/{desired} ready"
                + (f"  last error: {s.last_error}" if s.failed else ""),
                flush=True,
            )
            # --once: the cycle is over and the fleet is back at one group (or has had ample time to get there)
            if (
                once
                and load.elapsed() >= period_s
                and (desired == 1 or load.elapsed() >= period_s + SCALE_IN_WAIT_S)
            ):
                _say(f"one cycle done: up to {peak_groups} group(s) at the peak, {desired} now")
                break
    except KeyboardInterrupt:
        pass
    # a component that would not start, or stopped: say which, and where its log is
    except (RuntimeError, TimeoutError) as e:
        print(f"demo: {e}\n   logs: {stack.folder}", file=sys.stderr, flush=True)
        return 1
    finally:
        if load is not None:
            load.stop()
        _say("stopping the autoscaler, the router, the engines, the operator and Prometheus")
        stack.stop()
        _say("the control plane keeps running for the next demo; `make cluster-down` stops it")
    return 0
