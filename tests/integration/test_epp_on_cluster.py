"""The router as the Inference Extension's endpoint picker on the local cluster (issue 18): the InferencePool CRD
(the published manifest in tests/fixtures/crds), the operator publishing a pool per ModelDeployment, simulated
engines on the pods' IPs, a router that discovers the replicas from the cluster and serves --epp-port, and the
gateway stand-in in front of it. Every request goes client -> stand-in -> (pick) -> engine pod -> stand-in ->
client, as through a gateway.

(1) requests are served by the pods the operator's pool selects, spread over the replicas, and prompts that share
a long prefix land on one replica; (2) a canary's weight, written by the operator in the status, holds for the
traffic through the stand-in; (3) an engine killed mid-run under load fails no request that had not started
streaming (the stand-in falls back to the picker's next endpoint); (4) when every replica is saturated, the picker
answers 429 through the stand-in.

The engines run in this process (``PodRunner`` on its own event loop, as `python -m tokenyard.sim pods` runs it)
so that one of them can be killed the way a process dies: listener closed, open connections dropped, while its
pod stays Ready and the router learns of it only from its own probes and the gateway's reports.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from kubernetes import client
from tokenyard.core import labels
from tokenyard.devcluster.cluster import free_port
from tokenyard.devcluster.gateway_standin import ensure_gateway_standin
from tokenyard.sim.pods import PodRunner
from tokenyard.sim.server import SimEngine

from tests.integration.conftest import (
    ManagedProcess,
    WorkerThreads,
    new_namespace,
    operator_process,
    wait_for,
)
from tests.integration.test_inference_pool import PICKER_ENV, install_pool_crd, read_pool, remove_pool_crd

pytestmark = pytest.mark.integration

# the router's --max-outstanding-requests (per replica); the other tests stay well below it
SATURATION_LIMIT = 8
POOL_BATCH_SIZE = 32


def deployment(
    name: str,
    replicas: int,
    time_scale: float | None = None,
    rollout: dict | None = None,
    args: list[str] | None = None,
) -> dict:
    env = [] if time_scale is None else [{"name": labels.ENV_SIM_TIME_SCALE, "value": str(time_scale)}]
    spec = {
        "model": {"servedModelName": f"{name}-model", "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
        "engine": {"image": "vllm/vllm-openai:v0.13.0", "env": env, "args": args or []},
        "parallelism": {"tensor": 1},
        "replicas": replicas,
    }
    if rollout:
        spec["rollout"] = rollout
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


CANARY_ROLLOUT = {"strategy": "Canary", "drainSeconds": 1, "steps": [{"setWeight": 25}, {"pause": {}}]}
# Each test has its own deployment, all created at once when the module starts so that their groups come up
# together. Time scales: the module's 0.02 for the traffic tests, 15 times slower for the kill (so that streams are
# open when it strikes), real time for saturation (2000-token streams that stay open while the test looks).
DEPLOYMENTS = {
    # a batch of 32: more than the traffic tests ever run at once on one replica, so it changes none of them
    "pool": deployment("pool", 3, args=[f"--max-num-seqs={POOL_BATCH_SIZE}"]),
    "canary": deployment("canary", 2, rollout=CANARY_ROLLOUT),
    "kill": deployment("kill", 3, time_scale=0.3),
    "full": deployment("full", 1, time_scale=1.0),
}


class InProcessPods:
    """The engine pods served by a ``PodRunner`` on an event loop in a thread of the test process."""

    def __init__(self, kubeconfig: str, time_scale: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sim-pods", daemon=True)
        self.thread.start()
        self.runner = PodRunner(kubeconfig, time_scale=time_scale)
        self.call(self.runner.start())

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def engine_at(self, address: str) -> SimEngine:
        (engine,) = [e for _, e in self.runner.engines.values() if e.url == f"http://{address}"]
        return engine

    def kill(self, address: str) -> None:
        # The simulator's model of a dead process: the listener closes, every open connection is dropped, and
        # nothing answers again. The pod stays Ready, as it would until the kubelet noticed.
        engine = self.engine_at(address)
        self.call(engine.crash())

    def stop(self) -> None:
        self.call(self.runner.stop(), timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def module_namespace(devcluster, kube_api):
    with new_namespace(kube_api, prefix="t-epp-") as name:
        yield name


@pytest.fixture(scope="module")
def stack(devcluster, kubectl, kube_api, module_namespace, tmp_path_factory):
    folder = tmp_path_factory.mktemp("epp-on-cluster")
    standin_binary = ensure_gateway_standin()
    install_pool_crd(kubectl)
    custom = client.CustomObjectsApi(kube_api)
    for body in DEPLOYMENTS.values():
        custom.create_namespaced_custom_object(
            labels.GROUP, labels.VERSION, module_namespace, "modeldeployments", body
        )
    router_port, epp_port, standin_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    processes: list[ManagedProcess] = []
    pods = None
    try:
        processes.append(
            operator_process(devcluster.kubeconfig, folder / "operator.log", env=PICKER_ENV).start()
        )
        pods = InProcessPods(str(devcluster.kubeconfig), time_scale=0.02)
        router = ManagedProcess(
            [
                "tokenyard.router",
                "--kubeconfig",
                str(devcluster.kubeconfig),
                "--namespace",
                module_namespace,
                "--port",
                str(router_port),
                "--grpc-port",
                "-1",
                "--epp-port",
                str(epp_port),
                "--metrics-port",
                str(metrics_port),
                "--max-outstanding-requests",
                str(SATURATION_LIMIT),
            ],
            folder / "router.log",
        ).start()
        processes.append(router)
        standin = ManagedProcess(
            ["--listen", f"127.0.0.1:{standin_port}", "--epp", f"127.0.0.1:{epp_port}"],
            folder / "standin.log",
            program=[str(standin_binary)],
        ).start()
        processes.append(standin)
        wait_for(lambda: "listening on" in standin.log(), timeout=20, what="the stand-in to listen")
        yield {
            "gateway": f"http://127.0.0.1:{standin_port}",
            "router": router,
            "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
            "pods": pods,
            "custom": custom,
            "core": client.CoreV1Api(kube_api),
            "namespace": module_namespace,
        }
    finally:
        for process in reversed(processes):
            process.stop()
        if pods is not None:
            pods.stop()
        remove_pool_crd(kubectl)  # the cluster as the other modules expect it


# --- the client side ------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One request through the stand-in, as the client saw it."""

    outcome: (
        str  # "ok"; "cut": the response had started (status 200 sent) and broke; "refused": it never started
    )
    status: int
    upstream: str  # the endpoint the stand-in really forwarded to (its test header), "" if none
    replica: str  # the picker's own account (x-tokenyard-replica)
    revision: str
    text: str
    started: float = 0.0
    ended: float = 0.0
    headers: dict[str, str] | None = None


