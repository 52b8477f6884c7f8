"""Who owns a process: the Kubernetes pod and container, or the Slurm job, that its cgroup names.

NVML reports the pids of the compute processes on each GPU; `/proc/<pid>/cgroup` says whose they are, as
dcgm-exporter's pidmapper reads it. The kubelet puts each pod in a cgroup named after its UID and the runtime puts
each container in one named after its id:

- systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/
  cri-containerd-<id>.scope` (`kubepods-besteffort-…`, `kubepods-pod<uid>.slice` for guaranteed pods; `crio-<id>.scope`
  under CRI-O, `docker-<id>.scope` under cri-dockerd);
- cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>` (`/kubepods/pod<uid>/<id>` for guaranteed pods);
- the same under a prefix where the node itself runs in a container (kind: `/system.slice/docker-<node>.scope/
  kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod<uid>.slice/…`).

Slurm puts each job step in `/slurm/uid_<uid>/job_<job>/step_<step>/task_<n>` (cgroup v1; `/slurm_<node>/…` with
several slurmd on one host) or `/system.slice/slurmstepd.scope/job_<job>/step_<step>/user/task_<n>` (cgroup v2;
`<node>_slurmstepd.scope` with several slurmd), whose path has no uid: the process's real uid stands for it then.

cgroup v2 has one line (`0::<path>`); cgroup v1 one per hierarchy, and a hybrid host both: the v2 line is read first,
then the v1 lines in a fixed order of controllers (`V1_ORDER`), and the first line that names an owner gives it, pod
and job together (a Slurm job inside a pod, as where slurmd runs in Kubernetes, has both).

Pids are those of NVML's PID namespace, the host's: a DaemonSet needs `hostPID: true` (or the host's /proc mounted
and `--path.procfs` pointing at it). Each pid's owner is cached with the process's start time (field 22 of
/proc/<pid>/stat), so a poll reads one small file per known process and a reused pid is read afresh.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from jaxmon.logsetup import ErrorLog

log = structlog.get_logger("jaxmon.sources.cgroups")

PROCFS = Path("/proc")
SYSFS = Path("/sys")
# Processes whose owners are remembered; a poll forgets those NVML no longer reports (`ProcessCgroups.read_all`).
MAX_CACHED = 4096

# v1 hierarchies in the order their paths are trusted: the controllers Slurm's task/cgroup and proctrack/cgroup plugins
# and the kubelet both use first; systemd's own hierarchy, where a unit may sit elsewhere, last; any other after these.
V1_ORDER = ("memory", "freezer", "cpuset", "devices", "pids", "cpu,cpuacct", "cpuacct,cpu", "cpu", "cpuacct", "blkio")

_UID = r"[0-9a-fA-F][0-9a-fA-F_-]{30,35}"
# kubepods[-qos]-pod<uid>.slice, maybe behind a prefix of the kubelet's cgroup root (kind: kubelet-kubepods-…).
_SYSTEMD_POD = re.compile(
    rf"(?:^|/)(?:[^/]*-)?kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod(?P<uid>{_UID})\.slice(?:/(?P<next>[^/]+))?"
)
_CGROUPFS_POD = re.compile(
    rf"(?:^|/)kubepods(?:/(?:burstable|besteffort|guaranteed))?/pod(?P<uid>{_UID})(?:/(?P<next>[^/]+))?"
)
# A container's cgroup below its pod's: `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope` (systemd),
# `<id>` or `crio-<id>` (cgroupfs).
_CONTAINER = re.compile(r"(?:(?P<runtime>cri-containerd|crio|docker|cri-dockerd)-)?(?P<id>[0-9a-f]{12,64})(?:\.scope)?")
_RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "cri-dockerd": "docker"}
_SLURM_V1 = re.compile(r"(?:^|/)slurm(?:_[^/]+)?/uid_(?P<uid>\d+)/job_(?P<job>\d+)(?:/step_(?P<step>[^/]+))?(?:/|$)")
_SLURM_V2 = re.compile(r"(?:^|/)(?:[^/]+_)?slurmstepd\.scope/job_(?P<job>\d+)(?:/step_(?P<step>[^/]+))?(?:/|$)")


@dataclass(frozen=True)
class CgroupPod:
    """A Kubernetes pod (its metadata.uid) and the container the process runs in."""

    uid: str
    # The runtime's container id (as in the pod's status, after `containerd://`); "" for a process in the pod's own
    # cgroup rather than a container's (CRI-O's conmon, say).
    container_id: str = ""
    # containerd, cri-o or docker where the cgroup's name says so ("" under the cgroupfs driver's bare ids).
    runtime: str = ""


@dataclass(frozen=True)
class SlurmJob:
    """A Slurm job, the step the process runs in, and the job's user."""

    job_id: str
    # 0, 1, ..., batch, extern, interactive; "" for a process in the job's cgroup itself.
    step: str = ""
    # The uid of the job's user: the cgroup path's (v1), else the process's real uid (v2); "" when neither is known.
    uid: str = ""


