"""jaxmon's node mode beside nvitop-exporter on the same fake NVML with 8 GPUs, in one run (issue 22): RSS, PSS, CPU,
threads and series of each.

    python3 -m venv /tmp/nvx && /tmp/nvx/bin/pip install nvitop-exporter          # once; this script installs nothing
    .venv/bin/python bench/node_weight.py --nvitop /tmp/nvx/bin/nvitop-exporter     # about 10 minutes; needs gcc
    .venv/bin/python bench/node_weight.py --nvitop ... --kubernetes                  # and node mode with the kubelet
    .venv/bin/python bench/node_weight.py --nvitop ... --breakdown                   # only: what each side imports

nvitop-exporter (PyPI `nvitop-exporter`, the exporter users compare jaxmon's node mode with) goes in a virtual
environment of its own, whose `nvitop-exporter` script `--nvitop` names. Both read the fake libnvidia-ml.so.1 of
the tests (tests/fakenvml, built here with gcc; the built directory is removed when this script exits, so it stays
alive while they run), loaded through LD_LIBRARY_PATH by their unmodified nvidia-ml-py, from one scenario of 8
plausible H200s, each with one compute process (a `sleep` child of this script, so nvitop's per-process host
readings find a real process). Each side runs at its defaults as a real process on loopback:

- `jaxmon serve --node`: no collector that needs JAX (JAX is never imported); the nvml collector polls every GPU
  every `--poll.interval` (5 s), about 116 NVML calls per GPU (memory, utilization, encoder/decoder, power and
  limits, energy, temperature, clocks and maxima, throttle reasons, ECC and row remapping, PCIe, NVLink state and
  errors per link, MIG, processes), and a thread waits for Xid events; it serves the latest snapshot.
- `nvitop-exporter`: every `--interval` (1 s, its --help) it reads the host through psutil (CPU, memory, swap,
  load, network and disk counters, every partition's usage) and per GPU utilization, memory, encoder/decoder,
  clocks, power and limit, temperature, fan, PCIe throughput, NVLink throughput per link, and its processes with
  their host readings; prometheus_client renders its registry at each scrape.

With `--kubernetes` a third process runs beside them: node mode with `--collector.kubernetes` on a fake kubelet
(tests/fake_kubelet.py, a gRPC pod-resources server on a unix socket) where 8 pods hold one GPU each, so gRPC,
protobuf and the generated stubs are loaded; its extra RSS over plain node mode is reported on its own.
`--apiserver` adds the API server to that side (issue 35): the fake API server of the tests (tests/fake_apiserver.py,
HTTPS with a test CA and a token) lists the node's ResourceSlice of the 8 GPUs and the 8 pods, `NODE_NAME` and the
service account are set as the DaemonSet sets them, and each GPU's `sleep` process is moved into a cgroup shaped
like its pod's container (tests/cgroup_tree.py, where the machine lets this script make cgroups; else they stay
where they are, said on the console), so each poll also reads the processes' cgroups and names them by the pods.

One scraper scrapes every side at the same rate (gzip, one keep-alive connection per side, as Prometheus does):
every 15 s, then every 1 s. After a settle, windows of `--window` seconds (60) run with every side at once;
CPU is utime + stime from /proc/PID/stat over each window (% of one core); at the end of each window VmRSS, VmHWM
(/proc/PID/status), Pss (/proc/PID/smaps_rollup) and the thread count are read. `--rounds` windows per scrape rate
(4), the order of the scrapes within a round alternating (jaxmon first, then nvitop-exporter first, ...); the
figures are medians over the rounds. The series each exports are counted in one plain scrape at the end.

`--tree DIR` runs the jaxmon sides from another checkout's package (`git archive REV jaxmon | tar -x -C DIR`;
first on their PYTHONPATH) for a before/after figure, written under `--name`.

`--series` only counts the series (no windows, no nvitop-exporter unless `--nvitop` is given): node mode at its
defaults and with `--collector.nvml.nvlink-links`, on the same scenario, one plain scrape each once every GPU is
served (issue 26: the default at or under nvitop-exporter's). Writes bench/results/NAME.json (node_series).

`--breakdown` instead imports, in a fresh interpreter per side, what each daemon imports, in layers, and prints
the RSS each layer adds (what each MiB is); nothing is served.

Goal (issue 22): jaxmon's RSS <= 1.5 x nvitop-exporter's and its CPU <= nvitop-exporter's at each scrape rate.
Writes bench/results/node_weight.json (node_weight_breakdown.json with --breakdown).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import Child, cpu_seconds, free_port, median, parse_samples, proc_status, save, sched_seconds

from tests.cgroup_tree import Cgroups, hierarchy, usable
from tests.fake_apiserver import FakeApiServer, nvidia_slice, pod_item
from tests.fake_kubelet import FakeKubelet, container, pod
from tests.fakenvml import Scenario, build, device
from tests.helpers import wait_until

GPUS = 8
GIB = 1 << 30
MiB = 2**20
RATES = {"every_15s": 15.0, "every_1s": 1.0}  # scrape periods


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss in smaps_rollup")


class Side:
    """One exporter as a child process, scraped on one keep-alive connection."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int) -> None:
        self.name, self.port = name, port
        self.child = Child(argv, env, name=f"node-weight-{name}")
        self.conn: http.client.HTTPConnection | None = None
        self.scrapes = 0

    def get(self, gzip: bool = True) -> bytes:
        """One GET /metrics on the kept-alive connection. A connection the server closed while idle (jaxmon's
        keep-alive timeout is shorter than 15 s) is dialled again and the request sent once more, as Prometheus's
        HTTP client does."""
        for attempt in (1, 2):
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                self.conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzip else {})
                resp = self.conn.getresponse()
                body = resp.read()
                break
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if not reused or attempt == 2:
                    raise
        if resp.status != 200:
            raise RuntimeError(f"{self.name}: /metrics {resp.status}")
        self.scrapes += 1
        return body

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return parse_samples(self.get(gzip=False).decode())

    def memory(self) -> dict[str, int]:
        st = proc_status(self.child.pid)
        return {
            "rss": st["VmRSS"],
            "hwm": st["VmHWM"],
            "pss": pss_bytes(self.child.pid),
            "rss_anon": st["RssAnon"],
            "rss_file": st["RssFile"],
            "threads": st["Threads"],
        }


