"""The image's HEALTHCHECK on both real engines, and the Docker engine itself: Debian's `docker.io` daemon (one per
session, state in a temporary directory, no iptables and no default bridge: this VM has neither) beside podman.

Each engine builds the image itself from this checkout's Dockerfile: podman in tests/e2e/test_container.py's build,
Docker with its own builder (`docker build`, on a thread of its own from as soon as podman's image is there:
tests/e2e/conftest.py, where the session's dockerd is too). What the two share is the base: the python:*-slim podman
has (pulled, or made from Debian's packages where Docker Hub cannot be reached) is loaded into Docker (`podman save
| docker load`) instead of being made a second time. On each engine the HEALTHCHECK turns healthy at its first check
after the start period in six configurations (the default, a listen address moved by flag and by variable, basic
auth, TLS, mTLS) and unhealthy when polls stop; on Docker the README's sidecar commands run as written (without
--gpus) and `docker stop` exits 0 within 5 s, and `docker-compose` brings the compose demo up healthy. dockerd needs
root: elsewhere the Docker tests skip, saying so; as root (CI) a daemon that cannot start fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import free_port
from tests.e2e.conftest import start_docker_build
from tests.e2e.test_container import (
    COMPOSE,
    JAXMON_SERVICES,
    PUBLISH,
    RUN_ID,
    SPOOL,
    Engine,
    Image,
    _health,
    _tail,
    _wait_workloads,
    build_image,
    podman_engine,
)
from tests.tls_helpers import bcrypt_hash, make_certs

pytestmark = pytest.mark.timeout(900)

WEB_DIR = "/etc/jaxmon-web"  # where the tests mount their web configs and certificates, read-only


# --------------------------------------------------------------------------------------------------------------
# The engines
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Image]]:
    if shutil.which("podman") is None:
        message = "podman is not installed (tests/run.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    engine = podman_engine(tmp_path_factory.mktemp("podman"))
    try:
        yield engine, build_image(engine)
    finally:
        engine.cleanup()


@pytest.fixture(scope="module")
def docker(docker_build: Future[Image], podman: tuple[Engine, Image]) -> Image:
    """This checkout's image built by Docker's own builder (tests/e2e/conftest.py's docker_build, started in the
    background as soon as podman's image was there), under podman's tag."""
    built = docker_build.result()
    assert built.tag == podman[1].tag.removeprefix("localhost/")
    return built


@pytest.fixture(params=["podman", "docker"])
def engine_image(request: pytest.FixtureRequest) -> tuple[Engine, Image]:
    if request.param == "podman":
        engine, image = request.getfixturevalue("podman")
        start_docker_build(request)  # Docker builds beside podman's tests (when nothing started it earlier)
        return engine, image
    return request.getfixturevalue("dockerd"), request.getfixturevalue("docker")


# --------------------------------------------------------------------------------------------------------------
# The HEALTHCHECK in six configurations, and on stale data
# --------------------------------------------------------------------------------------------------------------


def _web_dir(directory: Path, kind: str) -> Path:
    """A web config (and its certificates) readable by the image's user, mounted at WEB_DIR."""
    directory.mkdir()
    certs = make_certs(directory)
    tls = {"cert_file": f"{WEB_DIR}/{certs.server_cert.name}", "key_file": f"{WEB_DIR}/{certs.server_key.name}"}
    config: object = {
        "basic": {"basic_auth_users": {"scraper": bcrypt_hash("secret")}},
        "tls": {"tls_server_config": tls},
        "mtls": {
            "tls_server_config": {
                **tls,
                "client_ca_file": f"{WEB_DIR}/{certs.client_ca.name}",
                "client_auth_type": "RequireAndVerifyClientCert",
            }
        },
    }[kind]
    (directory / "web.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    directory.chmod(0o755)
    for f in directory.iterdir():
        f.chmod(0o644)
    return directory


def _run_serving(
    engine: Engine, image: Image, role: str, args: list[str], serve: list[str], network: str, interval: str = "1s"
) -> str:
    """Start `serve` in a container on `network` (host: the host reaches the listener on loopback; none: a network
    namespace of its own). Docker runs the check every `interval` after a 60 s start period and counts one failure
    after it as unhealthy; podman has no timer here (no systemd): the tests run its checks, each one counted.

    Each check is a Python process that loads jaxmon's settings (about 0.7 s of CPU): six containers checked every
    second want more CPU than two cores have, and beside other work a check then outlives the image's 5 s timeout
    (seen at load average 15). The test that runs six containers checks each every 5 s."""
    name = engine.container(role)
    run = ["run", "-d", "--name", name, "--network", network]
    if engine.podman:
        run += ["--health-start-period", "1s", "--health-retries", "1"]  # the test runs each check once it is up
    else:
        # A check may take longer than the image's 5 s timeout here (a Python start beside other work: seen at load
        # average 13-17), which would count as a failure of the daemon; the check's own verdict is what is tested.
        run += ["--health-interval", interval, "--health-timeout", "30s", "--health-start-period", "60s"]
        run += ["--health-retries", "1"]
    engine(*run, *args, image.tag, "serve", "--no-collector.probe", *serve)
    return name


def _health_log(engine: Engine, name: str) -> list[dict[str, object]]:
    state = json.loads(engine("inspect", "--format", "{{json .State}}", name, timeout=30).stdout)
    health = state.get("Health") or state.get("Healthcheck") or {}
    return list(health.get("Log") or [])


def _healthy_at_first_check(engine: Engine, name: str, ready: str | None) -> None:
    """The HEALTHCHECK passes at its first run once the daemon is up: with podman (no systemd timer here) the test
    runs it once `ready` (a command run in the container) passes; Docker's timer runs it, and a failure after the
    start period (retries 1) would make the container unhealthy at once."""
    deadline = time.monotonic() + 120
    if engine.podman:
        assert ready is not None
        while time.monotonic() < deadline:
            if ready == "ready: first poll done":
                if ready in engine.logs(name):
                    break
            elif engine("exec", name, "python", "-c", ready, check=False, timeout=30).returncode == 0:
                break
            time.sleep(0.5)
        result = engine("healthcheck", "run", name, check=False, timeout=60)
        assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{engine.logs(name)}"
        assert _health(engine, name) == "healthy"
        return
    status = ""
    while time.monotonic() < deadline:
        status = _health(engine, name)
        assert status != "unhealthy", engine("inspect", "--format", "{{json .State.Health}}", name).stdout
        if status == "healthy":
            return
        time.sleep(0.5)
    raise AssertionError(f"{name}: {status}:\n{engine.logs(name)}")


def _readyz_inside(url: str, ctx: str = "None", auth: str = "") -> str:
    """A python one-liner run in the container that exits 0 when `url` answers 200."""
    headers = f"{{'Authorization': 'Basic {auth}'}}" if auth else "{}"
    return (
        "import ssl, sys, urllib.request as u; "
        f"sys.exit(0 if u.urlopen(u.Request('{url}', headers={headers}), timeout=5, context={ctx}).status == 200 "
        "else 1)"
    )


HEALTH_CASES = ("default", "flag", "variable", "basic", "tls", "mtls")


def _start_health_case(engine: Engine, image: Image, case: str, tmp_path: Path) -> tuple[str, str, int]:
    """Start the daemon of one configuration: (container, the readiness check run in it, its port on the host)."""
    port = free_port()
    args: list[str] = []
    serve: list[str] = []
    network = "host"
    insecure = "ssl._create_unverified_context()"
    ready = _readyz_inside(f"http://127.0.0.1:{port}/readyz")
    if case == "default":
        ready = _readyz_inside("http://127.0.0.1:10401/readyz")
        network = "none"  # the default address (:10401) in a network namespace of its own: no clash on the host
    elif case == "flag":
        serve = ["--web.listen-address", f"127.0.0.1:{port}"]
    else:
        args = ["-e", f"JAXMON_WEB__LISTEN_ADDRESS=127.0.0.1:{port}"]
    if case in ("basic", "tls", "mtls"):
        web = _web_dir(tmp_path / f"web-{case}", case)
        args += ["-v", f"{web}:{WEB_DIR}:ro", "-e", f"JAXMON_WEB__CONFIG__FILE={WEB_DIR}/web.yml"]
        ready = {
            "basic": _readyz_inside(f"http://127.0.0.1:{port}/readyz", auth="c2NyYXBlcjpzZWNyZXQ="),
            "tls": _readyz_inside(f"https://127.0.0.1:{port}/readyz", ctx=insecure),
            # No client certificate in the container: wait for the daemon's log line instead.
            "mtls": "ready: first poll done",
        }[case]
    return _run_serving(engine, image, f"health-{case}", args, serve, network, interval="5s"), ready, port


def test_the_healthcheck_is_healthy_at_its_first_check_whatever_the_listener(
    engine_image: tuple[Engine, Image], tmp_path: Path
) -> None:
    """The six configurations side by side (each container on its own port): the default, the listen address moved
    by flag and by variable, basic auth, TLS and mTLS, each healthy at its first check; the listener keeps its
    protection (without credentials the host is refused)."""
    engine, image = engine_image
    started = {case: _start_health_case(engine, image, case, tmp_path) for case in HEALTH_CASES}
    for case, (name, ready, port) in started.items():
        _healthy_at_first_check(engine, name, ready)
        if case == "basic":
            assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 401
        elif case in ("tls", "mtls"):
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            if case == "mtls":
                with pytest.raises(requests.ConnectionError):
                    requests.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=10)
    for name, _, _ in started.values():
        engine("rm", "-f", name, timeout=60)


def test_a_daemon_whose_polls_stopped_turns_unhealthy(engine_image: tuple[Engine, Image]) -> None:
    engine, image = engine_image
    port = free_port()
    args = ["-e", "JAXMON_FAULTS_FILE=/tmp/faults.json"]
    serve = ["--web.listen-address", f"127.0.0.1:{port}", "--poll.interval", "0.5s", "--health.max-staleness", "2s"]
    name = _run_serving(engine, image, "stale", args, serve, "host")
    _healthy_at_first_check(engine, name, _readyz_inside(f"http://127.0.0.1:{port}/readyz"))
    engine("exec", name, "python", "-c", "open('/tmp/faults.json', 'w').write('{\"poll_delay_seconds\": 600}')")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if engine.podman:
            # podman 4.3 keeps the status through the image's start period whatever --health-start-period says:
            # the check's own verdict is what it reports.
            if engine("healthcheck", "run", name, check=False, timeout=60).returncode != 0:
                break
        elif _health(engine, name) == "unhealthy":
            break
        time.sleep(1)
    if not engine.podman:
        assert _health(engine, name) == "unhealthy", engine.logs(name)
    log = _health_log(engine, name)
    assert "/healthz 503: unhealthy: last memory update completed" in str(log[-1]["Output"]), log
    assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 503  # the listener agrees
    engine("rm", "-f", name, timeout=60)


# --------------------------------------------------------------------------------------------------------------
# Docker: the README's sidecar, `docker stop`, docker-compose
# --------------------------------------------------------------------------------------------------------------


def test_readme_sidecar_commands_run_on_docker_and_docker_stop_exits_0(dockerd: Engine, docker: Image) -> None:
    """The README's commands as written, --gpus dropped, unique names, a loopback port; the trainer is the image
    running a publisher. This Docker has no default bridge: both join a network of their own."""
    volume = dockerd.volume("readme-spool")
    network = f"jaxmon-test-{RUN_ID}-net"
    dockerd("network", "create", network)
    try:
        dockerd("volume", "create", volume)
        port = free_port()
        sidecar = dockerd.container("readme-sidecar")
        dockerd(
            *("run", "-d", "--name", sidecar, "--network", network, "-p", f"127.0.0.1:{port}:10401"),
            *("-v", f"{volume}:/run/jaxmon", docker.tag, "serve", "--collector.spool.dir", "/run/jaxmon"),
        )
        trainer = dockerd.container("readme-trainer")
        dockerd(
            *("run", "-d", "--name", trainer, "--network", network, "-v", f"{volume}:/run/jaxmon"),
            *("--entrypoint", "python", docker.tag, "-c", PUBLISH, "readme-trainer"),
        )
        assert dockerd("wait", trainer, timeout=180).stdout.strip() == "0", dockerd.logs(trainer)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        _wait_workloads(dockerd, sidecar, port, {"readme-trainer"})
        started = time.monotonic()
        stop = dockerd("stop", sidecar, check=False, timeout=60)
        elapsed = time.monotonic() - started
        code = dockerd("inspect", "--format", "{{.State.ExitCode}}", sidecar).stdout.strip()
        print(f"docker stop: exit {code} in {elapsed:.1f}s")
        assert stop.returncode == 0 and code == "0", dockerd.logs(sidecar)
        assert elapsed < 5, f"docker stop took {elapsed:.1f}s"
    finally:
        dockerd("rm", "-f", *dockerd.created_containers, check=False, timeout=60)
        dockerd("network", "rm", network, check=False, timeout=60)


def test_compose_demo_comes_up_healthy_with_docker_compose(dockerd: Engine, docker: Image, tmp_path: Path) -> None:
    """deploy/docker-compose.yml by Docker's own docker-compose: the jaxmon services with this run's image, each
    healthy (the trainer has no check). Prometheus and Grafana come from Docker Hub, which cannot be reached here:
    tests/unit/test_deploy.py checks their part of the file."""
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose is missing (tests/run.sh installs Debian's)"
    override = tmp_path / "image.yml"
    # This run's image; the image's own check every 2 s instead of every 30 s (its test inherited), so the services
    # turn healthy in seconds rather than at the first 30 s tick.
    services: dict[str, dict[str, object]] = {s: {"image": docker.tag} for s in JAXMON_SERVICES}
    for checked in ("jaxmon", "jaxmon-sidecar"):  # the trainer's check is disabled in the file
        services[checked]["healthcheck"] = {"interval": "2s"}
    override.write_text(yaml.safe_dump({"services": services}), encoding="utf-8")
    project = f"jaxmon-test-{RUN_ID}-dc"
    env = {
        **dockerd.env,
        "JAXMON_DEMO_PORT": str(free_port()),
        "JAXMON_DEMO_SIDECAR_PORT": str(free_port()),
    }
    env.pop("JAXMON_DEMO_ADDRESS", None)
    command = [compose, "-p", project, "-f", str(COMPOSE), "-f", str(override)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=300, env=env, cwd=COMPOSE.parent
        )

    try:
        up = run("up", "-d", "--no-build", *JAXMON_SERVICES)
        assert up.returncode == 0, f"docker-compose up:\n{_tail(up.stdout)}\n{_tail(up.stderr)}"
        ids = {
            s: dockerd(
                *("ps", "-q", "--filter", f"label=com.docker.compose.project={project}"),
                *("--filter", f"label=com.docker.compose.service={s}"),
            ).stdout.split()
            for s in JAXMON_SERVICES
        }
        assert all(len(v) == 1 for v in ids.values()), ids
        deadline = time.monotonic() + 240
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            health = {s: _health(dockerd, ids[s][0]) for s in ("jaxmon", "jaxmon-sidecar")}
            if set(health.values()) == {"healthy"}:
                break
            time.sleep(2)
        assert set(health.values()) == {"healthy"}, (health, {s: dockerd.logs(i[0]) for s, i in ids.items()})
        sidecar_port = int(env["JAXMON_DEMO_SIDECAR_PORT"])
        _wait_workloads(dockerd, ids["jaxmon-sidecar"][0], sidecar_port, {"demo-trainer"}, timeout=180)
        assert _health(dockerd, ids["trainer"][0]) == ""  # no check: `healthcheck: disable`
        assert dockerd("inspect", "--format", "{{.State.Running}}", ids["trainer"][0]).stdout.strip() == "true"
        assert SPOOL in " ".join(json.loads(dockerd("inspect", ids["trainer"][0]).stdout)[0]["Config"]["Entrypoint"])
    finally:
        down = run("down", "-v", "-t", "5")
        assert down.returncode == 0, f"docker-compose down:\n{_tail(down.stderr)}"
