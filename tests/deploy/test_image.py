"""The Dockerfile, checked by reading (no image is built here) and by running its install
step: the wheel is built from exactly what the Dockerfile COPYs (less .dockerignore),
installed into a fresh venv with its runtime dependencies, and that venv's `kvgate serve`
answers the image's HEALTHCHECK."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import StartEngine
from tests.deploy.support import REPO, dockerignore_patterns, dockerignored
from tests.helpers import eventually, free_port

DOCKERFILE = (REPO / "Dockerfile").read_text()
INSTRUCTION = re.compile(r"^([A-Z]+)\s+(.*?)(?<!\\)$", re.MULTILINE | re.DOTALL)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [
        (match.group(1), match.group(2).strip())
        for match in re.finditer(r"^([A-Z]+)\s+(.*)$", joined, re.MULTILINE)
    ]


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for name, args in instructions():
        if name == "FROM":
            result.append([])
        if result:
            result[-1].append((name, args))
    return result


def build_copy_sources() -> list[str]:
    """Paths the build stage COPYs from the build context."""
    sources: list[str] = []
    for name, args in stages()[0]:
        if name == "COPY" and "--from" not in args:
            *paths, _ = args.split()
            sources.extend(paths)
    return sources


def healthcheck_command() -> list[str]:
    (args,) = [args for name, args in instructions() if name == "HEALTHCHECK"]
    command = args[args.index("CMD") + 3 :].strip()
    parsed: list[str] = json.loads(command)
    return parsed


# -- reading ---------------------------------------------------------------------------------


def test_base_image_is_a_pinned_slim_python() -> None:
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", default)
    requires = re.search(r'requires-python = ">=3\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert requires and int(default.split(".")[1]) >= int(requires.group(1))
    froms = [args for name, args in instructions() if name == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]  # multi-stage, same base


def test_runtime_stage_has_the_venv_only_a_non_root_user_and_the_gateway() -> None:
    runtime = stages()[-1]
    copies = [args for name, args in runtime if name == "COPY"]
    assert copies == ["--from=build /opt/kvgate /opt/kvgate"]  # no sources, no wheels
    (user,) = [args for name, args in runtime if name == "USER"]
    uid, _, gid = user.partition(":")
    assert int(uid) > 0 and int(gid) > 0  # numeric: Kubernetes' runAsNonRoot can check it
    entrypoint = [json.loads(args) for name, args in runtime if name == "ENTRYPOINT"]
    cmd = [json.loads(args) for name, args in runtime if name == "CMD"]
    assert entrypoint == [["kvgate"]] and cmd == [["serve"]]
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"] and "/health" in command[2]
    labels = " ".join(args for name, args in runtime if name == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels


def test_build_context_holds_what_the_build_copies_and_nothing_else() -> None:
    patterns = dockerignore_patterns()
    sources = build_copy_sources()
    include = re.search(r"include = (\[.*?\])", (REPO / "pyproject.toml").read_text())
    assert include is not None
    packages = ast.literal_eval(include.group(1))
    # Every package the wheel includes is copied, with pyproject and the README it names.
    assert {"pyproject.toml", "README.md"} | {p.rstrip("*") for p in packages} == set(sources)
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source, patterns), f"{source} is .dockerignored"
    excluded_paths = ("tests/gateway", ".venv/bin/python", "bench/results/x.json",
                      "bench/.venvs/a", "gateway/__pycache__/app.pyc", "deploy")  # fmt: skip
    for excluded in excluded_paths:
        assert dockerignored(excluded, patterns), excluded


# -- the install step, run ---------------------------------------------------------------------


def _context(destination: Path) -> Path:
    """The build stage's /src: the COPYed paths, less what .dockerignore excludes."""
    patterns = dockerignore_patterns()
    for source in build_copy_sources():
        path = REPO / source
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            if not dockerignored(relative, patterns):
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
    return destination


def _run(command: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=300
    )


def _clean_env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if key != "PYTHONPATH" and not key.startswith(("KVGATE_", "AIBRIX_", "VIRTUAL_ENV"))
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's RUN step: `pip wheel --no-deps`, a fresh venv, `pip install` the
    wheel (dependencies from the package index), in a scratch directory."""
    root = tmp_path_factory.mktemp("image")
    assert "pip wheel --no-deps --wheel-dir /wheels ." in DOCKERFILE
    assert "python -m venv --without-pip /opt/kvgate" in DOCKERFILE
    assert "pip --python /opt/kvgate/bin/python install /wheels/kvgate-*.whl" in DOCKERFILE
    source = _context(root / "src")
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = _run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), "."], cwd=source)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("kvgate-*.whl")
    venv = root / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    created = _run([base_python, "-m", "venv", "--without-pip", str(venv)])
    assert created.returncode == 0, created.stderr
    # --no-compile: the image compiles bytecode at build time; this test only needs to know
    # the wheel and its dependencies install and run.
    target = ["--python", str(venv / "bin" / "python"), "install", "--no-compile"]
    installed = _run([*pip, *target, str(wheel)])
    assert installed.returncode == 0, installed.stderr
    return venv


@pytest.mark.slow
def test_installed_wheel_runs_kvgate(installed: Path, tmp_path: Path) -> None:
    result = _run([str(installed / "bin" / "kvgate"), "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout
    # The package runs from the venv, not from this checkout.
    code = "import gateway; print(gateway.__file__)"
    where = _run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path)
    assert where.stdout.strip().startswith(str(installed)), where.stdout
    # The wheel carries the index's compiled primitives: built where a C compiler is (the
    # image's build stage installs one), imported from the wheel, not from this checkout.
    if shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is not None:
        code = (
            "import indexer, indexer._native as native\n"
            "assert indexer.SyncPrefixHashTable().compiled\n"
            "print(native.__file__)"
        )
        native = _run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path)
        assert native.stdout.strip().startswith(str(installed)), native.stderr


async def _exit_code(*command: str, env: dict[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await asyncio.wait_for(process.wait(), timeout=30)


@pytest.mark.slow
async def test_installed_gateway_answers_the_image_healthcheck(
    installed: Path, start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(name="e0")
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps({"pods": [{"name": "e0", "url": engine.url, "model": "m"}]}))
    port = free_port()
    env = {**_clean_env(), "KVGATE_PORT": str(port), "KVGATE_HOST": "127.0.0.1"}
    # The HEALTHCHECK as the image runs it, with the venv's interpreter as `python`.
    check = [str(installed / "bin" / "python"), *healthcheck_command()[1:]]
    assert await _exit_code(*check, env=env) != 0  # nothing listening yet: unhealthy
    log = tmp_path / "kvgate.log"
    with log.open("wb") as output:
        server = await asyncio.create_subprocess_exec(
            str(installed / "bin" / "kvgate"), "serve", "--pods", str(pods),
            env=env, cwd=tmp_path, stdout=output, stderr=output,
        )  # fmt: skip
        try:

            async def healthy() -> bool:
                assert server.returncode is None, f"kvgate serve exited: {log.read_text()}"
                return await _exit_code(*check, env=env) == 0

            await eventually(healthy, within=60, what="the installed gateway is healthy")
        finally:
            if server.returncode is None:
                server.send_signal(signal.SIGTERM)
            await asyncio.wait_for(server.wait(), timeout=30)
    # SIGTERM (the image's stop signal) is a clean, drained shutdown; uvicorn re-raises the
    # signal once it has shut down, so the exit status is SIGTERM's (143 in a container).
    assert server.returncode in (0, -signal.SIGTERM), log.read_text()
    assert "Application shutdown complete" in log.read_text()
