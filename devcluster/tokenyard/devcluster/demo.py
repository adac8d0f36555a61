"""`make demo`: the whole stack on one machine, no GPU.

The local control plane with fake GPU nodes, the CRDs and `examples/llama-8b-tp4.yaml`, the operator, the
simulator serving every engine pod on its 127.x pod IP, and the router discovering them from the API server.
It sends a few requests through the router, prints what happened, and keeps running until Ctrl-C (or exits at
once with `--once`), then stops every process it started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml
from tokenyard.core.process import stop_process
from tokenyard.devcluster.binaries import ensure_binaries
from tokenyard.devcluster.cluster import DevCluster, free_port

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "llama-8b-tp4.yaml"


def _say(text: str) -> None:
    print(f"==> {text}", flush=True)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _wait(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception:  # still starting
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def run(state_dir: Path, once: bool) -> int:
    cluster = DevCluster(state_dir)
    if cluster.load() and cluster.running():
        _say(f"reusing the control plane at {cluster.server}")
    else:
        _say("starting the local control plane (etcd, kube-apiserver, controller manager, scheduler, kwok)")
        cluster = DevCluster(state_dir)
        cluster.start()
    kubectl = [str(ensure_binaries(build=False).kubectl), f"--kubeconfig={cluster.kubeconfig}"]
    subprocess.run(
        [*kubectl, "apply", "--server-side", "-f", str(ROOT / "charts/tokenyard/crds")], check=True
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"], check=True
    )

    logs = state_dir / "logs"
    router_port = free_port()
    procs = {
        "operator": _spawn(
            ["tokenyard.operator", "--kubeconfig", str(cluster.kubeconfig), "--metrics-port", "0"],
            logs / "operator.log",
        ),
        "sim-pods": _spawn(
            ["tokenyard.sim", "pods", "--kubeconfig", str(cluster.kubeconfig), "--time-scale", "0.2"],
            logs / "sim-pods.log",
        ),
        "router": _spawn(
            [
                "tokenyard.router",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--namespace",
                "default",
                "--port",
                str(router_port),
                "--grpc-port",
                str(free_port()),
                "--metrics-port",
                str(free_port()),
            ],
            logs / "router.log",
        ),
    }
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        _say(f"applying {EXAMPLE.relative_to(ROOT)}")
        subprocess.run([*kubectl, "apply", "-n", "default", "-f", str(EXAMPLE)], check=True)
        name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
        model = yaml.safe_load(EXAMPLE.read_text())["spec"]["model"]["servedModelName"]

        def ready():
            out = subprocess.run(
                [*kubectl, "get", "mdep", name, "-n", "default", "-o", "json"], capture_output=True, text=True
            )
            obj = json.loads(out.stdout)
            return obj.get("status", {}).get("readyReplicas") == obj["spec"]["replicas"]

        _wait(ready, 120, "every group Ready")
        subprocess.run([*kubectl, "get", "mdep,pods", "-n", "default", "-o", "wide"])
        base = f"http://127.0.0.1:{router_port}"
        _wait(
            lambda: _post(f"{base}/v1/completions", {"model": model, "prompt": "warm up", "max_tokens": 1}),
            60,
            "the router to discover the engines",
        )
        _say(f"three requests through the router at {base}")
        system = "You are a helpful assistant for the tokenyard demo. " * 20
        for question in (
            "What is a replica group?",
            "What does the router score?",
            "What is a replica group?",
        ):
            reply = _post(
                f"{base}/v1/completions", {"model": model, "prompt": system + question, "max_tokens": 16}
            )
            usage = reply["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            print(
                f"   {question!r}: {usage['completion_tokens']} tokens, {cached} of {usage['prompt_tokens']} prompt tokens from the prefix cache"
            )
        _say("the stack is running. Try:")
        print(f"   export KUBECONFIG={cluster.kubeconfig}")
        print(
            f"   curl -s {base}/v1/completions -H 'content-type: application/json' "
            f'-d \'{{"model": "{model}", "prompt": "hello", "max_tokens": 8}}\''
        )
        print(f"   {kubectl[0]} scale mdep {name} --replicas=3")
        print(f"   logs: {logs}")
        if not once:
            _say(
                "Ctrl-C stops the operator, the engines and the router (`make cluster-down` stops the cluster)"
            )
            while not stop.is_set():
                stop.wait(1)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs.values():
            stop_process(proc)
    return 0
