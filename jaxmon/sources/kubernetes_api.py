"""The Kubernetes API server, read with the pod's service account: the node's ResourceSlices and pods.

Both lists are filtered to this node (`fieldSelector=spec.nodeName=NODE`, NODE from the downward API):
`resource.k8s.io/v1` ResourceSlices say which GPU or chip a DRA claim's device is (jaxmon.ownership.dra), `v1` pods name
the pod of a UID or container id read from a process's cgroup. No Kubernetes client library (tens of MiB): the
stdlib's http.client and ssl, as `jaxmon top` fetches with urllib. In-cluster configuration as client-go's:
`KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA in `/var/run/secrets/kubernetes.io/serviceaccount/`; the
token (projected, rotated by the kubelet) is re-read whenever its file changes and once more on a 401; TLS is
verified against that CA, the server's name included.

jaxmon.sources.cluster_cache keeps the last good answer of each list, refreshed on a thread of its own.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import structlog

log = structlog.get_logger("jaxmon.sources.kubernetes_api")

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PODS = "/api/v1/pods"
# Items per page: the API server's own default chunk size for kubectl, small enough for a busy node's pods.
PAGE_SIZE = 500
MAX_BODY_BYTES, MAX_PAGES = 64 << 20, 1000  # a node's slices and pods are a few MiB at most


class ApiError(Exception):
    """A list that did not answer. `code` is the reason label: `config` (no in-cluster configuration),
    `unreachable` (refused, no route, DNS), `timeout`, `tls` (the certificate does not verify), `unauthorized`
    (401), `forbidden` (403: the RBAC is missing), `http_<status>`, `bad_answer` (not a list)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class InCluster:
    """Where the API server is and how to prove who we are: the pod's service account."""

    host: str
    port: int
    token_path: Path
    ca_path: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None, account: Path) -> InCluster:
        """From `KUBERNETES_SERVICE_HOST`/`_PORT` (in `env`, else the process's) and `account`'s `token` and
        `ca.crt` (the pod's service account: `--collector.kubernetes.service-account`); raises ApiError(`config`)."""
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port:
            raise ApiError("config", "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?)")
        try:
            number = int(port)
        except ValueError:
            raise ApiError("config", f"KUBERNETES_SERVICE_PORT is {port!r}, not a port number") from None
        token, ca = account / "token", account / "ca.crt"
        for path in (token, ca):
            if not path.is_file():
                raise ApiError("config", f"{path} does not exist (no service account token mounted?)")
        return cls(host, number, token, ca)


@dataclass(frozen=True)
class PodIndex:
    """The pods on the node: uid -> (namespace, name), and container id -> (pod uid, container name).

    Container ids are bare (`containerd://abc…` is `abc…`), as cgroup paths spell them; init and ephemeral
    containers are included.
    """

    pods: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    containers: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def pod_index(items: Iterable[Mapping[str, Any]]) -> PodIndex:
    """A PodIndex of a PodList's items (a pod without metadata.uid is left out)."""
    pods: dict[str, tuple[str, str]] = {}
    containers: dict[str, tuple[str, str]] = {}
    for item in items:
        meta = item.get("metadata") or {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            continue
        pods[uid] = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        status = item.get("status") or {}
        for kind in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(kind) or []:
                cid = cs.get("containerID") if isinstance(cs, Mapping) else None
                if isinstance(cid, str) and cid:
                    containers[cid.partition("://")[2] or cid] = (uid, str(cs.get("name", "")))
    return PodIndex(pods, containers)


# -- the lists' items as readings --------------------------------------------------------------------------------

# How DRA names a device: (driver, pool, device).
DeviceName = tuple[str, str, str]
AttributeValue = str | int | bool


class SliceError(ValueError):
    """A ResourceSlice that is not one (a field missing or of the wrong type), named with what is wrong."""


@dataclass(frozen=True)
class SliceDevice:
    """One device a ResourceSlice publishes: its name and attributes (names without the driver's domain)."""

    driver: str
    pool: str
    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)

    @property
    def key(self) -> DeviceName:
        return (self.driver, self.pool, self.name)