def gpus_seen(side: Side) -> dict[str, float]:
    """{GPU index: memory used in bytes} as the side exports it (each names GPUs and memory its own way)."""
    out: dict[str, float] = {}
    for (name, labels), value in side.samples().items():
        lab = dict(labels)
        if name == "jaxmon_device_memory_used_bytes" and lab.get("platform") == "gpu":
            out[lab["device"]] = value
        elif name == "gpu_memory_used_MiB":
            out[lab["index"]] = value * MiB
    return out


def series(side: Side) -> dict[str, int]:
    """The samples of one plain scrape: in all, and those of a GPU (nvitop: a `uuid` label; jaxmon: platform gpu)."""
    s = side.samples()
    gpu = [k for k in s if ("uuid" in dict(k[1])) or dict(k[1]).get("platform") == "gpu"]
    prefixes: dict[str, int] = {}
    for name, _ in s:
        prefix = name.removeprefix("jaxmon_").split("_")[0]
        prefixes[prefix] = prefixes.get(prefix, 0) + 1
    return {"total": len(s), "gpu": len(gpu), "other": len(s) - len(gpu), "by_prefix": prefixes}


def window(sides: list[Side], seconds: float, period: float, reverse: bool) -> dict[str, dict[str, Any]]:
    """One window over every side at once, one scraper scraping each every `period` seconds."""
    stop = threading.Event()
    order = list(reversed(sides)) if reverse else list(sides)
    failures = dict.fromkeys((s.name for s in sides), 0)

    def scraper() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            for side in order:
                try:
                    side.get()
                except (OSError, RuntimeError, http.client.HTTPException):
                    failures[side.name] += 1
            next_at += period
            stop.wait(max(next_at - time.monotonic(), 0.0))

    counts0 = {s.name: s.scrapes for s in sides}
    cpu0 = {s.name: (cpu_seconds(s.child.pid), sched_seconds(s.child.pid)) for s in sides}
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    time.sleep(seconds)
    cpu1 = {s.name: (cpu_seconds(s.child.pid), sched_seconds(s.child.pid)) for s in sides}
    wall = time.monotonic() - t0
    stop.set()
    thread.join(15)
    out: dict[str, dict[str, Any]] = {}
    for s in sides:
        out[s.name] = {
            "wall_s": wall,
            "cpu_s": cpu1[s.name][0] - cpu0[s.name][0],
            "cpu_percent": 100 * (cpu1[s.name][0] - cpu0[s.name][0]) / wall,
            # The live threads' time in nanoseconds (schedstat): finer than the 10 ms ticks of /proc/PID/stat.
            "schedstat_cpu_percent": 100 * (cpu1[s.name][1] - cpu0[s.name][1]) / wall,
            "scrapes": s.scrapes - counts0[s.name],
            "failed_scrapes": failures[s.name],
            "load_1m_start": load0,
            **s.memory(),
        }
    return out


