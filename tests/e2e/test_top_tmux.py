"""`jaxmon top` used as a person would: in tmux against a replay daemon, the screen read with capture-pane."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT, StartDaemon, free_port
from tests.fakenvml import Scenario, device

REPLAY = ("--replay", str(FIXTURES / "shapes.json"), "--poll.interval", "1s", "--devices.include-cpu")
DEVICE = re.compile(r"\b(?:gpu|tpu|cpu):\d+\b")


class Tmux:
    """A private tmux server (its own socket) holding one session, `top`, of a known size."""

    def __init__(self) -> None:
        path = shutil.which("tmux")
        if path is None:
            raise AssertionError("tmux not found: install the Debian package 'tmux' (tests/run.sh does)")
        self._base = [path, "-L", f"jaxmon-top-{uuid.uuid4().hex[:12]}", "-f", "/dev/null"]

    def __call__(self, *args: str) -> str:
        done = subprocess.run([*self._base, *args], capture_output=True, text=True, timeout=10, check=True)
        return done.stdout

    def start(self, command: str, width: int, height: int) -> None:
        # The pane's shell reports how top ended and whether the terminal is back in canonical mode with echo.
        flags = 'stty -a | tr " " "\\n" | grep -x -e icanon -e echo; echo "stty done"'
        script = f'{command}; echo "top exited rc=$?"; {flags}; sleep 600'
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        subprocess.run(
            [
                *self._base,
                "new-session",
                "-d",
                "-s",
                "top",
                "-x",
                str(width),
                "-y",
                str(height),
                "-c",
                str(ROOT),
                script,
            ],
            env=env,
            timeout=10,
            check=True,
        )

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_screen(self, predicate: Callable[[str], bool], what: str, timeout: float = 30.0) -> str:
        """Read the screen until `predicate` holds on it."""
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{what} not seen within {timeout}s; screen:\n{screen}")

    def top_pid(self) -> int:
        """The pid of `jaxmon top`: the child of the pane's shell."""
        shell = int(self("display-message", "-p", "-t", "top", "#{pane_pid}").strip())
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def kill(self) -> None:
        subprocess.run([*self._base, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux()
    yield t
    t.kill()


def _devices(screen: str) -> list[str]:
    """Device names in screen order, one per table row."""
    return [m.group(0) for line in screen.splitlines() if (m := DEVICE.search(line))]


def _row(screen: str, device: str) -> str:
    return next((line for line in screen.splitlines() if f" {device} " in f" {line} "), "")


def _top(url: str) -> str:
    return f"{shlex.quote(sys.executable)} -m jaxmon top --interval 300ms --timeout 500ms {url}"


def _serve_on(port: int, log: Path) -> subprocess.Popen[bytes]:
    """A replay daemon on a given port (the restarted endpoint must come back where it was)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "jaxmon", "serve", "--web.listen-address", f"127.0.0.1:{port}", *REPLAY],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


def test_top_in_a_terminal_sorts_on_s_survives_resize_and_a_dead_endpoint_and_quits_on_q(
    start_daemon: StartDaemon, tmux: Tmux, tmp_path: Path
) -> None:
    d = start_daemon(*REPLAY)
    silent = socket.socket()  # accepts connections, never answers: a hung daemon beside the good one
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    hung = f"127.0.0.1:{silent.getsockname()[1]}"
    tmux.start(_top(f"{hung} 127.0.0.1:{d.port}"), width=130, height=40)
    screen = tmux.wait_screen(lambda s: "20.0GiB/60.0GiB" in _row(s, "gpu:0"), "gpu:0's memory")
    assert "sort: device" in screen
    assert f"127.0.0.1:{d.port}  healthy" in screen
    screen = tmux.wait_screen(lambda s: f"{hung}  DOWN: timed out" in s, "the hung endpoint timing out")
    assert "20.0GiB/60.0GiB" in _row(screen, "gpu:0")  # the good endpoint's rows stay while the other hangs
    assert _devices(screen) == ["gpu:0", "gpu:1", "gpu:2", "tpu:3", "gpu:4", "cpu:5", "gpu:6", "gpu:7", "gpu:8"]
    assert "ALLOCATABLE" in screen

    # Narrower: the table is laid out again to fit, dropping the least needed columns, the rows intact.
    tmux("resize-window", "-t", "top", "-x", "90", "-y", "30")
    screen = tmux.wait_screen(
        lambda s: "ALLOCATABLE" not in s and "20.0GiB/60.0GiB" in _row(s, "gpu:0"), "the table refitted to 90 columns"
    )
    assert max(len(line) for line in screen.splitlines()) <= 90
    assert len(_devices(screen)) == 9

    # s: sort by memory in use / limit, fullest first (gpu:8's share cycles, so only the fixed devices are checked).
    tmux("send-keys", "-t", "top", "s")
    screen = tmux.wait_screen(lambda s: "sort: memory" in s, "the memory sort")
    order = [dev for dev in _devices(screen) if dev in ("gpu:7", "gpu:0", "tpu:3", "gpu:2", "gpu:1")]
    assert order == ["gpu:7", "gpu:0", "tpu:3", "gpu:2", "gpu:1"]  # 100 %, 33 %, 25 %, 17 %, 2.5 % of the limit

    # The endpoint goes away: every row says so and the header says why; it comes back on the same port.
    d.stop(signal.SIGKILL)
    screen = tmux.wait_screen(lambda s: s.count("unreachable") == 10, "rows marked unreachable (9 + the hung one)")
    assert f"127.0.0.1:{d.port}  DOWN: connection refused" in screen
    revived = _serve_on(d.port, tmp_path / "revived.log")
    try:
        tmux.wait_screen(
            lambda s: s.count("unreachable") == 1 and "20.0GiB/60.0GiB" in _row(s, "gpu:0"), "the endpoint back", 60
        )
    finally:
        revived.kill()
        revived.wait()

    tmux("send-keys", "-t", "top", "q")
    screen = tmux.wait_screen(lambda s: "stty done" in s, "top's exit")
    assert "top exited rc=0" in screen
    assert re.search(r"^icanon$", screen, re.M) and re.search(r"^echo$", screen, re.M), screen
    silent.close()


def test_top_restores_the_terminal_when_terminated(tmux: Tmux) -> None:
    port = free_port()  # nothing listens there: the endpoint is down from the start
    tmux.start(_top(f"127.0.0.1:{port}"), width=100, height=20)
    tmux.wait_screen(lambda s: f"127.0.0.1:{port}  DOWN: connection refused" in s, "the down endpoint")
    os.kill(tmux.top_pid(), signal.SIGTERM)
    screen = tmux.wait_screen(lambda s: "stty done" in s, "top's exit")
    assert "top exited rc=0" in screen
    assert re.search(r"^icanon$", screen, re.M) and re.search(r"^echo$", screen, re.M), screen


def test_the_live_process_table_fills_the_screen_below_the_devices_and_counts_the_rest(
    start_daemon: StartDaemon, tmux: Tmux, tmp_path: Path
) -> None:
    # Forty processes over two GPUs, process k holding k + 1 GiB: far more than a 30-line screen holds.
    procs = [[{"pid": 3000 + k, "used": (k + 1) << 30} for k in range(40) if k % 2 == gpu] for gpu in (0, 1)]
    scenario = Scenario(tmp_path / "scenario.json", [device(0, processes=procs[0]), device(1, processes=procs[1])])
    # All forty exported (the daemon's default is the 16 largest per GPU, the rest counted apart).
    args = ["--no-collector.probe", "--poll.interval", "0.3s", "--collector.nvml"]
    args += ["--collector.nvml.max-processes", "40"]
    d = start_daemon(*args, env=scenario.env())
    tmux.start(_top(f"127.0.0.1:{d.port}"), width=120, height=30)

    def processes(screen: str) -> tuple[list[str], str]:
        """The pids shown, in screen order, and the screen's last line."""
        pids = [m.group(1) for line in screen.splitlines() if (m := re.search(r" gpu:[01] +(30\d\d) ", line))]
        return pids, screen.rstrip("\n").splitlines()[-1].strip()

    screen = tmux.wait_screen(lambda s: "more processes not shown" in s, "the process table")
    pids, last = processes(screen)
    assert len(screen.splitlines()) == 30
    assert pids == [str(3000 + k) for k in range(39, 39 - len(pids), -1)]  # the largest, in order
    assert last == f"{40 - len(pids)} more processes not shown"  # on the screen's last line
    assert len(pids) >= 5

    # Ten lines taller: ten more processes.
    tmux("resize-window", "-t", "top", "-x", "120", "-y", "40")
    screen = tmux.wait_screen(lambda s: len(processes(s)[0]) == len(pids) + 10, "ten more processes on a taller screen")
    assert processes(screen)[1] == f"{30 - len(pids)} more processes not shown"
    tmux("send-keys", "-t", "top", "q")
    assert "top exited rc=0" in tmux.wait_screen(lambda s: "stty done" in s, "top's exit")