def ask(
    gateway: str,
    model: str,
    prompt: str,
    max_tokens: int = 4,
    stream: bool = True,
    timeout: float = 60,
    streaming: Callable[[str, int], None] | None = None,
) -> Answer:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}).encode()
    request = urllib.request.Request(f"{gateway}/v1/completions", body, {"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        headers = {k.lower(): v for k, v in e.headers.items()}
        return Answer("refused", e.code, "", "", "", text, started, time.monotonic(), headers)
    except OSError as e:  # no status line at all
        return Answer("refused", 0, "", "", "", repr(e), started, time.monotonic())
    headers = response.headers
    upstream, replica = headers.get("x-standin-upstream", ""), headers.get("x-tokenyard-replica", "")
    revision = headers.get("x-tokenyard-revision", "")
    if streaming is not None:
        streaming(upstream, +1)  # the status line is out: from here on the request has started
    try:
        with response:
            text = response.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:  # the stream broke mid-way
        return Answer("cut", response.status, upstream, replica, revision, repr(e), started, time.monotonic())
    finally:
        if streaming is not None:
            streaming(upstream, -1)
    complete = (not stream) or text.rstrip().endswith("data: [DONE]")
    outcome = "ok" if complete else "cut"
    return Answer(outcome, response.status, upstream, replica, revision, text, started, time.monotonic())


def ask_many(gateway: str, model: str, prompts: list[str], workers: int, **kwargs) -> list[Answer]:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda p: ask(gateway, model, p, **kwargs), prompts))