# What each daemon imports, in layers: each line is imported after the ones above it, and the RSS it adds is
# printed. The layers follow the daemons' own imports (python -X importtime), the dependencies first.
JAXMON_LAYERS = [
    ("ssl (asyncio and prometheus_client import it)", "import ssl"),
    ("asyncio (hypercorn, pydantic-settings)", "import asyncio"),
    ("rich, pygments, attrs (structlog.dev imports rich when installed)", "import rich.console, rich.traceback"),
    ("structlog", "import structlog"),
    ("pydantic, pydantic-core", "import pydantic, pydantic.main"),
    ("pydantic-settings", "import pydantic_settings"),
    ("prometheus_client", "import prometheus_client"),
    ("hypercorn (asyncio server, h11, h2, wsproto)", "import hypercorn.asyncio, hypercorn.config"),
    ("apscheduler", "import apscheduler.schedulers.background, apscheduler.executors.pool"),
    ("pynvml (nvidia-ml-py)", "import pynvml"),
    ("jaxmon: settings", "import jaxmon.settings"),
    ("jaxmon: sources, collectors.base, runtime, app", "import jaxmon.compose"),
    ("jaxmon: the nvml collector and its source", "import jaxmon.collectors.nvml"),
    (
        "jaxmon: the other collectors (options for the settings)",
        "import jaxmon.collectors; jaxmon.collectors.registry()",
    ),
    ("jaxmon: web server, cli", "import jaxmon.web.server, jaxmon.cli"),
]
NVITOP_LAYERS = [
    ("ssl (prometheus_client imports it)", "import ssl"),
    ("prometheus_client", "import prometheus_client"),
    ("psutil", "import psutil"),
    ("pynvml (nvidia-ml-py)", "import pynvml"),
    ("nvitop", "import nvitop"),
    ("nvitop_exporter", "import nvitop_exporter.cli"),
]
LAYER_CHILD = """
import gc, json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
out = [["python (interpreter, site)", rss()]]
for what, code in json.loads(sys.argv[1]):
    exec(code)
    gc.collect()
    out.append([what, rss()])
print(json.dumps(out))
"""


