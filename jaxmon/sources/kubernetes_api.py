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

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
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
    def from_env(cls, env: Mapping[str, str] | None = None, account: Path = SERVICE_ACCOUNT) -> InCluster:
        """From `KUBERNETES_SERVICE_HOST`/`_PORT` and `account`'s `token` and `ca.crt`; raises ApiError(`config`)."""
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
