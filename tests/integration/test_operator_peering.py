"""Two operator replicas through Kopf peering: one works, the other waits, and takes over when the first dies."""

from __future__ import annotations

import signal
import time

import pytest
from kubernetes import client
from tokenyard.core import labels

from tests.integration.conftest import operator_process, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = labels.GROUP, labels.VERSION, "modeldeployments"
PEERING = "tokenyard"
# A peer killed with SIGKILL never removes its record; the standby waits until the record's lifetime passes.
LIFETIME_SECONDS = 8


def _live_pods(core, namespace):
    """The deployment's pods not being deleted (Pending ones included: the message below says how many)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=pair").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def _groups_ready(custom, core, namespace, count):
    def check():
        status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "pair").get(
            "status", {}
        )
        pods = _live_pods(core, namespace)
        ready = [g for g in status.get("groups", []) if g["phase"] == "Ready"]
        if len(ready) == count and status.get("replicas") == count and len(pods) == count:
            return pods
        # raised, not returned: the timeout's message then says where it stood
        raise AssertionError(
            f"{len(ready)} Ready group(s) of {count}, {len(pods)} live pod(s) "
            f"({[(p.metadata.name, p.status.phase) for p in pods]}), conditions "
            f"{[(c.get('type'), c.get('status'), c.get('message')) for c in status.get('conditions', [])]}"
        )

    return check


def _since_last_pause(log: str) -> str | None:
    """What a replica logged since it last paused, or None when it is working. A replica that starts before
    its higher-priority peer registers works for a moment and then logs "Pausing operations"; one that starts
    after it never resumes at all."""
    paused_at, resumed_at = log.rfind("Pausing operations"), log.rfind("Resuming operations")
    if resumed_at > paused_at:
        return None
    return log[max(paused_at, 0) :]


def test_two_replicas_run_one_at_a_time_and_the_standby_takes_over_after_a_kill(
    devcluster, kube_api, namespace, tmp_path
):
    custom, core = client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)
    custom.create_namespaced_custom_object(
        "kopf.dev",
        "v1",
        namespace,
        "kopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}},
    )
    env = {"TOKENYARD_PEERING_LIFETIME_SECONDS": str(LIFETIME_SECONDS)}
    common = ("--namespace", namespace, "--peering", PEERING)
    active = operator_process(
        devcluster.kubeconfig, tmp_path / "active.log", *common, "--priority", "2", env=env
    )
    standby = operator_process(
        devcluster.kubeconfig, tmp_path / "standby.log", *common, "--priority", "1", env=env
    )
    active.start()
    standby.start()
    try:

        def both_peers_registered():
            peering = custom.get_namespaced_custom_object(
                "kopf.dev", "v1", namespace, "kopfpeerings", PEERING
            )
            priorities = sorted(p.get("priority") for p in (peering.get("status") or {}).values())
            return priorities == [1, 2]

        wait_for(both_peers_registered, timeout=60, what="both replicas in the KopfPeering status")
        # Kopf starts every replica paused and logs "Resuming operations" when the peering says it may work.
        wait_for(
            lambda: "Resuming operations" in active.log(), timeout=30, what="the active replica to start"
        )
        wait_for(
            lambda: _since_last_pause(standby.log()) is not None, timeout=30, what="the standby to pause"
        )

        spec = {
            "model": {"weights": {"uri": "hf://org/pair"}},
            "engine": {"image": "vllm/vllm-openai:v0.13.0"},
            "parallelism": {"tensor": 4},
            "replicas": 3,
        }
        body = {
            "apiVersion": labels.API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": "pair"},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        pods = wait_for(
            _groups_ready(custom, core, namespace, 3), timeout=120, what="3 groups by the active replica"
        )
        assert (
            len({p.metadata.labels[labels.GROUP_INDEX] for p in pods}) == 3
        )  # one pod per group, none twice
        # The standby stayed paused while the active replica lived: it never resumed nor handled the resource.
        handled = "kopf.objects"  # the logger of every handler run on a resource
        assert handled in active.log()
        assert handled not in _since_last_pause(standby.log())

        active.stop(sig=signal.SIGKILL)
        killed_at = time.monotonic()
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "pair", {"spec": {"replicas": 4}}
        )
        pods = wait_for(
            _groups_ready(custom, core, namespace, 4),
            timeout=LIFETIME_SECONDS + 60,
            what="the standby to take over and scale to 4 groups",
        )
        assert len({p.metadata.labels[labels.GROUP_INDEX] for p in pods}) == 4
        # Not before the dead replica's record ran out (its last keep-alive may be up to a second old).
        assert time.monotonic() - killed_at >= LIFETIME_SECONDS - 1.5
        assert "Resuming operations" in standby.log()
    finally:
        active.stop()
        standby.stop()