@dataclass(frozen=True)
class ProcessCgroup:
    """Whose a process is: a pod's container, a Slurm job, or both (a job of a slurmd that runs in a pod)."""

    pod: CgroupPod | None = None
    slurm: SlurmJob | None = None


def cgroup_lines(text: str) -> list[tuple[str, str, str]]:
    """The (hierarchy id, controllers, path) of each line of a /proc/<pid>/cgroup; malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit():
            out.append((parts[0], parts[1], parts[2]))
    return out


def pod_of(path: str) -> CgroupPod | None:
    """The pod (and container) a cgroup path names, under the systemd or the cgroupfs driver; None for any other."""
    found = _SYSTEMD_POD.search(path) or _CGROUPFS_POD.search(path)
    if found is None:
        return None
    uid = found.group("uid").replace("_", "-").lower()
    # A UID (36 characters with dashes) or a static pod's (the kubelet's 32-hex hash of its manifest).
    if len(uid.replace("-", "")) != 32:
        return None
    container = _CONTAINER.fullmatch(found.group("next") or "")
    if container is None:
        return CgroupPod(uid)
    return CgroupPod(uid, container.group("id"), _RUNTIMES.get(container.group("runtime") or "", ""))


def slurm_of(path: str) -> SlurmJob | None:
    """The Slurm job (step, and uid on cgroup v1) a cgroup path names; None for any other path."""
    found = _SLURM_V1.search(path)
    uid = found.group("uid") if found is not None else ""
    found = found or _SLURM_V2.search(path)
    if found is None:
        return None
    return SlurmJob(found.group("job"), found.group("step") or "", uid)


def _rank(line: tuple[str, str, str]) -> tuple[int, int, str]:
    hierarchy, controllers, _ = line
    if hierarchy == "0" and controllers == "":
        return (0, 0, "")
    order = V1_ORDER.index(controllers) if controllers in V1_ORDER else len(V1_ORDER)
    return (1 if not controllers.startswith("name=") else 2, order, controllers)


def process_cgroup(text: str) -> ProcessCgroup | None:
    """The owner a /proc/<pid>/cgroup names: from the first line, v2 first then v1 in `V1_ORDER`, that names a pod or
    a Slurm job; None for a process of neither (the host's, a plain container's)."""
    for _, _, path in sorted(cgroup_lines(text), key=_rank):
        pod, slurm = pod_of(path), slurm_of(path)
        if pod is not None or slurm is not None:
            return ProcessCgroup(pod, slurm)
    return None


def start_time(stat: str) -> int | None:
    """Field 22 of /proc/<pid>/stat (the process's start, in clock ticks since boot); None if malformed."""
    # The command name (field 2) may hold spaces and parentheses: fields after its last ')' start at field 3.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def real_uid(status: str) -> str:
    """The real uid of a /proc/<pid>/status (its `Uid:` line's first field); "" if it has none."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return fields[1] if len(fields) > 1 else ""
    return ""


class ProcessCgroups:
    """The owners of processes, by pid, read from `<procfs>/<pid>/cgroup` and cached with each process's start time.

    A pid that is gone (NVML listed it and it exited before the read) has no owner, without a log line: that happens
    every time a short process ends. A /proc that cannot be read (no hostPID: another PID namespace's pid, or too
    few privileges) is logged once per kind of failure, then once in a while, and those pids have no owner.
    """

    def __init__(self, procfs: Path = PROCFS, max_cached: int = MAX_CACHED) -> None:
        self.procfs = procfs
        self._max = max_cached
        self._lock = threading.Lock()
        # pid -> (start time, owner or None): an entry is good while the pid's start time is the same.
        self._cache: OrderedDict[int, tuple[int, ProcessCgroup | None]] = OrderedDict()
        self._errors = ErrorLog(log)

    def read(self, pid: int) -> ProcessCgroup | None:
        """Pid `pid`'s owner now, or None (no owner, or the process is gone)."""
        started = self._started(pid)
        with self._lock:
            cached = self._cache.get(pid)
            if started is None:
                self._cache.pop(pid, None)
                return None
            if cached is not None and cached[0] == started:
                self._cache.move_to_end(pid)
                return cached[1]
        owner = self._read(pid)
        # Read again: a pid that ended and was reused meanwhile must not get the old process's owner (nor keep it).
        if self._started(pid) != started:
            return None
        with self._lock:
            self._cache[pid] = (started, owner)
            self._cache.move_to_end(pid)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return owner

    def read_all(self, pids: Iterable[int]) -> dict[int, ProcessCgroup]:
        """The owners of a poll's `pids` (those that have one); the cache keeps only these pids afterwards."""
        wanted = set(pids)
        out = {}
        for pid in sorted(wanted):
            owner = self.read(pid)
            if owner is not None:
                out[pid] = owner
        with self._lock:
            for pid in [p for p in self._cache if p not in wanted]:
                del self._cache[pid]
        return out

    def cached(self) -> int:
        """How many pids' owners are remembered now."""
        with self._lock:
            return len(self._cache)

    def _started(self, pid: int) -> int | None:
        text = self._text(pid, "stat")
        return None if text is None else start_time(text)

    def _read(self, pid: int) -> ProcessCgroup | None:
        text = self._text(pid, "cgroup")
        owner = None if text is None else process_cgroup(text)
        if owner is not None and owner.slurm is not None and not owner.slurm.uid:
            status = self._text(pid, "status")
            if status is not None:
                owner = replace(owner, slurm=replace(owner.slurm, uid=real_uid(status)))
        return owner

    def _text(self, pid: int, name: str) -> str | None:
        path = self.procfs / str(pid) / name
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None  # the process is gone
        except OSError as err:
            self._errors.error(
                f"procfs/{name}", "cannot read a process's cgroup", f"{path}: {err}", same=type(err).__name__
            )
            return None
        self._errors.ok(f"procfs/{name}", "processes' cgroups readable again", procfs=str(self.procfs))
        return text


def slurm_cgroups(procfs: Path = PROCFS, sysfs: Path = SYSFS) -> Path | None:
    """Where the cgroup tree shows Slurm, or None: a `slurmstepd.scope` (or `<node>_slurmstepd.scope`) in a slice of
    the cgroup v2 tree (system.slice unless cgroup.conf's CgroupSlice says otherwise), which slurmd makes when it
    starts, or a `slurm` (`slurm_<node>`) directory in a v1 hierarchy, which its cgroup/v1 plugin makes at the first
    job.

    `<procfs>/1/cgroup` says which hierarchies the host has (v2, v1 controllers, or both) and so where under
    `<sysfs>/fs/cgroup` to look; where it cannot be read, every place is looked at.
    """
    mount = sysfs / "fs" / "cgroup"
    try:
        lines = cgroup_lines((procfs / "1" / "cgroup").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        lines = []
    v2 = [mount, mount / "unified"] if not lines or any(h == "0" for h, _, _ in lines) else []
    try:
        every = sorted(p for p in mount.iterdir() if p.is_dir()) if not lines else []
    except OSError:
        every = []
    v1 = [mount / c.removeprefix("name=") for h, c, _ in lines if h != "0"] + every
    for root in v2:
        # system.slice by default; cgroup.conf's CgroupSlice names another slice, maybe nested (a-b.slice in a.slice).
        found = sorted([*root.glob("*.slice/*slurmstepd.scope"), *root.glob("*.slice/*.slice/*slurmstepd.scope")])
        found = [p for p in found if p.name == "slurmstepd.scope" or p.name.endswith("_slurmstepd.scope")]
        if found and found[0].is_dir():
            return found[0]
    for root in v1:
        found = sorted(p for p in root.glob("slurm*") if p.name == "slurm" or p.name.startswith("slurm_"))
        if found and found[0].is_dir():
            return found[0]
    return None
