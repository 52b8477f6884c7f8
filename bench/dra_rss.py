"""What the API server client costs node mode in memory (issue 35: at most 3 MiB of RSS, no Kubernetes client
library): the import, the use, and the daemon with it on against the daemon with it off.

    .venv/bin/python bench/dra_rss.py            # about a minute

1. **Import and use**, in a fresh interpreter: VmRSS after importing what node mode with the kubernetes collector
   loads anyway (the web app, hypercorn, pydantic, prometheus_client, structlog, the kubelet source and its
   stubs, grpc), then after importing jaxmon.sources.kubernetes_api and jaxmon.ownership.dra (http.client, ssl, json),
   then after 50 refreshes of a ClusterCache against the fake API server over TLS (tests/fake_apiserver.py: one
   NVIDIA slice of 8 GPUs with 7 MIG devices each, and 110 pods, the kubelet's default pod limit), resolving 8
   claimed GPUs each time.
2. **The daemon**: `jaxmon serve --node --collector.kubernetes` on the fake kubelet (8 pods claiming a GPU each
   through DRA) with `NODE_NAME` unset (the API server client is not even imported) and set (the cache's thread
   lists every second, 60 times its default rate), polling every second for `--seconds` (30); VmRSS and VmHWM at
   the end; `--rounds` (3) pairs, medians.

Writes bench/results/dra_rss.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median, proc_status, save
from tests.fake_apiserver import FakeApiServer, nvidia_slice, pod_item
from tests.fake_kubelet import FakeKubelet, claim, claimed, container, pod
from tests.helpers import Daemon, jaxmon_env, wait_for_samples

NODE = "node-a"
GPUS = [(f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", i) for i in range(8)]
MIGS = [(f"MIG-{i:08x}-{j:04x}-bbbb-cccc-{i:012x}", i, "1g.18gb") for i in range(8) for j in range(7)]

LAYERS = r"""
import gc, json, sys
def rss():
    gc.collect()
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
out = {"python": rss()}
import grpc, hypercorn.asyncio, pydantic, prometheus_client, structlog
import jaxmon.web.asgi, jaxmon.ownership.attribution, jaxmon.logsetup, jaxmon.families, jaxmon.sources.kubelet
from jaxmon.sources.kubelet.stubs import stubs
stubs()
assert "jaxmon.sources.kubernetes_api" not in sys.modules, "loaded before its layer"
out["node mode with the kubelet"] = rss()
from jaxmon.ownership.dra import resolve
from jaxmon.sources.kubelet import ClaimedDevice
from jaxmon.sources.cluster_cache import ClusterCache
from jaxmon.sources.kubernetes_api import ApiClient, InCluster
out["+ kubernetes_api, dra imported"] = rss()
env, account = json.loads(sys.argv[1]), sys.argv[2]
from pathlib import Path
cache = ClusterCache(lambda: ApiClient(InCluster.from_env(env, Path(account))), "node-a")
claims = [ClaimedDevice("ns", f"p{i}", "c", "gpus", "ns", "gpu.nvidia.com", "node-a", f"gpu-{i}") for i in range(8)]
for _ in range(50):
    cache.refresh()
    got = resolve(cache.view().slices, claims)
assert len(got.devices) == 8 and cache.health().up == {"resourceslices": True, "pods": True}, cache.health()
out["+ 50 refreshes and resolutions"] = rss()
print(json.dumps(out))
"""


def layers(server: FakeApiServer) -> dict[str, float]:
    """VmRSS (MiB) after each layer, in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", LAYERS, json.dumps(server.env), str(server.account)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    return {k: v / 2**20 for k, v in json.loads(run.stdout.splitlines()[-1]).items()}


def daemon(kubelet: FakeKubelet, server: FakeApiServer, api: bool, seconds: float, log_dir: Path) -> dict[str, float]:
    """VmRSS and VmHWM (MiB) of node mode with the kubernetes collector after `seconds` of 1 s polls."""
    env = {**jaxmon_env(), **server.env}
    env.pop("NODE_NAME", None)
    if api:
        env["NODE_NAME"] = NODE
    args = [
        "--node",
        "--poll.interval=1s",
        "--collector.kubernetes",
        f"--collector.kubernetes.socket={kubelet.socket}",
        f"--collector.kubernetes.service-account={server.account}",
        "--collector.kubernetes.resourceslice-interval=1s",
    ]
    d = Daemon(log_dir, args, env)
    try:
        d.wait_ready()
        problems = "jaxmon_kubernetes_dra_problems_total"
        wait_for_samples(
            d.url,
            lambda s: any(name == problems for name, _ in s) if api else any(n.startswith("jaxmon_kub") for n, _ in s),
            "the kubernetes collector's families",
            60,
        )
        time.sleep(seconds)
        status = proc_status(d.proc.pid)
        return {"VmRSS": status["VmRSS"] / 2**20, "VmHWM": status["VmHWM"] / 2**20}
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3, help="daemon pairs, off then on; medians reported")
    args = parser.parse_args()
    pods = [pod_item(NODE, "ns", f"pod-{i}", f"uid-{i}", {"main": f"containerd://{i:064x}"}) for i in range(110)]
    server = FakeApiServer([nvidia_slice(NODE, GPUS, MIGS)], pods).start()
    kubelet_pods = [
        pod(
            "ns",
            f"pod-{i}",
            container("main", claims=[claim("gpus", "ns", claimed("gpu.nvidia.com", NODE, f"gpu-{i}"))]),
        )
        for i in range(8)
    ]
    kubelet = FakeKubelet(kubelet_pods).start()
    try:
        result: dict[str, object] = {"layers_mib": layers(server)}
        offs, ons = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                offs.append(daemon(kubelet, server, False, args.seconds, Path(tmp)))
                ons.append(daemon(kubelet, server, True, args.seconds, Path(tmp)))
        result["daemon_mib"] = {
            "api off (no NODE_NAME: the client not imported)": {k: median([r[k] for r in offs]) for k in offs[0]},
            "api on (lists every 1 s)": {k: median([r[k] for r in ons]) for k in ons[0]},
            "rounds": {"off": offs, "on": ons},
        }
        result["requests_served"] = len(server.calls())
    finally:
        kubelet.close()
        server.close()
    print(json.dumps(result, indent=2))
    save("dra_rss", result)


if __name__ == "__main__":
    main()
