import pytest
from tokenyard.operator.kubectl_plugin import PluginError, describe, undo_patch


def obj(**status):
    return {
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"replicas": 2, "rollout": {"strategy": "Canary", "steps": [{"setWeight": 10}]}},
        "status": status,
    }


def test_describe_shows_phase_weights_and_analysis():
    text = describe(
        obj(
            readyReplicas=2,
            traffic=[{"revision": "aaa", "weight": 90}, {"revision": "bbb", "weight": 10}],
            rollout={
                "phase": "Paused",
                "step": 0,
                "stableRevision": "aaa",
                "canaryRevision": "bbb",
                "analysis": {"decision": "INCONCLUSIVE", "reason": "no data"},
            },
        )
    )
    assert "Phase:      Paused" in text and "bbb 10%" in text and "INCONCLUSIVE: no data" in text


def test_undo_restores_the_revision_before_the_current_one():
    history = [
        {"revision": "r1", "template": {"engine": {"image": "v1"}}},
        {"revision": "r2", "template": {"engine": {"image": "v2"}}},
    ]
    assert undo_patch(obj(updateRevision="r2", revisionHistory=history), None) == {
        "spec": {"engine": {"image": "v1"}}
    }
    assert undo_patch(obj(updateRevision="r1", revisionHistory=history), "r2") == {
        "spec": {"engine": {"image": "v2"}}
    }


def test_undo_names_what_is_missing():
    with pytest.raises(PluginError, match="no previous revision"):
        undo_patch(obj(updateRevision="r1", revisionHistory=[{"revision": "r1"}]), None)
    with pytest.raises(PluginError, match="not in the history"):
        undo_patch(obj(updateRevision="r1", revisionHistory=[{"revision": "r1"}]), "zz")
