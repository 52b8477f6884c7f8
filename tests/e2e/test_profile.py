"""Sampled traces and traces on demand, end to end: a real sharded training loop (tests/workloads/sharded.py, 8 CPU
devices under Mesh(("data", "model"), (4, 2))) with jaxmon embedded, scraped over HTTP, checked against the loop's
own timing of its steps, the collectives its step has or has not, and jaxlib's own reader of the traces."""

from __future__ import annotations

import io
import shlex
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.helpers import Child, Samples, free_port, wait_for_samples
from tests.tls_helpers import bcrypt_hash

SHARDED = Path(__file__).resolve().parents[1] / "workloads" / "sharded.py"
EVERY = 10
PARTS = ("compute", "collective", "copy", "idle")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    children: list[Child] = []

    def spawn(*args: str) -> tuple[Child, str]:
        port = free_port()
        child = Child(tmp_path, "--port", str(port), *args, script=SHARDED)
        children.append(child)
        return child, f"http://127.0.0.1:{port}"

    yield spawn
    for child in children:
        child.close()


def series(s: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    return {k: v for (n, k), v in s.items() if n == name and labels.items() <= dict(k).items()}


def by(s: Samples, name: str, label: str, **labels: str) -> dict[str, float]:
    """{value of `label`: sample} of one family, for the series that have `labels`."""
    return {dict(k)[label]: v for k, v in series(s, name, **labels).items()}


def taken(n: int) -> Any:
    return lambda s: sum(series(s, "jaxmon_training_profiles_total", result="taken").values()) >= n


def blocks_of(done: list[tuple[int, float]], taken_blocks: int, steps: int = 2) -> float:
    """The loop's own time of the traced steps: for each block n0 (multiples of EVERY), from its step n0 - 1's
    completion to its last step's, as the loop timed them."""
    at = dict(done)
    total = 0.0
    for n0 in range(EVERY, EVERY * (taken_blocks + 1), EVERY):
        total += at[n0 + steps - 1] - at[n0 - 1]
    return total


def test_exposed_collectives_of_an_allreduce_step_and_none_without(start) -> None:  # type: ignore[no-untyped-def]
    """(a) and (d): a step that all-reduces a replicated gradient over `data` spends a large share of its traced
    time in exposed collectives; the same loop without a collective, none. The parts sum to the profiled time, which
    is the loop's own time of the traced steps."""
    for kind in ("allreduce", "local"):
        child, url = start("--kind", kind, "--every", str(EVERY))
        # Blocks 10-11 and 20-21: each sample ends (its trace read) before the next block's starts.
        done = []
        for n, steps in enumerate((12, 10), start=1):
            done += child.send(f"steps {steps}")["done"]
            s = wait_for_samples(url, taken(n), f"sampled trace {n} of the {kind} loop", timeout=60)
        assert by(s, "jaxmon_training_profiles_total", "result") == {"taken": 2, "busy": 0, "failed": 0, "skipped": 0}
        profiled = by(s, "jaxmon_training_profiled_seconds_total", "device", platform="cpu")
        assert sorted(profiled, key=int) == [str(d) for d in range(8)]
        truth = blocks_of(done, 2)
        exposed = by(s, "jaxmon_training_profile_seconds_total", "device", part="collective")
        if kind == "allreduce":
            # XProf's "highly communication-bound": 15 % of the step in exposed collectives, over the job's devices
            # (one device of a loaded machine may compute slower, and wait less for the others).
            assert sum(exposed.values()) / sum(profiled.values()) >= 0.15, (exposed, profiled)
        for device, seconds in profiled.items():
            parts = by(s, "jaxmon_training_profile_seconds_total", "part", device=device)
            assert sorted(parts) == sorted(PARTS)
            assert sum(parts.values()) == pytest.approx(seconds, rel=1e-9)
            # Each block's two ends are completions the waiter books within a thread switch or two of the loop's own
            # reading of them: 12 ms each on a loaded machine (22 ms over two blocks seen beside two CPU burners),
            # far less than a step (about 90 ms), which a wrong window would add or leave out.
            assert seconds == pytest.approx(truth, rel=0.05, abs=0.012 * 2 * 2), (device, seconds, truth)
            collectives = by(s, "jaxmon_training_profile_collective_seconds_total", "op", device=device)
            if kind == "allreduce":
                assert parts["collective"] >= 0.05 * seconds, (device, parts)
                assert set(collectives) == {"all-reduce"} and collectives["all-reduce"] >= parts["collective"]
                assert parts["compute"] > 0
            else:
                assert parts["collective"] == 0.0 and collectives == {}, (device, parts, collectives)
                assert parts["compute"] > 0
        child.close()


def test_samples_move_off_the_steps_of_an_eval_and_a_save(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Sampling every 20 steps, an eval (a 0.6 s `badput("eval")`) after every 10th step and a real Orbax save after
    every 20th, both right before each block: blocks 60, 80 and 100 are dropped at once (counted `skipped`) and
    tried again 4 steps on, off the eval and the save. The samples taken hold the loop's own time of steps 64-65,
    84-85 and 104-105 (an eval's 0.6 s would be in a dropped block's), and their idle share is the same loop's
    without evals or saves (its blocks 20 and 40): the steps they would misread are not in them."""
    child, url = start("--kind", "allreduce", "--every", "20")
    child.send("steps 42")  # 0-41: blocks 20 and 40, no badput
    s0 = wait_for_samples(url, taken(2), "the clean loop's samples", timeout=60)
    ran = child.send(f"cadence 64 10 20 {tmp_path / 'ckpt'} 0.6")  # 42-105
    assert ran["evals"] == list(range(49, 106, 10)) and ran["saves"] == [59, 79, 99]
    s1 = wait_for_samples(url, taken(5), "the samples moved off the evals and saves", timeout=60)
    assert by(s1, "jaxmon_training_profiles_total", "result") == {"taken": 5, "busy": 0, "failed": 0, "skipped": 3}

    def totals(s: Samples, part: str | None) -> float:
        if part is None:
            return sum(series(s, "jaxmon_training_profiled_seconds_total").values())
        return sum(series(s, "jaxmon_training_profile_seconds_total", part=part).values())

    clean = totals(s0, "idle") / totals(s0, None)
    moved = (totals(s1, "idle") - totals(s0, "idle")) / (totals(s1, None) - totals(s0, None))
    # A block with the eval in it reads its 0.6 s idle beside two steps of 0.1 to 0.3 s: 0.8 or more. Clean samples
    # seconds apart read 0.25 to 0.57 beside other loads; the moved ones read up to 0.07 more than the clean.
    assert moved <= clean + 0.2, (moved, clean)
    at = dict(ran["done"])
    truth = sum(at[n0 + 1] - at[n0 - 1] for n0 in (64, 84, 104))
    for device in range(8):
        profiled = by(s1, "jaxmon_training_profiled_seconds_total", "device")[str(device)]
        before = by(s0, "jaxmon_training_profiled_seconds_total", "device")[str(device)]
        # As above: each block's ends within a thread switch or two of the loop's own reading of them.
        assert profiled - before == pytest.approx(truth, rel=0.05, abs=0.012 * 2 * 3), (device, profiled, truth)


def test_a_users_own_trace_gets_every_step_and_jaxmon_counts_busy(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """(c) The user's `with jax.profiler.trace()` starts while jaxmon's sample of block 10 runs (it started at step
    8), and covers block 20 (jaxmon takes none then): the user's profile holds all of its 12 steps, jaxmon's
    samples of both blocks count busy, and it samples again afterwards."""
    import jax

    child, url = start("--kind", "allreduce", "--every", str(EVERY), "--profile-steps", "4")
    child.send("steps 10")  # 0-9: jaxmon's trace for 10-13 runs
    user = tmp_path / "user-trace"
    child.send(f"usertrace {user} 12")  # 10-21
    child.send("steps 15")  # 22-36: block 30 is jaxmon's again
    s = wait_for_samples(url, taken(1), "a sampled trace after the user's", timeout=60)
    assert by(s, "jaxmon_training_profiles_total", "result") == {"taken": 1, "busy": 2, "failed": 0, "skipped": 0}
    (path,) = user.glob("plugins/profile/*/*.xplane.pb")
    runs = set()
    for plane in jax.profiler.ProfileData.from_file(str(path)).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if stats.get("hlo_module") == child.hello["module"]:
                    runs.add(int(stats["run_id"]))
    assert len(runs) == 12


def _modules_in(tar_bytes: bytes, tmp: Path) -> set[str]:
    import jax

    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(tmp, filter="data")
    (xplane,) = [n for n in names if n.endswith(".xplane.pb")]
    assert xplane.startswith("plugins/profile/"), names
    data = jax.profiler.ProfileData.from_file(str(tmp / xplane))
    return {
        str(dict(e.stats)["hlo_module"])
        for p in data.planes
        for line in p.lines
        for e in line.events
        if "hlo_module" in dict(e.stats)
    }


def test_a_trace_on_demand(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """(b) /debug/trace?steps=2 answers a tar XProf opens, holding the loop's module; 401 without credentials, 409
    for a second at once, 400 past the caps."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{bcrypt_hash('pw')}'\n")
    child, url = start("--kind", "allreduce", "--every", "0", "--web-config", str(web))
    auth = ("prom", "pw")
    assert requests.get(url + "/debug/trace?steps=2", timeout=10).status_code == 401
    for bad in ("steps=0", "steps=101", "seconds=61", "steps=2&seconds=1", "steps=two", "", "secs=1"):
        r = requests.get(f"{url}/debug/trace?{bad}", auth=auth, timeout=10)
        assert r.status_code == 400 and "steps=N" in r.text, (bad, r.status_code, r.text)

    got: list[requests.Response] = []

    def first() -> threading.Thread:
        thread = threading.Thread(
            target=lambda: got.append(requests.get(url + "/debug/trace?steps=2", auth=auth, timeout=120))
        )
        thread.start()
        return thread

    request = first()
    # A second at once: 409 while the first waits for its steps (the loop is not stepping yet). Until the first has
    # reached the exporter, a short `seconds` trace is answered 200: ask again. The first, reaching the exporter
    # while one of those runs, is itself answered 409: then it is asked again.
    statuses = []
    for _ in range(100):
        if not request.is_alive() and got and got[-1].status_code == 409:
            got.clear()
            request = first()
            time.sleep(0.2)
        r = requests.get(url + "/debug/trace?seconds=0.05", auth=auth, timeout=60)
        statuses.append(r.status_code)
        if r.status_code == 409 and request.is_alive():
            break
    assert statuses[-1] == 409 and set(statuses) <= {200, 409}, statuses
    child.send("steps 6")
    request.join(120)
    (response,) = got
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert "jaxmon-trace-" in response.headers["content-disposition"]
    assert child.hello["module"] in _modules_in(response.content, tmp_path / "demand")
    # No sampled series with every = 0.
    s = wait_for_samples(url, lambda s: True, client={"auth": auth})
    assert series(s, "jaxmon_training_profiles_total") == {}


def test_no_trace_on_demand_in_the_daemon(start_daemon) -> None:  # type: ignore[no-untyped-def]
    d = start_daemon("--web.enable-profiling")
    r = requests.get(d.url + "/debug/trace?steps=2", timeout=10)
    assert r.status_code == 404 and "daemon or sidecar" in r.text


def test_the_t_key_of_jaxmon_top_saves_a_trace(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`jaxmon top` in tmux against the training process: `t` saves /debug/trace?steps=2 to a timestamped file in
    its working directory, and the screen says where."""
    from tests.e2e.test_top_tmux import Tmux

    child, url = start("--kind", "allreduce", "--every", "0")
    work = tmp_path / "cwd"
    work.mkdir()
    tmux = Tmux()
    try:
        top = f"{shlex.quote(sys.executable)} -m jaxmon top --interval 500ms {url}"
        tmux.start(f"cd {shlex.quote(str(work))} && {top}", 160, 40)
        tmux.wait_screen(lambda s: "t: save a trace" in s, "the live view")
        tmux("send-keys", "-t", "top", "t")
        tmux.wait_screen(lambda s: "trace: recording 2 steps" in s, "the trace under way")
        child.send("steps 6")
        screen = tmux.wait_screen(lambda s: "trace saved:" in s, "the trace saved", timeout=120)
    finally:
        tmux.kill()
    (saved,) = work.glob("jaxmon-trace-127.0.0.1_*-*.tar.gz")
    assert saved.name in screen.replace("\n", "")
    assert child.hello["module"] in _modules_in(saved.read_bytes(), tmp_path / "saved")