def document(topic: int) -> str:
    """A long shared prefix (several KV blocks), distinct per topic from its first words."""
    return f"Background document {topic}: " + " ".join(f"fact-{topic}-{i}" for i in range(120))


# --- the cluster side -----------------------------------------------------------------------------------------


def get_deployment(stack, name: str) -> dict:
    return stack["custom"].get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, stack["namespace"], "modeldeployments", name
    )


def pool_members(stack, name: str) -> dict[str, dict]:
    """The operator's InferencePool for deployment `name` and what it selects: endpoint address (pod IP and the
    pool's target port, as a gateway reads it) -> the pod's labels."""
    pool = read_pool((stack["custom"], stack["core"]), stack["namespace"], name)
    assert pool is not None, f"no InferencePool for {name}"
    (port,) = [p["number"] for p in pool["spec"]["targetPorts"]]
    selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
    pods = stack["core"].list_namespaced_pod(stack["namespace"], label_selector=selector).items
    return {f"{p.status.pod_ip}:{port}": p.metadata.labels for p in pods if p.status.pod_ip}


def ready(stack, name: str, groups: int):
    """The deployment has `groups` Ready groups and its pool selects that many pods."""

    def check():
        status = get_deployment(stack, name).get("status", {})
        if status.get("readyReplicas") != groups:
            return False
        if read_pool((stack["custom"], stack["core"]), stack["namespace"], name) is None:
            return False
        members = pool_members(stack, name)
        return len(members) == groups and members

    return check


