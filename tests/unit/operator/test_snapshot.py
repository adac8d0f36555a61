"""The typed snapshot of a ModelDeployment that a reconcile works from."""

import pytest
from pydantic import ValidationError
from tokenyard.core import labels
from tokenyard.operator.revision import revision_hash, revision_template
from tokenyard.operator.snapshot import DeploymentMeta, DeploymentSnapshot

SPEC = {
    "model": {"weights": {"uri": "hf://m", "digest": "sha256:" + "a" * 64}},
    "engine": {"image": "vllm:1"},
    "replicas": 2,
}


def body(spec=None, status=None):
    return {
        "metadata": {
            "name": "llm",
            "namespace": "ns",
            "uid": "u-1",
            "generation": 4,
            "annotations": {"tokenyard.dev/rollout-command": "promote"},
        },
        "spec": spec or SPEC,
        "status": status or {},
    }


def test_the_snapshot_does_not_change_with_the_body_it_came_from():
    live = body(status={"revisionHistory": [{"revision": "r1"}]})
    snapshot = DeploymentSnapshot.from_body(live)
    live["status"]["revisionHistory"].append({"revision": "r2"})
    live["metadata"]["annotations"]["x"] = "y"
    assert snapshot.status["revisionHistory"] == [{"revision": "r1"}]
    assert "x" not in snapshot.meta.annotations
    assert (snapshot.name, snapshot.namespace, snapshot.meta.generation, snapshot.spec.replicas) == (
        "llm",
        "ns",
        4,
        2,
    )


def test_owner_reference_makes_the_deployment_the_controller():
    owner = DeploymentSnapshot.from_body(body()).meta.owner_reference()
    assert owner == {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "name": "llm",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_an_invalid_spec_raises_but_its_metadata_still_reads():
    bad = body(spec={**SPEC, "replicas": -1})
    with pytest.raises(ValidationError):
        DeploymentSnapshot.from_body(bad)
    assert DeploymentMeta.from_body(bad).key == ("ns", "llm")


def test_an_old_revision_spec_comes_from_its_template_in_the_history():
    old = DeploymentSnapshot.from_body(body(spec={**SPEC, "engine": {"image": "vllm:0"}})).spec
    old_revision = revision_hash(old)
    history = [{"revision": old_revision, "template": revision_template(old)}, {"revision": "nothing-kept"}]
    snapshot = DeploymentSnapshot.from_body(
        body(spec={**SPEC, "replicas": 5}, status={"revisionHistory": history})
    )
    update = revision_hash(snapshot.spec)
    assert snapshot.spec_of_revision(update, update) is snapshot.spec
    restored = snapshot.spec_of_revision(old_revision, update)
    assert restored.engine.image == "vllm:0" and restored.replicas == 5  # the template, on today's spec
    assert revision_hash(restored) == old_revision
    assert snapshot.spec_of_revision("nothing-kept", update) is None  # recorded without its template
    assert snapshot.spec_of_revision("unknown", update) is None


def test_events_emit_an_event_as_info_or_warning(monkeypatch):
    import kopf
    from tokenyard.operator.kube_writes import Events
    from tokenyard.operator.snapshot import Event

    posted = []
    monkeypatch.setattr(kopf, "info", lambda body, reason, message: posted.append(("info", reason, message)))
    monkeypatch.setattr(kopf, "warn", lambda body, reason, message: posted.append(("warn", reason, message)))
    events = Events({"metadata": {"name": "llm"}})
    events.emit(Event("GroupPlaced", "group 0"))
    events.emit(Event("InsufficientCapacity", "1 group", warning=True))
    assert posted == [("info", "GroupPlaced", "group 0"), ("warn", "InsufficientCapacity", "1 group")]