def _attribute(name: str, value: Any, where: str) -> tuple[str, AttributeValue] | None:
    """One attribute as (name, value); None for a type jaxmon does not read (a future one)."""
    if not isinstance(value, dict):
        raise SliceError(f"{where}: attribute {name!r} is {type(value).__name__}, not an object")
    for kind, types in (("string", str), ("version", str), ("bool", bool), ("int", int)):
        if kind in value:
            got = value[kind]
            if not isinstance(got, types) or (kind == "int" and isinstance(got, bool)):
                raise SliceError(f"{where}: attribute {name!r}: {kind} is {got!r}")
            return name, got
    return None


def slice_devices(item: Mapping[str, Any]) -> tuple[int, tuple[SliceDevice, ...]]:
    """The pool generation and devices of one ResourceSlice (resource.k8s.io/v1 JSON); raises SliceError."""
    name = (item.get("metadata") or {}).get("name", "?") if isinstance(item, Mapping) else "?"
    where = f"ResourceSlice {name}"
    spec = item.get("spec") if isinstance(item, Mapping) else None
    if not isinstance(spec, Mapping):
        raise SliceError(f"{where}: no spec")
    driver, pool = spec.get("driver"), spec.get("pool")
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"{where}: spec.driver is {driver!r}")
    if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
        raise SliceError(f"{where}: spec.pool.name missing")
    generation = pool.get("generation", 0)
    if not isinstance(generation, int):
        raise SliceError(f"{where}: spec.pool.generation is {generation!r}")
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        raise SliceError(f"{where}: spec.devices is {type(devices).__name__}, not a list")
    prefix = driver + "/"
    out = []
    for device in devices:
        if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
            raise SliceError(f"{where}: a device without a name")
        attributes: dict[str, AttributeValue] = {}
        raw = device.get("attributes") or {}
        if not isinstance(raw, Mapping):
            raise SliceError(f"{where}: device {device['name']}: attributes are not an object")
        for attr, value in raw.items():
            read = _attribute(attr, value, f"{where}: device {device['name']}")
            if read is not None:
                # An unqualified name is in the driver's domain: `uuid` is `gpu.nvidia.com/uuid`.
                attributes[attr.removeprefix(prefix)] = read[1]
        out.append(SliceDevice(driver, pool["name"], device["name"], attributes))
    return generation, tuple(out)


def index_slices(items: Iterable[Mapping[str, Any]]) -> dict[DeviceName, SliceDevice]:
    """The devices of the slices by (driver, pool, device), each pool at its highest generation; raises SliceError."""
    pools: dict[tuple[str, str], tuple[int, list[SliceDevice]]] = {}
    for item in items:
        generation, devices = slice_devices(item)
        spec = item["spec"]
        pool = (spec["driver"], spec["pool"]["name"])
        held = pools.get(pool)
        if held is None or generation > held[0]:
            pools[pool] = (generation, list(devices))
        elif generation == held[0]:
            held[1].extend(devices)
    return {d.key: d for _, devices in pools.values() for d in devices}


