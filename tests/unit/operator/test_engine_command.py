"""Golden tests of the rendered engine pods (issue 13): each engine kind x {one pod, a multi-pod group}, with
the exact command line asserted, and what a GPU engine pod needs around it (shm, probes, token, cache, drain)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from tokenyard.core import labels
from tokenyard.core.types import ModelDeploymentSpec
from tokenyard.operator.manifests import GroupNames, pod_manifest

NAMES = GroupNames("llama", "team-a", "0123456789", 0)
LEADER = "r0.llama-01234567-0.team-a.svc"
CONTEXT_FLAG = {"SGLang": "--context-length=8192"}


def spec(kind: str = "vLLM", tensor: int = 4, **engine) -> ModelDeploymentSpec:
    return ModelDeploymentSpec.parse(
        {
            "model": {
                "servedModelName": "llama-chat",
                "weights": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            },
            "engine": {
                "kind": kind,
                "image": "img:1",
                "args": [CONTEXT_FLAG.get(kind, "--max-model-len=8192")],
                **engine,
            },
            "parallelism": {"tensor": tensor, "gpusPerPod": min(tensor, 8)},
        }
    )


def container(s: ModelDeploymentSpec, rank: int = 0) -> dict:
    return pod_manifest(s, NAMES, rank, "node-1")["spec"]["containers"][0]


def argv(s: ModelDeploymentSpec, rank: int = 0) -> list[str]:
    c = container(s, rank)
    return [*c.get("command", []), *c["args"]]


def test_vllm_one_pod():
    assert argv(spec()) == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "llama-chat",
        "--port", "8000",
        "--tensor-parallel-size", "4",
        "--pipeline-parallel-size", "1",
        "--max-model-len=8192",
    ]  # fmt: skip


def test_vllm_two_pod_group_uses_its_multinode_flags_with_a_headless_worker():
    leader, worker = argv(spec(tensor=16), 0), argv(spec(tensor=16), 1)
    common = [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "llama-chat",
        "--port", "8000",
        "--tensor-parallel-size", "16",
        "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "mp",
        "--nnodes", "2",
    ]  # fmt: skip
    assert leader == [*common, "--node-rank", "0", "--master-addr", LEADER, "--master-port", "29500",
                      "--max-model-len=8192"]  # fmt: skip
    assert worker == [*common, "--node-rank", "1", "--master-addr", LEADER, "--master-port", "29500",
                      "--headless", "--max-model-len=8192"]  # fmt: skip


def test_sglang_one_pod():
    assert argv(spec("SGLang")) == [
        "python3", "-m", "sglang.launch_server",
        "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "llama-chat",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--tp-size", "4",
        "--pp-size", "1",
        "--enable-metrics",
        "--context-length=8192",
    ]  # fmt: skip


def test_sglang_two_pod_group_joins_the_leader_through_the_headless_service():
    for rank in (0, 1):
        assert argv(spec("SGLang", tensor=16), rank)[-8:] == [
            "--enable-metrics",
            "--nnodes", "2",
            "--node-rank", str(rank),
            "--dist-init-addr", f"{LEADER}:5000",
            "--context-length=8192",
        ]  # fmt: skip


@pytest.mark.parametrize("tensor", [4, 16])
def test_custom_keeps_the_images_entrypoint_and_the_tokenyard_environment(tensor):
    for rank in range(tensor // 4 if tensor > 8 else 1):
        c = container(spec("Custom", tensor), rank)
        assert "command" not in c and c["args"] == ["--max-model-len=8192"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[labels.ENV_TENSOR_PARALLEL] == str(tensor) and env[labels.ENV_RANK] == str(rank)
        assert "startupProbe" not in c and "lifecycle" not in c and "volumeMounts" not in c


def test_revision_and_tokenizer_come_from_the_uris():
    s = ModelDeploymentSpec.parse(
        {
            "model": {
                "weights": {"uri": "hf://org/model@v2.1"},
                "tokenizer": {"uri": "hf://org/tokenizer@abc123"},
            },
            "engine": {"image": "img"},
        }
    )
    args = argv(s)
    assert args[2] == "org/model"
    assert args[args.index("--revision") + 1] == "v2.1"
    assert args[args.index("--tokenizer") + 1] == "org/tokenizer"
    assert args[args.index("--tokenizer-revision") + 1] == "abc123"
    # No served name given: clients use the ModelDeployment's name.
    assert args[args.index("--served-model-name") + 1] == "llama"


def test_a_pvc_uri_is_mounted_read_only_and_passed_as_a_path():
    s = ModelDeploymentSpec.parse(
        {"model": {"weights": {"uri": "pvc://models/qwen/72b"}}, "engine": {"kind": "SGLang", "image": "img"}}
    )
    pod = pod_manifest(s, NAMES, 0, "node-1")
    c = pod["spec"]["containers"][0]
    assert c["args"][c["args"].index("--model-path") + 1] == "/mnt/pvc/models/qwen/72b"
    assert {"name": "model-pvc-0", "mountPath": "/mnt/pvc/models", "readOnly": True} in c["volumeMounts"]
    assert {"name": "model-pvc-0", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod[
        "spec"
    ]["volumes"]


def test_what_a_gpu_engine_pod_needs_to_start_and_to_stop():
    s = spec(
        startupTimeoutSeconds=1200,
        hfTokenSecret={"name": "hf"},
        modelCache={"claimName": "hf-cache"},
        sharedMemorySize="16Gi",
    )
    pod = pod_manifest(s, NAMES, 0, "node-1")
    c = pod["spec"]["containers"][0]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert (
        volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        and mounts["dshm"] == "/dev/shm"
    )
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert mounts["model-cache"] == "/root/.cache/huggingface"
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}
    assert env["HF_HOME"]["value"] == "/root/.cache/huggingface"
    # Model loading gets 1200 s before the startup probe gives up; readiness is probed only after it.
    probe = c["startupProbe"]
    assert (
        probe["httpGet"]["path"] == "/health" and probe["periodSeconds"] * probe["failureThreshold"] == 1200
    )
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # In-flight streams get up to the rollout's drain period before SIGTERM: the leader's hook waits on its own
    # engine's open requests, and the grace period covers the whole drain.
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    assert command[3:] == [
        "http://127.0.0.1:8000/metrics",
        "30",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ]
    assert pod["spec"]["terminationGracePeriodSeconds"] > 30


def test_workers_serve_no_api_so_they_carry_no_http_probes():
    worker = container(spec(tensor=16), 1)
    assert "startupProbe" not in worker and "readinessProbe" not in worker
    # A worker cannot see the group's requests, so it outlasts any stream its leader may still serve.
    assert worker["lifecycle"]["preStop"] == {"sleep": {"seconds": 30}}


def test_user_volumes_from_the_pod_template_are_kept_beside_the_rendered_ones():
    s = spec(
        podTemplate={
            "spec": {"volumes": [{"name": "extra", "emptyDir": {}}], "terminationGracePeriodSeconds": 5}
        }
    )
    pod = pod_manifest(s, NAMES, 0, "node-1")
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["extra", "dshm"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 5  # the user's choice wins


@pytest.mark.parametrize(
    "kind,args,words",
    [
        (
            "vLLM",
            ["--tensor-parallel-size", "8"],
            "args[0]: --tensor-parallel-size sets the tensor-parallel size",
        ),
        ("vLLM", ["--max-model-len=1", "-tp=8"], "args[1]: -tp sets the tensor-parallel size"),
        ("vLLM", ["--pipeline_parallel_size=2"], "--pipeline_parallel_size sets the pipeline-parallel size"),
        ("vLLM", ["--model", "other"], "--model sets the model"),
        ("SGLang", ["--tp", "2"], "--tp sets the tensor-parallel size"),
        ("SGLang", ["--dist-init-addr=x:1"], "--dist-init-addr sets the multi-node bootstrap"),
    ],
)
def test_a_user_flag_that_contradicts_the_spec_is_refused_naming_it(kind, args, words):
    with pytest.raises(ValidationError, match=words.replace("[", r"\[").replace("]", r"\]")):
        spec(kind, args=args)


def test_flags_the_operator_does_not_render_pass_through_for_both_kinds():
    for kind in ("vLLM", "SGLang"):
        assert argv(spec(kind, args=["--max-num-seqs=64", "--trust-remote-code"]))[-2:] == [
            "--max-num-seqs=64",
            "--trust-remote-code",
        ]


@pytest.mark.parametrize("uri", ["s3://bucket/m", "gs://b/m", "https://hf.co/m", "models/relative", "hf://"])
def test_uris_a_rendered_engine_cannot_load_are_refused_naming_the_field(uri):
    with pytest.raises(ValidationError, match="spec.model.weights.uri"):
        ModelDeploymentSpec.parse({"model": {"weights": {"uri": uri}}, "engine": {"image": "img"}})
    # Custom leaves the URI to the image.
    ModelDeploymentSpec.parse(
        {"model": {"weights": {"uri": uri}}, "engine": {"kind": "Custom", "image": "img"}}
    )


# --- the rendered pods against the engines' documented flags (not the simulator's parser) ---------------------
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
DOCUMENTED_FLAGS = {
    "vLLM": FIXTURES / "vllm_v0.13.0_serve_flags.txt",
    "SGLang": FIXTURES / "sglang_v0.5_server_args.txt",
}
DOCUMENTED_COMMAND = {"vLLM": ["vllm", "serve"], "SGLang": ["python3", "-m", "sglang.launch_server"]}


def documented_flags(kind: str) -> set[str]:
    return {line.strip() for line in DOCUMENTED_FLAGS[kind].read_text().splitlines() if line.startswith("--")}


def rendered_argvs():
    """(label, kind, argv) of every rank of both kinds x one pod / a two-pod group, and of every example."""
    for kind in ("vLLM", "SGLang"):
        for tensor in (4, 16):
            s = spec(kind, tensor)
            for rank in range(s.parallelism.pods_per_group):
                yield f"{kind} tp{tensor} rank {rank}", kind, argv(s, rank)
    examples = Path(__file__).resolve().parents[3] / "examples"
    for path in sorted(examples.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] != "ModelDeployment":
            continue
        s = ModelDeploymentSpec.parse(doc["spec"])
        names = GroupNames(doc["metadata"]["name"], "default", "0123456789", 0)
        for rank in range(s.parallelism.pods_per_group):
            c = pod_manifest(s, names, rank, "node-1")["spec"]["containers"][0]
            yield f"{path.name} rank {rank}", s.engine.kind.value, [*c["command"], *c["args"]]


def test_every_rendered_flag_is_one_the_engine_documents():
    for label, kind, args in rendered_argvs():
        command = DOCUMENTED_COMMAND[kind]
        assert args[: len(command)] == command, label
        flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
        assert flags and flags <= documented_flags(kind), (label, sorted(flags - documented_flags(kind)))


def test_a_flag_the_engine_does_not_document_is_caught():
    # The check above must be able to fail: an invented flag is not in the documented list.
    assert "--tensor-parallel" not in documented_flags("vLLM")
    assert "--tensor-parallel-size" not in documented_flags("SGLang")
