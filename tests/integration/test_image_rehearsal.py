"""The image's build replayed without a container engine (none can run here): the Dockerfile's own commands, read
from it, run in throwaway virtualenvs, and what they install is started the way the image starts it.

- Build stage: its COPY sources into a fresh context, then its RUN (generate the gRPC code, build the wheels),
  with /wheels redirected to a folder of the test's.
- Runtime stage: its `pip install` of that version from those wheels only (--no-index), in a fresh venv.
- Then, as the image's numeric non-root user, with its environment (HOME and TMPDIR a writable folder, as the
  chart's emptyDir at /tmp): `tokenyard sim serve` and `tokenyard router` in front of it serve a completion, and
  nothing is written inside the installed venv (the image's read-only root file system).

What it cannot show: that the base image tag exists, the Python of that base (3.12) rather than this machine's,
and the user and group the RUN creates. It needs PyPI, as a build does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import tomllib
import urllib.error
import urllib.request
import venv
from pathlib import Path

import pytest

from tests.integration.conftest import wait_for
from tests.unit.test_image import ROOT, arg_defaults, key_values, stages

pytestmark = pytest.mark.integration

IMAGE_USER = 65532
SETPRIV = shutil.which("setpriv")


def fresh_venv(folder: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    return folder / "bin"


def run_stage_command(command: str, cwd: Path, bin_dir: Path, wheels: Path, env: dict[str, str]) -> None:
    """One RUN line of the Dockerfile, its `pip`/`python` those of `bin_dir`, /wheels the test's folder."""
    command = command.replace("/wheels", str(wheels))
    environment = {**os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def installed():
    """The runtime stage's venv and the image's environment, in a folder the image user can reach (pytest's own
    temporary folders are private to root)."""
    work = Path(tempfile.mkdtemp(prefix="tokenyard-image-", dir="/tmp"))
    try:
        yield build_and_install(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_and_install(work: Path) -> tuple[Path, dict[str, str]]:
    build_stage, runtime_stage = stages()
    context, wheels = work / "src", work / "wheels"
    context.mkdir()
    wheels.mkdir()
    for keyword, rest in build_stage:
        if keyword == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                origin = ROOT / source
                if origin.is_dir():
                    shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(origin, context / source)
    build_env = next((key_values(rest) for k, rest in build_stage if k == "ENV"), {})
    build_bin = fresh_venv(work / "build-venv")
    for keyword, rest in build_stage:
        if keyword == "RUN":
            run_stage_command(rest, context, build_bin, wheels, build_env)

    image_env = next(key_values(rest) for k, rest in runtime_stage if k == "ENV")
    version = arg_defaults()["VERSION"]
    assert version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (install,) = [rest for k, rest in runtime_stage if k == "RUN"]
    # the RUN's bind mount is BuildKit syntax, and its user creation needs root in a container: the pip part only
    pip_part = re.sub(r"^--mount=\S+\s+", "", install).split("&&")[0].replace("${VERSION}", version)
    assert pip_part.lstrip().startswith("pip install --no-index"), pip_part
    runtime = work / "runtime-venv"
    run_stage_command(pip_part, work, fresh_venv(runtime), wheels, image_env)
    # what a root-owned image gives its non-root user: read and execute only
    subprocess.run(["chmod", "-R", "go-w,go+rX", str(runtime)], check=True)
    work.chmod(0o755)
    return runtime, image_env


def as_image_user(runtime: Path, image_env: dict[str, str], home: Path, *args: str) -> subprocess.Popen:
    env = {
        **image_env,
        "HOME": str(home),
        "TMPDIR": str(home),
        "PATH": f"{runtime / 'bin'}:/usr/bin:/bin",
    }
    command = [SETPRIV, f"--reuid={IMAGE_USER}", f"--regid={IMAGE_USER}", "--clear-groups"]
    return subprocess.Popen(
        [*command, str(runtime / "bin" / "tokenyard"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv to run as the image user"
)
def test_the_built_wheels_serve_through_the_router_as_the_image_user_without_writing_outside_tmp(installed):
    runtime, image_env = installed
    home = runtime.parent / "tmp"  # the image's writable /tmp
    home.mkdir()
    os.chown(home, IMAGE_USER, IMAGE_USER)
    before = snapshot(runtime)
    engine_port, router_port = free_port(), free_port()
    engine = as_image_user(
        runtime, image_env, home, "sim", "serve", "--port", str(engine_port), "--served-model-name", "m",
        "--time-scale", "0.05",
    )  # fmt: skip
    router = as_image_user(
        runtime, image_env, home, "router", "--backend", f"http://127.0.0.1:{engine_port}", "--served-model",
        "m", "--port", str(router_port), "--grpc-port", "0", "--metrics-port", "0",
    )  # fmt: skip
    try:

        def answered() -> dict | None:
            assert engine.poll() is None and router.poll() is None, "a component exited"
            body = {"model": "m", "prompt": "hello from the image", "max_tokens": 4}
            request = urllib.request.Request(
                f"http://127.0.0.1:{router_port}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return json.loads(response.read())
            except (urllib.error.URLError, ConnectionError):
                return None  # not up yet (or no replica healthy yet: 503)

        answer = wait_for(answered, timeout=60, interval=0.5, what="a completion through the router")
        assert answer["choices"][0]["text"], answer
    finally:
        outputs = []
        for process in (router, engine):
            process.terminate()
            try:
                outputs.append(process.communicate(timeout=15)[0])
            except subprocess.TimeoutExpired:
                process.kill()
                outputs.append(process.communicate()[0])
    assert snapshot(runtime) == before, "something wrote inside the installed venv (read-only in the image)"
    assert all("Traceback" not in out for out in outputs), "\n".join(o[-2000:] for o in outputs)
