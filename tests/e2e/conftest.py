"""The Docker engine of the container tests: one private dockerd for the session, and Docker's build of this
checkout's image, started in the background as soon as podman's image (whose base it loads) is there.

tests/e2e/test_container.py starts that build once its own image is built, when the session will run the Docker
tests of tests/e2e/test_container_engines.py after it on the same worker (tests/conftest.py's LONG_LANE keeps the two
files together under `--dist loadfile`): the build then runs beside test_container.py's tests, which mostly wait on
their containers, instead of holding up the first Docker test (it took 84 s there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.test_container import CA_BUNDLE, Engine, Image, _tail, build_image, podman_engine

ENGINES_FILE = "tests/e2e/test_container_engines.py"


def _start_dockerd(root: Path, driver: str) -> tuple[subprocess.Popen[bytes] | None, Engine, str]:
    """A private dockerd with its state under `root` on storage `driver`; the engine CLI pointed at it. On failure
    (no process) the tail of its log says why."""
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None:
        pytest.fail("docker.io is not installed: tests/run.sh installs it (dockerd and docker)")
    socket = root / "docker.sock"
    logfile = root / f"dockerd-{driver}.log"
    with logfile.open("wb") as log:
        proc = subprocess.Popen(
            [
                *(dockerd, "--iptables=false", "--ip6tables=false", "--bridge=none", f"--storage-driver={driver}"),
                *("--data-root", str(root / "data"), "--exec-root", str(root / "exec")),
                *("--pidfile", str(root / "docker.pid"), "--host", f"unix://{socket}"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    engine = Engine("docker", {**os.environ, "DOCKER_HOST": f"unix://{socket}"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if socket.exists() and engine("info", check=False, timeout=30).returncode == 0:
            return proc, engine, ""
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return None, engine, _tail(logfile.read_text(errors="replace"))


def _stop_dockerd(proc: subprocess.Popen[bytes], root: Path) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # dockerd leaves its network namespace's bind mount (exec/netns/default) behind: unmount, then remove.
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        left = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{root}/")]
    for mount in reversed(left):
        subprocess.run(["umount", mount], capture_output=True, timeout=30)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Engine]:
    """One Docker daemon for the session."""
    if os.geteuid() != 0:
        message = "dockerd needs root (this machine runs the suite as a user); CI runs these as root"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # overlay2 where the data root's file system takes it (ext4 and xfs do): a container's file system is then a
    # layer over the image's, where vfs copies the whole image (690 MB) for each container and each build step.
    failures: list[str] = []
    for driver in ("overlay2", "vfs"):
        root = Path(tempfile.mkdtemp(prefix="jxd", dir="/tmp"))  # short: the socket's path has at most 107 bytes
        proc, engine, log = _start_dockerd(root, driver)
        if proc is not None:
            break
        shutil.rmtree(root, ignore_errors=True)
        failures.append(f"with --storage-driver={driver}:\n{log}")
    else:
        pytest.fail("dockerd did not start\n" + "\n".join(failures))
    if failures:
        print(f"dockerd runs on vfs: {failures[0]}")
    try:
        yield engine
    finally:
        engine.cleanup()
        _stop_dockerd(proc, root)


def _build_on_docker(dockerd: Engine, source: Engine, image: Image, context: Path) -> Image:
    """This checkout's image built by Docker's own builder, on the base podman built `image` with (loaded, not made
    again).

    Docker's classic builder mounts nothing into a build, so where the host trusts a CA of its own (a package
    proxy's) the base gets the host's bundle in a layer of its own for pip in the build; podman mounts it for the
    build only. The tag is the python:*-slim that the Dockerfile's FROM names."""
    started = time.monotonic()
    loaded = image.base
    if not dockerd.image_exists(loaded):
        with subprocess.Popen(
            ["podman", "save", "--format", "docker-archive", image.base], stdout=subprocess.PIPE, env=source.env
        ) as save:
            load = subprocess.run(
                ["docker", "load"], stdin=save.stdout, capture_output=True, text=True, env=dockerd.env
            )
        assert save.returncode == 0 and load.returncode == 0, load.stderr
    python = image.base.rsplit(":", 1)[1].removesuffix("-slim")
    base = f"python:{python}-slim"
    if CA_BUNDLE.is_file():
        shutil.copy(CA_BUNDLE, context / "ca-certificates.crt")
        (context / "Dockerfile").write_text(f"FROM {loaded}\nCOPY ca-certificates.crt {CA_BUNDLE}\n", encoding="utf-8")
        dockerd("build", "-q", "-t", base, str(context), timeout=300)
    elif loaded != base:
        dockerd("tag", loaded, base)
    print(f"base {base} in docker in {time.monotonic() - started:.0f}s")
    return build_image(dockerd, base=(python, base))


@pytest.fixture(scope="session")
def docker_build(dockerd: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Image]]:
    """Docker's build of this checkout's image, running on a thread of its own (its result: the image, or the
    build's failure, raised where the result is read). podman's image comes first: its base is Docker's."""
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (tests/run.sh installs it): Docker's build loads podman's base")
    source = podman_engine(tmp_path_factory.mktemp("podman-for-docker"))
    image = build_image(source)  # built already where test_container.py or the engines' podman tests ran first
    with ThreadPoolExecutor(1, thread_name_prefix="docker-build") as pool:
        yield pool.submit(_build_on_docker, dockerd, source, image, tmp_path_factory.mktemp("docker-base"))
    # Leaving the pool waits for a build still running (a session whose Docker tests never read it).


def start_docker_build(request: pytest.FixtureRequest) -> None:
    """Start docker_build now, as root (dockerd needs it), when this session runs a test of ENGINES_FILE that uses
    Docker, in this process (one file per worker or none: under `--dist loadfile` the LONG_LANE group; other
    xdist modes may put that test on another worker, so nothing starts early there). A dockerd that cannot start
    fails the Docker tests, not the caller."""
    if os.geteuid() != 0 or request.config.getoption("dist", "no") not in ("no", "loadfile"):
        return
    if not any(
        item.nodeid.startswith(ENGINES_FILE)
        and ("dockerd" in getattr(item, "fixturenames", ()) or item.nodeid.endswith("[docker]"))
        for item in request.session.items
    ):
        return
    # pytest keeps the error of a dockerd that cannot start: each Docker test that asks for the build reports it.
    with contextlib.suppress(pytest.fail.Exception, pytest.skip.Exception):
        request.getfixturevalue("docker_build")