class ApiClient:
    """GETs and paginated lists against the API server, with the service account's token, each page with a
    deadline of `timeout` seconds and a whole list within `deadline` seconds."""

    def __init__(self, config: InCluster, timeout: float = 5.0, deadline: float = 30.0) -> None:
        self.config = config
        self.timeout = timeout
        self.deadline = deadline
        self._token: str | None = None
        self._token_stamp: tuple[int, int, int] | None = None
        self._context: ssl.SSLContext | None = None
        self._ca_stamp: tuple[int, int, int] | None = None

    def token(self, force: bool = False) -> str:
        """The bearer token, re-read when the file changed (the kubelet swaps the projected token's symlink)."""
        try:
            stamp = _stamp(self.config.token_path)
            if force or self._token is None or stamp != self._token_stamp:
                self._token = self.config.token_path.read_text(encoding="utf-8").strip()
                self._token_stamp = stamp
        except OSError as exc:
            raise ApiError("config", f"{self.config.token_path}: {exc.strerror or exc}") from None
        return self._token

    def _ssl(self) -> ssl.SSLContext:
        """A context trusting the service account's CA (re-made when the CA file changes)."""
        try:
            stamp = _stamp(self.config.ca_path)
            if self._context is None or stamp != self._ca_stamp:
                self._context = ssl.create_default_context(cafile=str(self.config.ca_path))
                self._ca_stamp = stamp
        except (OSError, ssl.SSLError) as exc:
            raise ApiError("config", f"{self.config.ca_path}: {exc}") from None
        return self._context

    def get(self, path: str, query: Mapping[str, str], timeout: float | None = None) -> dict[str, Any]:
        """One GET of a JSON object; raises ApiError. A 401 re-reads the token and tries once more."""
        for attempt in (0, 1):
            status, body = self._request(path, query, self.token(force=attempt == 1), timeout or self.timeout)
            if status != 401:
                break
        if status == 401:
            raise ApiError("unauthorized", f"GET {path}: 401 (the service account token was refused)")
        if status == 403:
            raise ApiError("forbidden", f"GET {path}: 403 {_reason(body)} (does the ClusterRole grant list?)")
        if status != 200:
            raise ApiError(f"http_{status}", f"GET {path}: {status} {_reason(body)}")
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise ApiError("bad_answer", f"GET {path}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ApiError("bad_answer", f"GET {path}: a {type(doc).__name__}, not an object")
        return doc

    def _request(self, path: str, query: Mapping[str, str], token: str, timeout: float) -> tuple[int, bytes]:
        target = f"{path}?{urlencode(query)}" if query else path
        conn = http.client.HTTPSConnection(self.config.host, self.config.port, timeout=timeout, context=self._ssl())
        try:
            conn.request("GET", target, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
            response = conn.getresponse()
            body = response.read(MAX_BODY_BYTES + 1)
        except ssl.SSLCertVerificationError as exc:
            raise ApiError("tls", f"{self.config.host}:{self.config.port}: {exc.verify_message or exc}") from None
        except TimeoutError:
            raise ApiError("timeout", f"GET {path}: no answer within {timeout:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError("unreachable", f"{self.config.host}:{self.config.port}: {exc}") from None
        finally:
            conn.close()
        if len(body) > MAX_BODY_BYTES:
            raise ApiError("bad_answer", f"GET {path}: answer larger than {MAX_BODY_BYTES >> 20} MiB")
        return response.status, body

    def list_items(self, path: str, query: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every item of a list, page by page (`limit`, `continue`), within the deadline; raises ApiError."""
        end = time.monotonic() + self.deadline
        items: list[dict[str, Any]] = []
        token = ""
        for _ in range(MAX_PAGES):
            left = end - time.monotonic()
            if left <= 0:
                raise ApiError("timeout", f"GET {path}: the list took longer than {self.deadline:g} s")
            page = {**query, "limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            doc = self.get(path, page, timeout=min(self.timeout, left))
            got = doc.get("items")
            if not isinstance(got, list):
                raise ApiError("bad_answer", f"GET {path}: no items list (kind {doc.get('kind')!r})")
            items.extend(i for i in got if isinstance(i, dict))
            token = (doc.get("metadata") or {}).get("continue") or ""
            if not token:
                return items
        raise ApiError("bad_answer", f"GET {path}: more than {MAX_PAGES} pages")

    def resource_slices(self, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices of node `node` (resource.k8s.io/v1)."""
        return self.list_items(RESOURCE_SLICES, {"fieldSelector": f"spec.nodeName={node}"})

    def pods(self, node: str) -> list[dict[str, Any]]:
        """The pods on node `node`."""
        return self.list_items(PODS, {"fieldSelector": f"spec.nodeName={node}"})


def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten."""
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _reason(body: bytes) -> str:
    """The message of a Kubernetes Status answer, else the start of the body."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])[:300]
    except ValueError:
        pass
    return body[:200].decode("utf-8", "replace")