def breakdown(nvitop_python: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, python, layers in (
        ("jaxmon", Path(sys.executable), JAXMON_LAYERS),
        ("nvitop_exporter", nvitop_python, NVITOP_LAYERS),
    ):
        cmd = [str(python), "-c", LAYER_CHILD, json.dumps(layers)]
        marks = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/").stdout)
        rows, previous = [], 0
        for what, rss in marks:
            rows.append({"layer": what, "adds_mib": round((rss - previous) / MiB, 2), "rss_mib": round(rss / MiB, 2)})
            previous = rss
        result[name] = rows
        print(f"== {name}")
        for row in rows:
            print(f"  +{row['adds_mib']:5.2f} MiB -> {row['rss_mib']:5.1f} MiB  {row['layer']}")
    return result


def count_series(args: argparse.Namespace) -> None:
    """--series: the series of node mode at its defaults and per link (and nvitop-exporter's, with --nvitop), each
    counted in one plain scrape once it serves the 8 GPUs."""
    build()
    sleepers = [subprocess.Popen(["sleep", "infinity"]) for _ in range(GPUS)]
    tmp = Path(tempfile.mkdtemp(prefix="node-series-"))
    devices = [device(i, processes=[{"pid": p.pid, "used": (1 + i) * GIB}]) for i, p in enumerate(sleepers)]
    scenario = Scenario(tmp / "nvml.json", devices)
    env = {**os.environ, **scenario.env(), "PYTHONUNBUFFERED": "1"}
    jaxmon_env = dict(env)
    if args.tree is not None:
        jaxmon_env["PYTHONPATH"] = str(args.tree.resolve())
    jaxmon_exe = str(Path(sys.executable).with_name("jaxmon"))
    wanted: dict[str, list[str]] = {"jaxmon": [], "jaxmon_nvlink_links": ["--collector.nvml.nvlink-links"]}
    counts: dict[str, dict[str, Any]] = {}
    expected = {str(i): float((10 + i) * GIB) for i in range(GPUS)}
    try:
        for name, flags in wanted.items():
            port = free_port()
            argv = [jaxmon_exe, "serve", "--node", "--web.listen-address", f"127.0.0.1:{port}", *flags]
            sides = [Side(name, argv, jaxmon_env, port)]
            if name == "jaxmon" and args.nvitop is not None:
                port = free_port()
                argv = [str(args.nvitop.resolve()), "--bind-address", "127.0.0.1", "--port", str(port)]
                sides.append(Side("nvitop_exporter", [*argv, "--hostname", "bench"], env, port))
            try:
                for side in sides:
                    wait_until(functools.partial(_serves, side, expected), 60, f"{side.name} serving the 8 GPUs")
                    counts[side.name] = series(side)
            finally:
                for side in sides:
                    side.child.stop()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    for name, c in counts.items():
        print(f"{name}: {c['total']} series ({c['gpu']} of GPUs); by prefix {json.dumps(c['by_prefix'])}")
    save(
        args.name if args.name != "node_weight" else "node_series",
        {"command": " ".join(["python", "bench/node_weight.py", *sys.argv[1:]]), "gpus": GPUS, "series": counts},
    )


def _serves(side: Side, expected: dict[str, float]) -> bool:
    if not side.child.alive():
        raise RuntimeError(f"{side.name} exited:\n{side.child.log()[-3000:]}")
    try:
        return gpus_seen(side) == expected
    except (OSError, RuntimeError, http.client.HTTPException):
        return False


NODE = "node-a"


def api_server(uuids: list[str], pids: list[int]) -> tuple[FakeApiServer, Cgroups | None]:
    """The fake API server listing the node's slice of the GPUs and pod train-i (its trainer container) for each,
    started; and the GPUs' processes moved into those containers' cgroups where this machine allows (else None)."""
    uid = [f"00000000-0000-4000-8000-{i:012x}" for i in range(len(uuids))]
    cid = [f"{i:02x}" * 32 for i in range(len(uuids))]
    listed = [
        pod_item(NODE, "team", f"train-{i}", uid[i], {"trainer": f"containerd://{cid[i]}"}) for i in range(len(uuids))
    ]
    server = FakeApiServer([nvidia_slice(NODE, [(u, i) for i, u in enumerate(uuids)])], listed).start()
    mount = hierarchy(None)
    why = usable(mount)
    if why is not None or mount is None:
        print(f"the GPU processes stay in their cgroups: {why}", flush=True)
        return server, None
    made = Cgroups(mount)
    for i, pid in enumerate(pids):
        slice_ = f"kubepods-burstable-pod{uid[i].replace('-', '_')}.slice"
        made.move(pid, f"kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid[i]}.scope")
    print(f"the GPU processes are in pod cgroups under {made.root}", flush=True)
    return server, made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvitop", type=Path, help="the nvitop-exporter script of its own venv")
    ap.add_argument("--series", action="store_true", help="only count each side's series (nvitop's if --nvitop)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds per window (>= 60 for the figure)")
    ap.add_argument("--rounds", type=int, default=4, help="windows per scrape rate")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds after both serve, before the first window")
    ap.add_argument("--kubernetes", action="store_true", help="also node mode with the kubernetes collector")
    ap.add_argument(
        "--apiserver",
        action="store_true",
        help="with --kubernetes: the fake API server (slices, pods), NODE_NAME, and the GPU processes in pod cgroups",
    )
    ap.add_argument("--breakdown", action="store_true", help="only the import layers of each side")
    ap.add_argument("--tree", type=Path, help="run the jaxmon sides from this directory's jaxmon/ package")
    ap.add_argument("--name", default="node_weight", help="results file name (bench/results/NAME.json)")
    args = ap.parse_args()
    if args.series:
        count_series(args)
        return
    if args.nvitop is None:
        raise SystemExit("--nvitop is needed (all but --series)")
    nvitop = args.nvitop.resolve()
    if not nvitop.exists():
        raise SystemExit(f"{nvitop} not found: python3 -m venv /tmp/nvx && /tmp/nvx/bin/pip install nvitop-exporter")
    if args.breakdown:
        save("node_weight_breakdown", {"command": " ".join(sys.argv), "layers": breakdown(nvitop.parent / "python")})
        return
    version = subprocess.run([str(nvitop), "--version"], capture_output=True, text=True).stdout.strip()

    # Read in a child: this script imports nothing of jaxmon's, so no page of the daemon's libraries is shared with
    # it (PSS splits shared pages between the processes that map them).
    default = "from jaxmon.compose import default_settings; print(default_settings().poll.interval)"
    poll_interval = float(subprocess.run([sys.executable, "-c", default], capture_output=True, text=True).stdout)
    build()  # the fake library, kept until this script exits
    sleepers = [subprocess.Popen(["sleep", "infinity"]) for _ in range(GPUS)]
    tmp = Path(tempfile.mkdtemp(prefix="node-weight-"))
    devices = [device(i, processes=[{"pid": p.pid, "used": (1 + i) * GIB}]) for i, p in enumerate(sleepers)]
    scenario = Scenario(tmp / "nvml.json", devices)
    env = {**os.environ, **scenario.env(), "PYTHONUNBUFFERED": "1"}
    jaxmon_exe = str(Path(sys.executable).with_name("jaxmon"))
    jaxmon_env = dict(env)
    if args.tree is not None:
        jaxmon_env["PYTHONPATH"] = str(args.tree.resolve())
    where = "import jaxmon; print(jaxmon.__file__)"
    package = subprocess.run([sys.executable, "-c", where], env=jaxmon_env, capture_output=True, text=True, cwd="/")
    print(f"jaxmon sides run {package.stdout.strip()}", flush=True)
    kubelet: FakeKubelet | None = None
    apiserver: FakeApiServer | None = None
    cgroups: Cgroups | None = None
    sides: list[Side] = []
    try:
        port = free_port()
        argv = [jaxmon_exe, "serve", "--node", "--web.listen-address", f"127.0.0.1:{port}"]
        sides.append(Side("jaxmon", argv, jaxmon_env, port))
        port = free_port()
        argv = [str(nvitop), "--bind-address", "127.0.0.1", "--port", str(port), "--hostname", "bench"]
        sides.append(Side("nvitop_exporter", argv, env, port))
        if args.kubernetes:
            uuids = [d["uuid"] for d in devices]
            pods = [
                pod("team", f"train-{i}", container("trainer", {"nvidia.com/gpu": [u]})) for i, u in enumerate(uuids)
            ]
            kubelet = FakeKubelet(pods).start()
            port = free_port()
            argv = [jaxmon_exe, "serve", "--node", "--web.listen-address", f"127.0.0.1:{port}"]
            argv += ["--collector.kubernetes", "--collector.kubernetes.socket", str(kubelet.socket)]
            k_env = jaxmon_env
            if args.apiserver:
                apiserver, cgroups = api_server(uuids, [p.pid for p in sleepers])
                argv += ["--collector.kubernetes.service-account", str(apiserver.account)]
                k_env = {**jaxmon_env, **apiserver.env, "NODE_NAME": NODE}
            sides.append(Side("jaxmon_kubernetes", argv, k_env, port))
        expected = {str(i): float((10 + i) * GIB) for i in range(GPUS)}
        for side in sides:

            def serving(side: Side = side) -> bool:
                if not side.child.alive():
                    raise RuntimeError(f"{side.name} exited:\n{side.child.log()[-3000:]}")
                try:
                    return gpus_seen(side) == expected
                except (OSError, RuntimeError, http.client.HTTPException):
                    return False

            wait_until(serving, 60, f"{side.name} serving the 8 GPUs", step=0.2, detail=lambda s=side: s.child.log())
        if kubelet is not None:
            k = sides[2]
            wait_until(
                lambda: any(dict(lab).get("pod") == "train-0" for _, lab in k.samples()),
                30,
                "pod labels on the kubernetes side",
            )
        if apiserver is not None:
            k = sides[2]
            wait_until(
                lambda: any(
                    n == "jaxmon_kubernetes_api_up" and v == 1 and ("list", "pods") in lab
                    for (n, lab), v in k.samples().items()
                ),
                30,
                "the API server's pods listed on the kubernetes side",
            )
        print(f"all serving the {GPUS} GPUs; settling {args.settle:.0f} s", flush=True)
        time.sleep(args.settle)
        rounds: dict[str, list[dict[str, dict[str, Any]]]] = {rate: [] for rate in RATES}
        for rate, period in RATES.items():
            for r in range(args.rounds):
                w = window(sides, args.window, period, reverse=r % 2 == 1)
                rounds[rate].append(w)
                print(
                    f"{rate} round {r}: "
                    + "; ".join(
                        f"{n} cpu {v['cpu_percent']:.3f} % rss {v['rss'] / MiB:.1f} pss {v['pss'] / MiB:.1f} MiB"
                        f" ({v['scrapes']} scrapes)"
                        for n, v in w.items()
                    ),
                    flush=True,
                )
        counts = {s.name: series(s) for s in sides}
        errors = {
            s.name: [ln for ln in s.child.log().splitlines() if "ERROR" in ln or "Traceback" in ln] for s in sides
        }
    finally:
        for side in sides:
            side.child.stop()
        if kubelet is not None:
            kubelet.close()
        if apiserver is not None:
            apiserver.close()
        if cgroups is not None:
            cgroups.close()  # the sleepers back to the hierarchy's root, their cgroups removed
        for p in sleepers:
            p.kill()
            p.wait()

    keys = ("cpu_percent", "schedstat_cpu_percent", "rss", "hwm", "pss", "rss_anon", "rss_file", "threads")
    summary = {
        rate: {s.name: {k: median([w[s.name][k] for w in ws]) for k in keys} for s in sides}
        for rate, ws in rounds.items()
    }
    j, n = "jaxmon", "nvitop_exporter"
    goals: dict[str, Any] = {}
    for rate, sm in summary.items():
        goals[rate] = {
            "rss_ratio": sm[j]["rss"] / sm[n]["rss"],
            "pss_ratio": sm[j]["pss"] / sm[n]["pss"],
            "cpu_ratio": sm[j]["cpu_percent"] / sm[n]["cpu_percent"],
            "rss_met": sm[j]["rss"] <= 1.5 * sm[n]["rss"],
            "cpu_met": sm[j]["cpu_percent"] <= sm[n]["cpu_percent"],
        }
        if "jaxmon_kubernetes" in sm:
            goals[rate]["kubernetes_extra_rss_mib"] = (sm["jaxmon_kubernetes"]["rss"] - sm[j]["rss"]) / MiB
            goals[rate]["kubernetes_extra_hwm_mib"] = (sm["jaxmon_kubernetes"]["hwm"] - sm[j]["hwm"]) / MiB
    for rate, sm in summary.items():
        for name, v in sm.items():
            print(
                f"{rate} {name}: RSS {v['rss'] / MiB:.1f} MiB (HWM {v['hwm'] / MiB:.1f}, PSS {v['pss'] / MiB:.1f}),"
                f" CPU {v['cpu_percent']:.3f} % of a core (schedstat {v['schedstat_cpu_percent']:.3f} %),"
                f" {v['threads']:.0f} threads, series {counts[name]['total']}"
            )
        print(f"{rate} goals: {json.dumps(goals[rate])}")
    save(
        args.name,
        {
            "jaxmon_package": package.stdout.strip(),
            "command": " ".join(["python", "bench/node_weight.py", *sys.argv[1:]]),
            "nvitop_exporter_version": version,
            "gpus": GPUS,
            "polls": {
                "jaxmon": f"nvml collector every {poll_interval:g} s (--poll.interval default); Xid events waited for",
                "nvitop_exporter": "host (psutil) and every GPU every 1 s (--interval default)",
            },
            "scrape_periods_s": RATES,
            "window_s": args.window,
            "rounds_per_rate": args.rounds,
            "summary": summary,
            "goals": goals,
            "series": counts,
            "rounds": rounds,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "log_error_lines": errors,
        },
    )


if __name__ == "__main__":
    main()
