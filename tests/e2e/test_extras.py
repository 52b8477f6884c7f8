"""What a trainer's plain `pip install jaxmon` (no extras) must be enough for, in real processes.

The `serve` and `top` extras bring tpu-info, grpcio, protobuf and rich. Each process here starts with those
modules unimportable (`sys.modules[name] = None`, what Python does for a module that is not installed: an
ImportError at import), then runs as users do: a trainer under jaxmon.start() scraped over HTTP, a trainer under
jaxmon.publish() read by a sidecar, the daemon on this machine's devices, and `jaxmon top`, which says what to
install.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT, StartDaemon, sample
from tests.helpers import Daemon, jaxmon_env, parse_samples

EXTRAS_MODULES = ("tpu_info", "grpc", "google.protobuf", "rich")
BLOCK = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in EXTRAS_MODULES)


def run(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter without the extras' modules."""
    program = BLOCK + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=jaxmon_env({"JAXMON_COLLECTOR__PROBE": "false"}, 8),
    )


def test_a_trainer_without_extras_embeds_jaxmon_and_steps() -> None:
    done = run(
        r"""
        import json, re, time, urllib.request
        import jax, jax.numpy as jnp
        import jaxmon
        exporter = jaxmon.start(0, workload="plain")
        f = jaxmon.track(jax.jit(lambda x: jnp.tanh(x @ x)))
        x = jnp.ones((32, 32))
        for n in range(5):
            x = f(x)
            jaxmon.step(n, x, examples=32, tokens=320)
        x.block_until_ready()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = urllib.request.urlopen(exporter.url + "/metrics", timeout=10).read().decode()
            if re.search(r"^jaxmon_training_steps_total\{[^}]*\} 5\.0$", text, re.M):
                break
            time.sleep(0.2)
        exporter.stop()
        print(json.dumps({"metrics": text, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in
                          ("tpu_info", "grpc", "rich") and sys.modules[m] is not None)}))
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    samples = parse_samples(out["metrics"])
    assert out["loaded"] == []
    labels = {"workload": "plain", "process_index": "0", "process_count": "1"}
    steps = [v for (name, lbls), v in samples.items() if name == "jaxmon_training_steps_total"]
    assert steps == [5.0], steps
    assert any(name == "jaxmon_training_hardware_flops_total" for name, _ in samples)
    assert any(name == "jaxmon_memory_live_array_bytes" for name, _ in samples)
    assert all(dict(lbls).items() >= labels.items() for name, lbls in samples if name.startswith("jaxmon_training_"))


def test_a_publisher_without_extras_reaches_a_sidecar(tmp_path: Path, start_daemon: StartDaemon) -> None:
    spool = tmp_path / "spool"
    done = run(
        """
        import sys, time
        import jax, jax.numpy as jnp
        import jaxmon
        publisher = jaxmon.publish(sys.argv[1], workload="plainpub", interval=0.2)
        x = jnp.ones((8,))
        for n in range(3):
            x = x + 1
            jaxmon.step(n, x)
        x.block_until_ready()
        time.sleep(1.0)
        publisher.stop(remove=False)
        """,
        str(spool),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    d = start_daemon("--no-collector.probe", "--collector.spool.dir", str(spool), "--poll.interval", "0.2s")
    steps = "jaxmon_training_steps_total"
    # Its first exposition holds 0 (a process new to the sidecar: born at zero), the next its 3 steps.
    d.wait_for(lambda s: [v for (n, lbls), v in s.items() if n == steps and ("workload", "plainpub") in lbls] == [3.0])


def test_the_daemon_without_extras_serves_this_machines_devices_and_says_why_tpu_is_off(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK, encoding="utf-8")  # imported at the interpreter's start
    args = ["--no-collector.probe", "--poll.interval", "0.3s", "--collector.tpu.address", "127.0.0.1:1"]
    d = Daemon(tmp_path, args, env={"PYTHONPATH": str(site), "JAXMON_LOG__FORMAT": "json"})
    try:
        d.wait_ready()
        samples = parse_samples(d.get("/metrics").text)
        cpu = {dict(lbls)["device"] for name, lbls in samples if name == "jaxmon_device_info"}
        assert cpu == {str(i) for i in range(8)}
        # The tpu collector was asked for (an address) but cannot run: the log names what is missing.
        assert sample(samples, "jaxmon_collector_success", collector="tpu") is None
        assert "tpu-info is not installed" in d.log()
        assert sample(samples, "jaxmon_collector_success", collector="memory") == 1
    finally:
        d.stop()


def test_jaxmon_top_without_rich_says_what_to_install() -> None:
    done = run("from jaxmon.cli import main\nsys.exit(main(['top', '--once', 'http://127.0.0.1:1']))")
    assert done.returncode == 2
    assert "pip install 'jaxmon[top]'" in done.stderr


def test_the_extras_name_what_they_bring() -> None:
    """The README names each extra and what it is for; the test extra brings the serve extra (the suite needs it)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert set(extras) >= {"serve", "top", "cuda", "tpu", "test"}
    core = " ".join(project["dependencies"])
    for dist in ("tpu-info", "grpcio", "protobuf", "rich"):
        assert dist not in core, f"{dist} is the serve extra's, not a trainer's"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for extra in ("serve", "top", "cuda", "tpu"):
        assert f"`jaxmon[{extra}]`" in readme, f"the README does not name the {extra} extra"
