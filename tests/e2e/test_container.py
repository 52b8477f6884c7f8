"""The image, built and run for real by a container engine: `docker` where a daemon answers, podman otherwise.

The CPU image is built once per module from this checkout (`--format docker`, so it keeps its HEALTHCHECK). Where
Docker Hub cannot be reached and no `python:*-slim` image is at hand, the base image is made locally: Debian
bookworm's Python (3.11) by mmdebstrap, imported as `python:3.11-slim` and kept for later runs. Every port is
published on 127.0.0.1 only; every container and volume has a name unique to the run and is removed afterwards.

tests/run.sh installs podman, runc, mmdebstrap and eatmydata where they are missing. Under CI (CI=true) a missing
engine fails the module instead of skipping it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import ROOT, Samples, free_port, parse_samples

# Building the base and the image takes a few minutes on a fresh machine; these timeouts are for hangs only.
pytestmark = pytest.mark.timeout(900)

IMAGE_USER = 10401
ARBITRARY_UID = 23456
SPOOL = "/run/jaxmon"
UPSTREAM_PYTHON = "3.12"  # the Dockerfile's default PYTHON_VERSION
LOCAL_PYTHON = "3.11"  # Debian bookworm's python3, for the base made by mmdebstrap
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_SOURCES = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
]
RUN_ID = uuid.uuid4().hex[:8]


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Engine:
    """A container engine CLI (docker or podman), with the settings this machine needs passed by environment."""

    name: str
    env: dict[str, str]
    created_containers: list[str] = field(default_factory=list)
    created_volumes: list[str] = field(default_factory=list)

    @property
    def podman(self) -> bool:
        return self.name == "podman"

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.name, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=ROOT,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"`{self.name} {' '.join(args)}` exited {result.returncode}:\n{_tail(result.stdout)}\n"
                f"{_tail(result.stderr)}"
            )
        return result

    def image_exists(self, name: str) -> bool:
        return self("image", "inspect", name, check=False, timeout=60).returncode == 0

    def container(self, role: str) -> str:
        """A container name unique to this run, removed at the end of the module."""
        name = f"jaxmon-test-{RUN_ID}-{role}"
        self.created_containers.append(name)
        return name

    def volume(self, role: str) -> str:
        name = f"jaxmon-test-{RUN_ID}-{role}"
        self.created_volumes.append(name)
        return name

    def logs(self, name: str) -> str:
        result = self("logs", name, check=False, timeout=30)
        return _tail(result.stdout + result.stderr, 60)

    def cleanup(self) -> None:
        for name in self.created_containers:
            self("rm", "-f", name, check=False, timeout=60)
        for name in self.created_volumes:
            self("volume", "rm", "-f", name, check=False, timeout=60)


def _docker_daemon_answers() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _podman_conf(directory: Path) -> Path:
    """Engine settings for podman by environment (CONTAINERS_CONF), leaving /etc/containers alone: the host's hard
    open-files limit and 8192 processes for containers (podman's root defaults exceed what some VMs let a
    container set: on one, nproc 32768 could be set and 48000 could not), and runc where it is installed (crun
    cannot run where cgroup v1 and v2 are both mounted)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    lines = ["[containers]", f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=8192:8192"]']
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    path = directory / "containers.conf"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    env = dict(os.environ)
    if _docker_daemon_answers():
        found = Engine("docker", env)
    elif shutil.which("podman"):
        found = podman_engine(tmp_path_factory.mktemp("podman"))
    else:
        message = "no container engine: no docker daemon answers and podman is not installed (tests/run.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield found
    found.cleanup()


def _local_base(engine: Engine) -> tuple[str, str]:
    """Make `python:3.11-slim` from Debian bookworm's packages (mmdebstrap) and import it: (version, image)."""
    name = f"python:{LOCAL_PYTHON}-slim"
    tag = f"localhost/{name}" if engine.podman else name
    if engine.image_exists(tag):
        return LOCAL_PYTHON, tag
    mmdebstrap = shutil.which("mmdebstrap")
    assert mmdebstrap, "the registry cannot be reached and mmdebstrap is missing (tests/run.sh installs it)"
    hooks = ["--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"]
    if shutil.which("eatmydata"):
        hooks.append("--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata")
    started = time.monotonic()
    with subprocess.Popen(
        [
            mmdebstrap,
            "--quiet",
            "--variant=minbase",
            "--include=python3,python3-venv,python-is-python3,ca-certificates",
            *hooks,
            "bookworm",
            "-",
            *DEBIAN_SOURCES,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as bootstrap:
        assert bootstrap.stdout is not None
        imported = subprocess.run(
            [engine.name, "import", "--change", "ENV LANG=C.UTF-8", "-", tag],
            stdin=bootstrap.stdout,
            capture_output=True,
            text=True,
            timeout=600,
            env=engine.env,
        )
        bootstrap.stdout.close()
        _, err = bootstrap.communicate(timeout=600)
    assert bootstrap.returncode == 0, f"mmdebstrap failed:\n{_tail(err.decode(errors='replace'))}"
    assert imported.returncode == 0, f"import of the base failed:\n{imported.stderr}"
    print(f"base image {tag} made locally in {time.monotonic() - started:.0f}s")
    return LOCAL_PYTHON, tag


def _base_python(engine: Engine) -> tuple[str, str]:
    """The PYTHON_VERSION to build with and its base image: the Dockerfile's default where its base is here or can
    be pulled, else the local Debian base (made once, then reused)."""
    upstream = f"docker.io/library/python:{UPSTREAM_PYTHON}-slim"
    if engine.image_exists(upstream):
        return UPSTREAM_PYTHON, upstream
    local = f"localhost/python:{LOCAL_PYTHON}-slim" if engine.podman else f"python:{LOCAL_PYTHON}-slim"
    if engine.image_exists(local):
        return LOCAL_PYTHON, local
    if engine("pull", "-q", upstream, check=False, timeout=300).returncode == 0:
        return UPSTREAM_PYTHON, upstream
    return _local_base(engine)


@dataclass(frozen=True)
class Image:
    tag: str
    build_seconds: float
    base: str  # the python:*-slim image it was built on: a "training image" without jaxmon


@pytest.fixture(scope="module")
def image(engine: Engine, request: pytest.FixtureRequest) -> Image:
    """The CPU image of this checkout, under a tag of this checkout's own (other checkouts may build theirs). Docker's
    build for tests/e2e/test_container_engines.py starts then, beside this file's tests (tests/e2e/conftest.py)."""
    from tests.e2e.conftest import start_docker_build  # the conftest imports this module

    built = build_image(engine)
    if engine.podman:
        start_docker_build(request)
    return built


def podman_engine(directory: Path) -> Engine:
    """podman with this machine's settings (CONTAINERS_CONF in `directory` unless the environment names one)."""
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        env["CONTAINERS_CONF"] = str(_podman_conf(directory))
    return Engine("podman", env)


_BUILT: dict[tuple[str, str, str], Image] = {}


def build_image(engine: Engine, base: tuple[str, str] | None = None) -> Image:
    """Build this checkout's CPU image with `engine` (cached layers are reused), on `base` (its PYTHON_VERSION and
    image) or the one _base_python finds."""
    tag = f"localhost/jaxmon-test:{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    if not engine.podman:
        tag = tag.removeprefix("localhost/")
    key = (engine.name, engine.env.get("DOCKER_HOST", ""), tag)
    if key in _BUILT:  # this process built it already (test_container_engines.py after this file)
        return _BUILT[key]
    python, base_image = base or _base_python(engine)
    args = ["build", "--build-arg", f"PYTHON_VERSION={python}", "--build-arg", "FLAVOUR=cpu", "-t", tag]
    if engine.podman:
        # Never pull (the base may be the local one); the docker format keeps HEALTHCHECK; pip in the build trusts
        # the host's CA bundle (a package proxy's CA), mounted for the build only.
        args += ["--pull=never", "--format", "docker"]
        if CA_BUNDLE.is_file():
            args += ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    else:
        args += ["--network", "host"]  # pip's downloads: a daemon may have no default bridge (the tests' has none)
    started = time.monotonic()
    engine(*args, str(ROOT), timeout=900)
    seconds = time.monotonic() - started
    print(f"image {tag} built in {seconds:.0f}s")
    _BUILT[key] = Image(tag, seconds, base_image)
    return _BUILT[key]


def _get(port: int, path: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}{path}", timeout=10)


def _wait_ready(engine: Engine, name: str, port: int, timeout: float = 180) -> float:
    """Seconds until /readyz answers 200 on the published loopback port."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if _get(port, "/readyz").status_code == 200:
                return time.monotonic() - started
        except requests.ConnectionError:
            pass
        state = engine("inspect", "--format", "{{.State.Status}}", name, check=False, timeout=30).stdout.strip()
        if state in {"exited", "stopped", "dead"}:
            raise AssertionError(f"{name} exited before it was ready:\n{engine.logs(name)}")
        time.sleep(0.5)
    raise AssertionError(f"{name}: /readyz not 200 within {timeout}s:\n{engine.logs(name)}")


def _scrape(port: int) -> Samples:
    r = _get(port, "/metrics")
    assert r.status_code == 200, r.text
    return parse_samples(r.text)


def _workloads(samples: Samples) -> set[str]:
    return {dict(labels)["workload"] for (name, labels) in samples if name == "jaxmon_workload_info"}


def _wait_workloads(engine: Engine, name: str, port: int, expected: set[str], timeout: float = 120) -> Samples:
    deadline = time.monotonic() + timeout
    samples: Samples = {}
    while time.monotonic() < deadline:
        samples = _scrape(port)
        if expected <= _workloads(samples):
            return samples
        time.sleep(0.5)
    raise AssertionError(
        f"{name} exports workloads {sorted(_workloads(samples))}, not {sorted(expected)}:\n{engine.logs(name)}"
    )


def _health(engine: Engine, name: str) -> str:
    state = json.loads(engine("inspect", "--format", "{{json .State}}", name, timeout=30).stdout)
    # podman 4 names it State.Healthcheck, docker (and podman 5) State.Health.
    health = state.get("Health") or state.get("Healthcheck") or {}
    return str(health.get("Status", ""))


def _published(engine: Engine, name: str) -> list[str]:
    return [line.split("->")[-1].strip() for line in engine("port", name, timeout=30).stdout.splitlines()]


# --------------------------------------------------------------------------------------------------------------
# The image alone
# --------------------------------------------------------------------------------------------------------------


def test_image_runs_as_10401_is_ready_healthy_and_stops_on_sigterm(engine: Engine, image: Image) -> None:
    healthcheck = json.loads(engine("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image.tag).stdout)
    assert healthcheck and healthcheck["Test"][-2:] == ["jaxmon", "healthcheck"], f"HEALTHCHECK: {healthcheck}"
    name = engine.container("serve")
    port = free_port()
    run = ["run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:10401"]
    if not engine.podman:
        run += ["--health-interval", "2s", "--health-start-period", "0s"]  # the image's command, checked sooner
    engine(*run, image.tag)
    assert _published(engine, name) == [f"127.0.0.1:{port}"]
    ready = _wait_ready(engine, name, port)
    print(f"/readyz 200 after {ready:.1f}s")
    samples = _scrape(port)
    assert any(n == "jaxmon_build_info" for n, _ in samples), "no jaxmon_build_info"
    assert samples[("jaxmon_backend_up", frozenset({("backend", "cpu")}))] == 1

    # The daemon (pid 1) runs as uid and gid 10401.
    status = engine("exec", name, "cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M)
    gids = re.search(r"^Gid:\s+(.*)$", status, re.M)
    assert uids and set(uids.group(1).split()) == {str(IMAGE_USER)}, status
    assert gids and set(gids.group(1).split()) == {str(IMAGE_USER)}, status

    # The image's HEALTHCHECK: healthy while polls are fresh, unhealthy when jaxmon stops answering.
    if engine.podman:
        # No systemd timer here: run the check the way the timer would.
        result = engine("healthcheck", "run", name, check=False, timeout=60)
        assert result.returncode == 0, f"healthcheck: {result.stdout}{result.stderr}\n{engine.logs(name)}"
        assert _health(engine, name) == "healthy"
        engine("kill", "--signal", "STOP", name)
        stopped = engine("healthcheck", "run", name, check=False, timeout=60)
        engine("kill", "--signal", "CONT", name)
        assert stopped.returncode != 0, "the healthcheck passed while jaxmon was stopped"
    else:
        deadline = time.monotonic() + 60
        while _health(engine, name) != "healthy" and time.monotonic() < deadline:
            time.sleep(1)
        assert _health(engine, name) == "healthy", engine.logs(name)
    assert _get(port, "/healthz").status_code == 200

    # SIGTERM: exit 0 within 5 s.
    started = time.monotonic()
    engine("kill", "--signal", "TERM", name)
    code = engine("wait", name, timeout=30).stdout.strip().splitlines()[-1]
    elapsed = time.monotonic() - started
    print(f"SIGTERM -> exit {code} in {elapsed:.1f}s")
    assert code == "0", f"exit status {code} after SIGTERM:\n{engine.logs(name)}"
    assert elapsed < 5, f"SIGTERM took {elapsed:.1f}s"


# --------------------------------------------------------------------------------------------------------------
# Publisher + sidecar sharing a named volume
# --------------------------------------------------------------------------------------------------------------

# A trainer that publishes one snapshot and leaves its file (the sidecar keeps it for --collector.spool.ttl): it
# prints the uid of the spool directory's owner, its mode and the file's owner, and exits 3 if nothing could be written.
PUBLISH = """
import glob, os, sys, time
import jaxmon
workload = sys.argv[1]
publisher = jaxmon.publish("/run/jaxmon", workload=workload, interval=0.2)
deadline = time.monotonic() + 60
while not glob.glob(f"/run/jaxmon/{workload}.*.json") and time.monotonic() < deadline:
    time.sleep(0.1)
publisher.stop(remove=False)
files = glob.glob(f"/run/jaxmon/{workload}.*.json")
st = os.stat("/run/jaxmon")
print(os.getuid(), st.st_uid, oct(st.st_mode & 0o7777), *(os.stat(f).st_uid for f in files))
sys.exit(0 if files else 3)
"""


def _publish(engine: Engine, image: Image, volume: str, workload: str, user: str | None) -> list[int]:
    """Run a trainer container (the image, `python -c PUBLISH`) as `user` (None: the image's user)."""
    args = ["run", "--rm", "--entrypoint", "python", "-v", f"{volume}:{SPOOL}"]
    if user is not None:
        args += ["--user", user]
    result = engine(*args, image.tag, "-c", PUBLISH, workload, check=False, timeout=180)
    assert result.returncode == 0, f"trainer {workload} (user {user}) could not publish:\n{_tail(result.stderr)}"
    return [int(x, 8) if x.startswith("0o") else int(x) for x in result.stdout.split()]


def test_trainers_of_any_uid_publish_into_a_fresh_volume_that_a_read_only_sidecar_exports(
    engine: Engine, image: Image
) -> None:
    volume = engine.volume("spool")
    # A root trainer mounts the fresh volume first: the directory must stay writable for everyone after.
    uid, owner, mode, file_owner = _publish(engine, image, volume, "root-trainer", "0:0")
    assert (uid, file_owner) == (0, 0)
    assert mode == 0o1777, f"the spool directory is {oct(mode)} owned by {owner} after a root trainer mounted it"
    # Then a trainer running as the image's user, and one with a uid the image does not know.
    assert _publish(engine, image, volume, "image-user-trainer", None) == [IMAGE_USER, owner, mode, IMAGE_USER]
    arbitrary = f"{ARBITRARY_UID}:{ARBITRARY_UID}"
    assert _publish(engine, image, volume, "arbitrary-uid-trainer", arbitrary) == [
        ARBITRARY_UID,
        owner,
        mode,
        ARBITRARY_UID,
    ]

    # The sidecar: read-only mount, read-only root file system, no capabilities, as in the Kubernetes manifests.
    name = engine.container("sidecar")
    port = free_port()
    engine(
        "run",
        "-d",
        "--name",
        name,
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "-v",
        f"{volume}:{SPOOL}:ro",
        "-p",
        f"127.0.0.1:{port}:10401",
        image.tag,
        "serve",
        "--collector.spool.dir",
        SPOOL,
        "--collector.spool.ttl",
        "1h",
        "--no-collector.probe",
    )
    _wait_ready(engine, name, port)
    expected = {"root-trainer", "image-user-trainer", "arbitrary-uid-trainer"}
    samples = _wait_workloads(engine, name, port, expected)
    rejected = {
        dict(labels)["reason"]: v for (n, labels), v in samples.items() if n == "jaxmon_spool_rejected_files_total"
    }
    assert rejected and not any(rejected.values()), f"spool files rejected: {rejected}"
    # Each workload's devices are exported with its label (8 CPU devices per trainer).
    devices = [dict(labels) for (n, labels) in samples if n == "jaxmon_device_info"]
    for workload in expected:
        assert [d for d in devices if d.get("workload") == workload], f"no devices of {workload}"
    # The sidecar cannot write to the spool.
    write = engine("exec", name, "python", "-c", f"open('{SPOOL}/x.json', 'w')", check=False, timeout=60)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write.stderr


def test_a_volume_the_sidecar_mounts_first_is_writable_by_any_uid_of_another_image(
    engine: Engine, image: Image
) -> None:
    """As docs/deploy.md and the README run it: the sidecar (read-only mount) first, then a training image of the
    user's (here the bare Python base, which has no /run/jaxmon) running as an arbitrary uid."""
    volume = engine.volume("sidecar-first")
    engine("run", "--rm", "-v", f"{volume}:{SPOOL}:ro", image.tag, "--version")
    write = (
        "import os; open('/run/jaxmon/trainer.json', 'w').write('{}'); "
        "st = os.stat('/run/jaxmon'); print(st.st_uid, oct(st.st_mode & 0o7777))"
    )
    arbitrary = f"{ARBITRARY_UID}:{ARBITRARY_UID}"
    result = engine("run", "--rm", "--user", arbitrary, "-v", f"{volume}:{SPOOL}", image.base, "python", "-c", write)
    assert result.stdout.split() == ["0", "0o1777"], result.stdout


# --------------------------------------------------------------------------------------------------------------
# Node mode and the kubelet (deploy/kubernetes/daemonset-node.yaml)
# --------------------------------------------------------------------------------------------------------------


def _kubernetes(samples: Samples) -> tuple[float | None, set[str]]:
    success = samples.get(("jaxmon_collector_success", frozenset({("collector", "kubernetes")})))
    pods = {dict(labels)["pod"] for name, labels in samples if name == "jaxmon_kubernetes_pod_device_info"}
    return success, pods


def _wait_kubernetes(engine: Engine, name: str, port: int, want: tuple[float, set[str]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    got: tuple[float | None, set[str]] = (None, set())
    while time.monotonic() < deadline:
        got = _kubernetes(_scrape(port))
        if got == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"{name}: kubernetes collector at {got}, not {want}:\n{engine.logs(name)}")


def test_node_mode_reads_a_root_only_kubelet_socket_through_a_read_only_directory_mount(
    engine: Engine, image: Image
) -> None:
    """As the DaemonSet runs it: uid 0 with no capabilities, no privilege escalation, a read-only root file system
    (a writable /tmp beside it), the kubelet's directory mounted read-only; the socket root's alone (0700). A
    restarted kubelet's new socket is picked up through the same mount; the image's own uid cannot connect."""
    from tests.fake_kubelet import FakeKubelet, container, pod

    kubelet = FakeKubelet([pod("team-a", "train-0", container("trainer", {"nvidia.com/gpu": ["GPU-1"]}))])
    try:
        directory = kubelet.socket.parent
        directory.chmod(0o700)
        kubelet.start()
        runs = {}
        for role, user in (("node", "0:0"), ("node-unprivileged", f"{IMAGE_USER}:{IMAGE_USER}")):
            name, port = engine.container(role), free_port()
            engine(
                *("run", "-d", "--name", name, "--user", user, "--read-only", "--tmpfs", "/tmp"),
                *("--cap-drop", "ALL", "--security-opt", "no-new-privileges"),
                *("-v", f"{directory}:/var/lib/kubelet/pod-resources:ro", "-p", f"127.0.0.1:{port}:10401"),
                *(image.tag, "serve", "--node", "--collector.kubernetes", "--poll.interval", "0.5s"),
            )
            _wait_ready(engine, name, port)
            runs[role] = (name, port)
        name, port = runs["node"]
        _wait_kubernetes(engine, name, port, (1.0, {"train-0"}))
        # Without uid 0 the socket cannot be opened: the collector fails, the daemon serves on.
        other, other_port = runs["node-unprivileged"]
        _wait_kubernetes(engine, other, other_port, (0.0, set()))
        assert "PERMISSION_DENIED" in engine.logs(other)
        kubelet.stop()
        _wait_kubernetes(engine, name, port, (0.0, set()), timeout=60)  # the socket is gone (ttl 15s)
        kubelet.update(pods=[pod("team-b", "train-1", container("trainer", {"nvidia.com/gpu": ["GPU-2"]}))])
        kubelet.start()
        _wait_kubernetes(engine, name, port, (1.0, {"train-1"}))
    finally:
        kubelet.close()


# --------------------------------------------------------------------------------------------------------------
# The compose demo
# --------------------------------------------------------------------------------------------------------------

COMPOSE = ROOT / "deploy" / "docker-compose.yml"
JAXMON_SERVICES = ["jaxmon", "trainer", "jaxmon-sidecar"]


def _compose_command(engine: Engine) -> list[str]:
    if not engine.podman and engine("compose", "version", check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    found = shutil.which("podman-compose") or shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    assert found, "podman-compose is missing: it is in the [test] extra of pyproject.toml"
    return [found]


def test_compose_demo_jaxmon_services_come_up_on_loopback(engine: Engine, image: Image, tmp_path: Path) -> None:
    """The jaxmon services of the demo, with this run's image: the replay jaxmon serves 8 recorded GPUs, the
    sidecar exports the demo trainer. Prometheus and Grafana come from Docker Hub: tests/unit/test_deploy.py checks
    their part of the file."""
    services = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]
    for service in JAXMON_SERVICES:
        build = services[service]["build"]
        assert (COMPOSE.parent / build["context"]).resolve() / build["dockerfile"] == ROOT / "Dockerfile"
    # The image the compose file would build is the one built above from the same Dockerfile and context.
    override = tmp_path / "image.yml"
    override.write_text(
        yaml.safe_dump({"services": {s: {"image": image.tag} for s in JAXMON_SERVICES}}), encoding="utf-8"
    )
    project = f"jaxmon-test-{RUN_ID}"
    port, sidecar_port = free_port(), free_port()
    env = {**engine.env, "JAXMON_DEMO_PORT": str(port), "JAXMON_DEMO_SIDECAR_PORT": str(sidecar_port)}
    env.pop("JAXMON_DEMO_ADDRESS", None)  # the default: loopback
    compose = [*_compose_command(engine), "-p", project, "-f", str(COMPOSE), "-f", str(override)]

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*compose, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=COMPOSE.parent
        )

    try:
        up = run("up", "-d", "--no-build", *JAXMON_SERVICES)
        assert up.returncode == 0, f"compose up exited {up.returncode}:\n{_tail(up.stdout)}\n{_tail(up.stderr)}"
        names = {
            s: engine(
                "ps",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={project}",
                "--filter",
                f"label=com.docker.compose.service={s}",
                timeout=30,
            ).stdout.split()
            for s in JAXMON_SERVICES
        }
        assert all(len(v) == 1 for v in names.values()), names
        assert _published(engine, names["jaxmon"][0]) == [f"127.0.0.1:{port}"]
        assert _published(engine, names["jaxmon-sidecar"][0]) == [f"127.0.0.1:{sidecar_port}"]
        _wait_ready(engine, names["jaxmon"][0], port)
        replayed = _scrape(port)
        gpus = {dict(labels)["device"] for (n, labels) in replayed if n == "jaxmon_device_info"}
        assert len(gpus) == 8, gpus
        _wait_ready(engine, names["jaxmon-sidecar"][0], sidecar_port)
        sidecar = names["jaxmon-sidecar"][0]
        _wait_workloads(engine, sidecar, sidecar_port, {"demo-trainer"}, timeout=180)
        # The trainer's first step compiles; a later snapshot carries the count.
        deadline = time.monotonic() + 60
        compiled = 0.0
        while compiled < 1 and time.monotonic() < deadline:
            time.sleep(1)
            compiled = max(
                (
                    v
                    for (n, labels), v in _scrape(sidecar_port).items()
                    if n == "jaxmon_jit_compilations_total" and dict(labels).get("workload") == "demo-trainer"
                ),
                default=0.0,
            )
        assert compiled >= 1, f"the demo trainer's compilations are not exported:\n{engine.logs(sidecar)}"
    finally:
        down = run("down", "-v", "-t", "5", timeout=300)
        assert down.returncode == 0, f"compose down:\n{_tail(down.stderr)}"