def router_idle(stack) -> bool:
    """The router's own gauges: no client request in flight and nothing outstanding on any replica."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(stack["metrics"], timeout=5) as response:
        text = response.read().decode()
    samples = {
        (s.name, s.labels.get("replica", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ("tokenyard_router_in_flight_requests", "tokenyard_router_outstanding_requests")
    }
    assert ("tokenyard_router_in_flight_requests", "") in samples, "the router exports no in-flight gauge"
    return all(value == 0 for value in samples.values())


def served_through_gateway(stack, model: str):
    def check():
        answer = ask(stack["gateway"], model, "warm-up", max_tokens=1)
        return answer.outcome == "ok" and answer

    return check


def test_traffic_through_the_operators_pool_spreads_and_keeps_prefixes_together(stack):
    members = wait_for(
        ready(stack, "pool", 3), timeout=90, interval=0.5, what="3 groups of pool and its InferencePool"
    )
    wait_for(
        served_through_gateway(stack, "pool-model"), timeout=60, interval=0.3, what="the picker to serve it"
    )

    # Distinct short prompts, 6 at a time: served, by the pool's pods only, spread by load.
    answers = ask_many(
        stack["gateway"], "pool-model", [f"user {i} asks a question" for i in range(60)], workers=6
    )
    assert [a for a in answers if a.outcome != "ok"] == []
    assert {a.upstream for a in answers} <= set(members), "a request went to a pod the pool does not select"
    spread = Counter(a.upstream for a in answers)
    print(f"spread of 60 requests over the pool: {sorted(spread.values())}")
    assert len(spread) == 3 and min(spread.values()) >= 6, f"requests per replica: {dict(spread)}"
    # The picker's account of each request names the replica the stand-in really forwarded to.
    assert len({(a.upstream, a.replica) for a in answers}) == 3, {(a.upstream, a.replica) for a in answers}

    # Prefix locality: 6 topics, 4 rounds of one request per topic at once (each with its own question).
    topics = range(6)
    by_topic: dict[int, list[str]] = {t: [] for t in topics}
    for round_ in range(4):
        prompts = [document(t) + f" Question {round_}?" for t in topics]
        for t, answer in zip(
            topics, ask_many(stack["gateway"], "pool-model", prompts, workers=6), strict=True
        ):
            assert answer.outcome == "ok", answer
            by_topic[t].append(answer.upstream)
    print(f"prefix locality, replicas per topic over 4 rounds: {[len(set(r)) for r in by_topic.values()]}")
    assert all(len(set(replicas)) == 1 for replicas in by_topic.values()), by_topic
    assert len({replicas[0] for replicas in by_topic.values()}) > 1, f"every topic on one replica: {by_topic}"


def test_the_router_knows_each_replicas_batch_size_from_the_deployment(stack):
    """The pool's engine args set --max-num-seqs: the router exports it as each replica's cap (the freeSlot
    filter's and the load guard's) before any request has queued there, where from /metrics alone it would learn
    it only once requests wait (the gauge reads 0 while the cap is unknown)."""
    from prometheus_client.parser import text_string_to_metric_families

    wait_for(ready(stack, "pool", 3), timeout=90, interval=0.5, what="3 groups of pool")
    leaders = {
        pod.metadata.name
        for pod in stack["core"]
        .list_namespaced_pod(stack["namespace"], label_selector=f"{labels.MODEL_DEPLOYMENT}=pool")
        .items
        if (pod.metadata.labels or {}).get(labels.ROLE) == labels.ROLE_LEADER
    }
    assert len(leaders) == 3, leaders

    def caps():
        with urllib.request.urlopen(stack["metrics"], timeout=5) as response:
            text = response.read().decode()
        found = {
            sample.labels["replica"]: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "tokenyard_router_replica_concurrency" and sample.labels["replica"] in leaders
        }
        return found if len(found) == len(leaders) else None

    exported = wait_for(caps, timeout=30, interval=0.3, what="the router's gauges of the pool's replicas")
    assert exported == dict.fromkeys(leaders, float(POOL_BATCH_SIZE)), exported


def test_canary_weight_from_the_status_holds_through_the_picker(stack):
    wait_for(ready(stack, "canary", 2), timeout=90, interval=0.5, what="2 stable groups of canary")
    wait_for(
        served_through_gateway(stack, "canary-model"), timeout=60, interval=0.3, what="the picker to serve it"
    )
    stable = get_deployment(stack, "canary")["status"]["currentRevision"]
    stack["custom"].patch_namespaced_custom_object(
        labels.GROUP,
        labels.VERSION,
        stack["namespace"],
        "modeldeployments",
        "canary",
        {"spec": {"engine": {"image": "vllm/vllm-openai:v0.12.0"}}},
    )

    def weights():
        status = get_deployment(stack, "canary")["status"]
        split = {t["revision"]: t["weight"] for t in status.get("traffic", [])}
        paused = (status.get("rollout") or {}).get("phase") == "Paused"
        return paused and len(split) == 2 and split.get(stable) == 75 and split

    split = wait_for(weights, timeout=90, interval=0.5, what="the canary at 25% and paused")
    (canary,) = set(split) - {stable}
    # The weight is set once the canary's group is Ready: the pool now selects its leader too.
    members = wait_for(
        lambda: len(m := pool_members(stack, "canary")) == 3 and m,
        timeout=30,
        what="the pool to select 3 leaders",
    )
    assert Counter(m[labels.REVISION] for m in members.values()) == {stable: 2, canary: 1}
    # The router reads the new split from the status: await its first canary answer through the stand-in.
    wait_for(
        lambda: (
            ask(stack["gateway"], "canary-model", f"probe {time.monotonic()}", max_tokens=1).revision
            == canary
        ),
        timeout=30,
        interval=0.05,
        what="a first answer from the canary",
    )

    total = 240
    answers = ask_many(
        stack["gateway"], "canary-model", [f"request {i} " * 3 for i in range(total)], workers=8, max_tokens=1
    )
    assert [a for a in answers if a.outcome != "ok"] == []
    # What the client got really came from the revision the picker says: the upstream pod's own label.
    assert all(members[a.upstream][labels.REVISION] == a.revision for a in answers)
    share = sum(a.revision == canary for a in answers) / total
    print(f"canary share through the stand-in: {share:.3f} of {total} for weight 25")
    # 25% +- 11 points: 4 sigma of a binomial share at n=240 (sigma = 2.8 points).
    assert 0.14 <= share <= 0.36, f"canary share {share:.3f} of {total} for weight 25"


class GatewayLoad(WorkerThreads):
    """Steady streaming load through the stand-in, recording every answer; counts the streams open on each
    upstream (from their response headers), so that the test can kill an engine while clients stream from it."""

    JOIN_SECONDS = 60.0

    def __init__(self, gateway: str, model: str, workers: int, max_tokens: int) -> None:
        super().__init__(workers)
        self.gateway, self.model, self.max_tokens = gateway, model, max_tokens
        self.answers: list[Answer] = []
        self.open: Counter = Counter()

    def _streaming(self, upstream: str, delta: int) -> None:
        with self.lock:
            self.open[upstream] += delta

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            prompt = f"worker {worker} request {n}"
            answer = ask(
                self.gateway, self.model, prompt, max_tokens=self.max_tokens, streaming=self._streaming
            )
            with self.lock:
                self.answers.append(answer)

    def busiest(self) -> tuple[str, int]:
        with self.lock:
            return max(self.open.items(), key=lambda kv: kv[1], default=("", 0))

    def done(self) -> list[Answer]:
        with self.lock:
            return list(self.answers)


def test_an_engine_killed_under_load_fails_no_request_that_had_not_started(stack):
    members = wait_for(ready(stack, "kill", 3), timeout=90, interval=0.5, what="3 groups of kill")
    wait_for(
        served_through_gateway(stack, "kill-model"), timeout=60, interval=0.3, what="the picker to serve it"
    )
    pods = stack["pods"]
    with GatewayLoad(stack["gateway"], "kill-model", workers=6, max_tokens=48) as load:
        wait_for(
            lambda: len({a.upstream for a in load.done() if a.outcome == "ok"}) == 3,
            timeout=60,
            what="every replica serving the load",
        )

        # The victim: a replica that clients are streaming from right now (2 streams at least, so that the kill
        # cuts some mid-way rather than between requests).
        victim = wait_for(
            lambda: (b := load.busiest())[1] >= 2 and b[0], timeout=30, interval=0.005, what="2 streams open"
        )
        assert victim in members
        pods.kill(victim)
        killed_at = time.monotonic()
        # Keep the load on until 60 requests that began after the kill have ended.
        wait_for(
            lambda: sum(a.started > killed_at for a in load.done()) >= 60,
            timeout=90,
            what="60 requests after the kill",
        )
    answers = load.done()
    refused = [a for a in answers if a.outcome == "refused"]
    cut = [a for a in answers if a.outcome == "cut"]
    after = [a for a in answers if a.started > killed_at]
    print(
        f"kill: {len(answers)} requests, {len(cut)} cut mid-stream, {len(refused)} failed before streaming, "
        f"{sum(a.upstream == victim for a in after)} of {len(after)} begun after the kill reached the victim"
    )
    assert refused == [], (
        f"{len(refused)} requests failed before streaming: {[(a.status, a.text) for a in refused[:3]]}"
    )
    assert cut, "no stream was open on the killed engine: the kill did not happen mid-run"
    assert all(a.upstream == victim for a in cut), "a stream broke on an engine that was not killed"
    assert all(a.outcome == "ok" and a.upstream != victim for a in after), "the dead engine answered"
    # What the cut streams and the failed attempts reserved is released: nothing stays outstanding.
    wait_for(lambda: router_idle(stack), timeout=30, what="the router to hold no request")


def test_every_replica_saturated_gets_a_429_through_the_picker(stack):
    wait_for(ready(stack, "full", 1), timeout=90, interval=0.5, what="1 group of full")
    wait_for(
        served_through_gateway(stack, "full-model"), timeout=60, interval=0.3, what="the picker to serve it"
    )
    host, port = stack["gateway"].removeprefix("http://").split(":")
    body = json.dumps({"model": "full-model", "prompt": "a long answer", "max_tokens": 2000, "stream": True})
    held: list[http.client.HTTPConnection] = []
    try:
        for _ in range(SATURATION_LIMIT):  # streams that run for tens of seconds in real time
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200
            assert response.readline().startswith(b"data: ")  # the stream is running
            held.append(connection)
        answer = ask(stack["gateway"], "full-model", "one more", max_tokens=1)
        assert (answer.outcome, answer.status) == ("refused", 429), answer
        assert (
            answer.headers["x-standin-immediate"] == "true"
        )  # the picker's ImmediateResponse, not the engine
        assert int(answer.headers["retry-after"]) >= 1
        assert "saturated" in answer.text, answer.text
    finally:
        for connection in held:  # the client goes away: the picker releases what these held
            connection.close()
    wait_for(lambda: router_idle(stack), timeout=30, what="the held streams released")
    assert ask(stack["gateway"], "full-model", "after", max_tokens=1).outcome == "ok"
