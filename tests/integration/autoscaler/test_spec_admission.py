"""The InferenceAutoscaler's window rules (CEL in the CRD) against the real API server."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tokenyard.core import labels

pytestmark = pytest.mark.integration

PLURAL = "inferenceautoscalers"


def autoscaler(name: str, **spec) -> dict:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "InferenceAutoscaler",
        "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"name": "m"}, "maxReplicas": 4, **spec},
    }


def create(kube_api, namespace: str, body: dict) -> dict:
    return client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, PLURAL, body
    )


@pytest.mark.parametrize(
    "case, spec, words",
    [
        # The defaulted interval (5 s) counts as much as a written one.
        ("panic-under-default-interval", {"panicWindowSeconds": 2}, "must be at least intervalSeconds"),
        (
            "panic-under-interval",
            {"intervalSeconds": 15, "panicWindowSeconds": 6},
            "must be at least intervalSeconds",
        ),
        (
            "panic-over-stable",
            {"stableWindowSeconds": 30, "panicWindowSeconds": 45},
            "must not exceed stableWindowSeconds",
        ),
    ],
)
def test_a_panic_window_outside_interval_and_stable_window_is_rejected(
    kube_api, namespace, case, spec, words
):
    with pytest.raises(ApiException) as rejected:
        create(kube_api, namespace, autoscaler(case, **spec))
    assert rejected.value.status == 422, rejected.value.body
    assert "spec.panicWindowSeconds" in rejected.value.body and words in rejected.value.body


def test_default_windows_and_an_equal_panic_window_and_interval_are_accepted(kube_api, namespace):
    defaults = create(kube_api, namespace, autoscaler("defaults"))["spec"]
    assert defaults["panicWindowSeconds"] >= defaults["intervalSeconds"]
    equal = create(kube_api, namespace, autoscaler("equal", intervalSeconds=15, panicWindowSeconds=15))
    assert equal["spec"]["panicWindowSeconds"] == 15
