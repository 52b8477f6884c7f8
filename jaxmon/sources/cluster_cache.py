"""The API server's lists of this node (jaxmon.sources.kubernetes_api), kept: the last good answer of each.

`ClusterCache` refreshes them on a thread of its own: on a period, and on demand (`want()`: a claimed device not yet
known; `want_pods()`: a process's pod not yet known), at most once per `min_gap` seconds. A failed refresh keeps
what it had (an API-server outage drops no known mapping), is counted by reason, and is said once in the log.
Nothing here runs on a scrape, and a poll waits for an on-demand refresh no longer than the deadline it gives.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from jaxmon.logsetup import ErrorLog
from jaxmon.sources.kubernetes_api import (
    ApiClient,
    ApiError,
    DeviceName,
    PodIndex,
    SliceDevice,
    SliceError,
    index_slices,
    pod_index,
)

log = structlog.get_logger("jaxmon.sources.cluster_cache")


@dataclass(frozen=True)
class ClusterView:
    """The last good answer of each list (what stays in use through an outage), and when it came (monotonic)."""

    slices: Mapping[DeviceName, SliceDevice] = field(default_factory=dict)
    pods: PodIndex = field(default_factory=PodIndex)
    slices_taken: float | None = None
    pods_taken: float | None = None


@dataclass(frozen=True)
class ApiHealth:
    """How the API server answers: each list's last refresh ok, failures by (list, reason), last success (Unix)."""

    up: Mapping[str, bool] = field(default_factory=dict)
    failures: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)
    refreshes: int = 0


class ClusterCache:
    """The node's ResourceSlices and pods, refreshed on a thread every `interval` seconds and on demand.

    `view()` never waits; `want(devices, wait)` may ask for a refresh and wait for it. The client is made lazily by
    `connect` (so a configuration error is a failed refresh, counted and retried, not a crash).
    """

    LISTS = ("resourceslices", "pods")

    def __init__(
        self,
        connect: Callable[[], ApiClient],
        node: str,
        interval: float = 60.0,
        min_gap: float = 5.0,
        pods: bool = True,
    ) -> None:
        self.node = node
        self.interval = interval
        self.min_gap = min_gap
        self._connect = connect
        self._client: ApiClient | None = None
        self._lists = self.LISTS if pods else self.LISTS[:1]
        self._lock = threading.Lock()
        self._view = ClusterView()
        self._up: dict[str, bool] = {}
        self._failures: dict[tuple[str, str], int] = {}
        self._last_success: dict[str, float] = {}
        self._refreshes = 0
        self._busy = False  # a refresh is under way
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._done = threading.Condition(self._lock)
        self._last_demand = -math.inf
        self._asked: set[DeviceName] = set()  # unknown devices an on-demand refresh was made for
        self._asked_pods: set[str] = set()  # unknown pod UIDs an on-demand refresh was made for
        self._thread: threading.Thread | None = None
        self._errors = ErrorLog(log, math.inf)

    def start(self) -> ClusterCache:
        """Start the refresh thread (the first refresh at once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jaxmon-kubernetes-api", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (a refresh under way ends at its own deadline)."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def view(self) -> ClusterView:
        """The last good lists (empty before the first answer)."""
        with self._lock:
            return self._view

    def health(self) -> ApiHealth:
        with self._lock:
            return ApiHealth(dict(self._up), dict(self._failures), dict(self._last_success), self._refreshes)

    def want(self, devices: Iterable[DeviceName], wait: float = 0.0) -> ClusterView:
        """The view, after a refresh if one of `devices` is not in its slices and was not asked for before (at most
        one per `min_gap` seconds), waiting for that refresh at most `wait` seconds. A device still unknown after
        the refresh it caused waits for the period: the API server sees one extra list per new claimed device."""
        with self._lock:
            view = self._view
            missing = {d for d in devices if d not in view.slices}
            if not self._demand(missing - self._asked):
                return view
            self._asked = missing
            # A refresh under way may have listed before the device was published: wait for the next one.
            target = self._refreshes + (2 if self._busy else 1)
            end = time.monotonic() + wait
            while self._refreshes < target and not self._stopped.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._done.wait(left)
            return self._view

    def want_pods(self, uids: Iterable[str]) -> None:
        """Ask for a refresh, without waiting for it, when one of the pod `uids` (a process's cgroup names it) is not
        in the pods list and was not asked for before (at most one per `min_gap` seconds, shared with `want`): a pod
        started since the last list is named at the next poll, not a period later."""
        with self._lock:
            missing = {uid for uid in uids if uid not in self._view.pods.pods}
            if self._demand(missing - self._asked_pods):
                self._asked_pods = missing

    def _demand(self, new: set[Any]) -> bool:
        """Wake the thread for a refresh (under the lock) if `new` holds anything and the last demand is `min_gap`
        seconds old."""
        now = time.monotonic()
        if not new or now - self._last_demand < self.min_gap or self._thread is None:
            return False
        self._last_demand = now
        self._wake.set()
        return True

    def refresh(self) -> None:
        """List both now (the thread's work; tests call it directly). A list that fails keeps its last answer."""
        with self._lock:
            self._busy = True
        try:
            self._refresh()
        finally:
            with self._lock:
                self._busy = False
                self._refreshes += 1
                self._done.notify_all()

    def _refresh(self) -> None:
        for name in self._lists:
            try:
                if self._client is None:
                    self._client = self._connect()
                if name == "resourceslices":
                    slices = index_slices(self._client.resource_slices(self.node))
                    self._succeeded(name, slices=slices)
                else:
                    pods = pod_index(self._client.pods(self.node))
                    self._succeeded(name, pods=pods)
            except ApiError as exc:
                self._failed(name, exc.code, str(exc))
            except SliceError as exc:
                self._failed(name, "bad_answer", f"bad_answer: {exc}")
            except Exception as exc:  # a bug must not end the thread: counted, said, retried
                self._failed(name, type(exc).__name__, f"{type(exc).__name__}: {exc}")

    def _succeeded(
        self, name: str, slices: Mapping[DeviceName, SliceDevice] | None = None, pods: PodIndex | None = None
    ) -> None:
        now = time.monotonic()
        with self._lock:
            v = self._view
            if slices is not None:
                v = ClusterView(slices, v.pods, now, v.pods_taken)
            if pods is not None:
                v = ClusterView(v.slices, pods, v.slices_taken, now)
            self._view = v
            self._up[name] = True
            self._last_success[name] = time.time()
        self._errors.ok(name, "the API server answers again", list=name)

    def _failed(self, name: str, code: str, error: str) -> None:
        with self._lock:
            self._up[name] = False
            self._failures[(name, code)] = self._failures.get((name, code), 0) + 1
            kept = self._last_success.get(name) is not None
        extra = {"kept": "the last good answer stays in use"} if kept else {}
        self._errors.error(name, "API server list failed", error, same=code, list=name, node=self.node, **extra)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            self.refresh()
            self._wake.wait(self.interval)
