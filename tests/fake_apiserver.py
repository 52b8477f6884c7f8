"""A Kubernetes API server's two lists node mode reads, over HTTPS on loopback, in a child process.

It answers `GET /apis/resource.k8s.io/v1/resourceslices` and `GET /api/v1/pods` as the API server does: JSON
lists (`ResourceSliceList`, `PodList`) filtered by `fieldSelector=spec.nodeName=NODE`, in pages of `limit` items
(at most the scenario's `page_size`) with `metadata.continue`, only with the right bearer token (401 otherwise, as
a `Status`). Its certificate is signed by a test CA (tests/tls_helpers.py). Every request re-reads the scenario
file the test writes (atomically) and appends `path?query` to `<scenario>.calls`. The outage modes: `status` (an
HTTP status such as 503 answered to every request), `delay_seconds`, and stopping the process (connection
refused); starting it again listens on the same port.

    python -m tests.fake_apiserver PORT CERT KEY SCENARIO
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fake_child import ScenarioChild
from tests.helpers import free_port
from tests.tls_helpers import make_certs

TOKEN = "fake-service-account-token"


def attribute(value: str | int | bool) -> dict[str, Any]:
    """A DeviceAttribute as resource.k8s.io/v1 spells it ({"string": ...}, {"int": ...}, {"bool": ...})."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": value}


def resource_slice(
    node: str, driver: str, pool: str, devices: list[dict[str, Any]], generation: int = 1, name: str | None = None
) -> dict[str, Any]:
    """A ResourceSlice of `node` publishing `devices` (`device()`), as a DRA driver's kubelet plugin writes it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{pool}", "uid": f"slice-{node}-{pool}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device(name: str, **attributes: str | int | bool) -> dict[str, Any]:
    """One device of a slice with its attributes."""
    return {"name": name, "attributes": {k: attribute(v) for k, v in attributes.items()}}


def nvidia_slice(
    node: str, gpus: Sequence[tuple[str, int]], migs: Sequence[tuple[str, int, str]] = (), generation: int = 1
) -> dict[str, Any]:
    """The slice NVIDIA's DRA driver (gpu.nvidia.com) publishes for `node` (pool = node name): `gpus` as (uuid,
    index), devices `gpu-<index>`; `migs` as (MIG uuid, parent index, profile), devices
    `gpu-<index>-mig-<profile>-<n>`, each with `parentUUID`."""
    devices = [
        device(
            f"gpu-{index}",
            type="gpu",
            uuid=uuid,
            index=index,
            minor=index,
            productName="NVIDIA H100 80GB HBM3",
            driverVersion="580.95.5",
            cudaComputeCapability="9.0",
        )
        for uuid, index in gpus
    ]
    parents = {i: u for u, i in gpus}
    for n, (uuid, parent, profile) in enumerate(migs):
        devices.append(
            device(
                f"gpu-{parent}-mig-{profile}-{n}",
                type="mig",
                uuid=uuid,
                parentUUID=parents.get(parent, ""),
                index=n,
                parentIndex=parent,
                profile=profile,
            )
        )
    return resource_slice(node, "gpu.nvidia.com", node, devices, generation)


def tpu_slice(node: str, chips: int, generation: int = 1) -> dict[str, Any]:
    """The slice Google's TPU DRA driver (tpu.google.com, kubernetes-sigs/dra-driver-google-tpu) publishes: devices
    `accel<n>` with `index`, `uuid`, `tpuGen`, `accelerator`, `topology` and `chipCount`."""
    devices = [
        device(
            f"accel{n}",
            index=n,
            uuid=f"tpu-{n:08x}-ee02-ee8c-f699-{n:012x}",
            tpuGen="v6e",
            accelerator="tpu-v6e-slice",
            topology="2x4",
            chipCount=chips,
            brand="Google",
        )
        for n in range(chips)
    ]
    return resource_slice(node, "tpu.google.com", node, devices, generation)


def pod_item(node: str, namespace: str, name: str, uid: str, containers: dict[str, str]) -> dict[str, Any]:
    """A Pod on `node` whose containers (name -> container id, `containerd://…`) are running."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": c} for c in containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": cid, "ready": True, "restartCount": 0} for c, cid in containers.items()
            ],
        },
    }


