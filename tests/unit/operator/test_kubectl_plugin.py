from pathlib import Path

import pytest
import yaml
from tokenyard.operator.kubectl_plugin import PluginError, describe, main, render_pods, undo_patch


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


# --- render ------------------------------------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_render_prints_every_rank_of_a_multi_pod_example(capsys):
    assert main(["render", "-f", str(EXAMPLES / "llama-405b-tp16.yaml")]) == 0
    pods = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [p["metadata"]["labels"]["tokenyard.dev/rank"] for p in pods] == ["0", "1"]
    leader, worker = (p["spec"]["containers"][0]["args"] for p in pods)
    assert "--headless" in worker and "--headless" not in leader


def test_render_of_every_example_is_a_pod_the_engine_can_start(capsys):
    for path in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] != "ModelDeployment":
            continue
        for pod in render_pods(doc, "default"):
            container = pod["spec"]["containers"][0]
            assert container["command"][0] in ("vllm", "python3"), path.name
            assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"], path.name


def test_render_refuses_an_invalid_spec_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "kind": "ModelDeployment",
                "metadata": {"name": "x"},
                "spec": {"model": {"weights": {"uri": "s3://b/m"}}, "engine": {"image": "i"}},
            }
        )
    )
    assert main(["render", "-f", str(bad)]) == 1
    assert "spec.model.weights.uri" in capsys.readouterr().err


def test_the_readme_shows_the_command_lines_and_the_pod_the_examples_really_render():
    """README's "Engines: what the pods run" is what platform engineers compare with their own pods: it must
    not drift from the renderer."""
    import re
    import shlex

    readme = (EXAMPLES.parent / "README.md").read_text()
    shown = re.findall(r"^# examples/(\S+), rank (\d+)\n(.+)$", readme, re.MULTILINE)
    rendered = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "ModelDeployment":
            for rank, pod in enumerate(render_pods(doc, "default")):
                c = pod["spec"]["containers"][0]
                rendered[(path.name, str(rank))] = shlex.join(c["command"] + c["args"])
    assert {(name, rank): line for name, rank, line in shown} == rendered
    full = readme.split("--rank 1`):\n\n```yaml\n", 1)[1].split("```", 1)[0]
    worker = render_pods(yaml.safe_load((EXAMPLES / "llama-405b-tp16.yaml").read_text()), "default")[1]
    assert yaml.safe_load(full) == worker