class FakeApiServer(ScenarioChild):
    """The server as a child process on `port`, with the test PKI in a directory of its own; `ca` is the CA file
    a client trusts and `account` a service-account directory (`token`, `ca.crt`, `namespace`). `update()` changes
    slices, pods, token, status, delay_seconds or page_size; stopping it refuses connections until it starts
    again."""

    module = "tests.fake_apiserver"
    what = "the fake API server"

    def __init__(self, slices: list[dict[str, Any]] | None = None, pods: list[dict[str, Any]] | None = None) -> None:
        super().__init__(
            "apiserver-",
            {
                "slices": slices or [],
                "pods": pods or [],
                "token": TOKEN,
                "status": None,
                "delay_seconds": 0,
                "page_size": 500,
            },
        )
        self.certs = make_certs(self.dir)
        self.account = self.dir / "serviceaccount"
        self.account.mkdir()
        (self.account / "token").write_text(TOKEN + "\n")
        (self.account / "ca.crt").write_bytes(self.certs.server_ca.read_bytes())
        (self.account / "namespace").write_text("monitoring")
        self.port = free_port()

    @property
    def env(self) -> dict[str, str]:
        """The in-cluster variables a pod would see for this server."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def node_mode(self, socket: Path, node: str) -> tuple[list[str], dict[str, str]]:
        """The daemon's arguments and environment for node mode on `node`, reading the kubelet at `socket` and this
        server as its service account would (append the test's own arguments and variables)."""
        args = ["--node", "--collector.kubernetes", "--collector.kubernetes.socket", str(socket)]
        args += ["--collector.kubernetes.service-account", str(self.account)]
        return args, {**self.env, "NODE_NAME": node}

    def calls(self) -> list[str]:
        """`path?query` of every request so far, in order."""
        return self.call_lines()

    def args(self) -> list[str]:
        return [str(self.port), str(self.certs.server_cert), str(self.certs.server_key), str(self.scenario_path)]

    def start(self) -> FakeApiServer:
        self._start()
        return self


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _on_node(item: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    field, _, value = selector.partition("=")
    if field != "spec.nodeName":
        raise ValueError(f"field label not supported: {field}")
    return bool((item.get("spec") or {}).get("nodeName") == value)


def _serve(port: int, cert: Path, key: Path, scenario: Path) -> None:
    calls = scenario.with_suffix(".calls")
    lists = {
        "/apis/resource.k8s.io/v1/resourceslices": ("slices", "ResourceSliceList", "resource.k8s.io/v1"),
        "/api/v1/pods": ("pods", "PodList", "v1"),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, code: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            data = json.loads(scenario.read_text(encoding="utf-8"))
            with open(calls, "a") as out:
                out.write(f"{self.path}\n")
            if data.get("delay_seconds"):
                time.sleep(data["delay_seconds"])
            if data.get("status"):
                code = int(data["status"])
                return self._answer(code, _status(code, "ServiceUnavailable", f"fake API server answers {code}"))
            if self.headers.get("Authorization") != f"Bearer {data['token']}":
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            parts = urlsplit(self.path)
            if parts.path not in lists:
                return self._answer(404, _status(404, "NotFound", f"the server could not find {parts.path}"))
            key, kind, version = lists[parts.path]
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            try:
                items = [i for i in data[key] if _on_node(i, query.get("fieldSelector"))]
            except ValueError as exc:
                return self._answer(400, _status(400, "BadRequest", str(exc)))
            limit = min(int(query.get("limit") or 10**9), int(data.get("page_size") or 10**9))
            start = int(query.get("continue") or 0)
            page, rest = items[start : start + limit], items[start + limit :]
            meta: dict[str, Any] = {"resourceVersion": "12345"}
            if rest:
                meta["continue"] = str(start + limit)
                meta["remainingItemCount"] = len(rest)
            self._answer(200, {"kind": kind, "apiVersion": version, "metadata": meta, "items": page})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    (scenario.parent / "ready").write_text("")
    server.serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
