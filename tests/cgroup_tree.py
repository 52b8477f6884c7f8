"""Real cgroups for the tests, where the machine allows: child processes moved into cgroups shaped like a Kubernetes
pod's or a Slurm step's, made under a directory of the test's own in a mounted hierarchy (cgroup v2, or a v1
controller's), so that nothing of the host's (its system.slice, a real kubepods.slice) is touched, and removed after.

Making a cgroup and moving a process into it takes root (or a delegated subtree) and a writable hierarchy; where the
machine does not allow it (`usable()` says why), the tests use a procfs root they write instead
(tests/unit/sources/test_cgroups.py, tests/e2e/test_daemon_slurm.py): `write_process` and `cgroup_tree` below."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounts(fstype: str) -> list[tuple[Path, set[str]]]:
    """(mount point, super options) of each mount of `fstype` (cgroup2, cgroup) in this process's mount namespace."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(tail) >= 3 and tail[0] == fstype:
            out.append((Path(fields[4]), set(tail[2].split(","))))
    return out


def hierarchy(controller: str | None = None) -> Path | None:
    """The cgroup v2 mount (controller None), or the v1 hierarchy with `controller`; None where there is none."""
    if controller is None:
        found = mounts("cgroup2")
        return found[0][0] if found else None
    return next((point for point, options in mounts("cgroup") if controller in options), None)


class Cgroups:
    """Cgroups under `<mount>/jaxmon-test-<random>/`, each holding one child process; `close()` ends the children
    and removes the cgroups, deepest first."""

    def __init__(self, mount: Path) -> None:
        self.mount = mount
        self.root = mount / f"jaxmon-test-{uuid.uuid4().hex[:12]}"
        self.children: list[subprocess.Popen[bytes]] = []
        self.made: list[Path] = []

    def spawn(self, path: str) -> subprocess.Popen[bytes]:
        """A child process (sleeping) moved into `<root>/<path>`; it reads that path in its /proc/<pid>/cgroup."""
        child = subprocess.Popen(["sleep", "600"])
        self.children.append(child)
        self.move(child.pid, path)
        return child

    def move(self, pid: int, path: str) -> None:
        target = self.root / path.strip("/")
        for d in [*reversed(target.parents), target]:
            if d.is_relative_to(self.root) and not d.exists():
                d.mkdir()
                self.made.append(d)
        # v2 takes a process in cgroup.procs; v1 in cgroup.procs too (tasks takes threads).
        (target / "cgroup.procs").write_text(f"{pid}\n")

    def path_of(self, path: str) -> str:
        """The path /proc/<pid>/cgroup shows for `<root>/<path>` (relative to the hierarchy's mount)."""
        return "/" + str((self.root / path.strip("/")).relative_to(self.mount))

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait()
        for d in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                # A process still in it (one the test did not start): back to the hierarchy's root, then remove.
                for pid in (d / "cgroup.procs").read_text().split():
                    (self.mount / "cgroup.procs").write_text(pid)
                d.rmdir()


def usable(mount: Path | None) -> str | None:
    """Why real cgroups cannot be made under `mount` here (None: they can)."""
    if mount is None:
        return "no such cgroup hierarchy is mounted"
    if os.geteuid() != 0 and not os.access(mount, os.W_OK):
        return f"{mount} is not writable by uid {os.geteuid()}"
    trial = Cgroups(mount)
    try:
        trial.spawn("probe")
    except OSError as err:
        return f"cannot make a cgroup under {mount} and move a process into it: {err}"
    finally:
        trial.close()
    return None


# A procfs and a sysfs the tests write, where real cgroups are not needed (or not allowed).


def made(controller: str | None, instead: str) -> Iterator[Cgroups]:
    """A fixture's body: real cgroups in the hierarchy of `controller` (None: the unified one), removed after the
    test; where none can be made, the test is skipped saying what runs `instead`, except under CI, which runs as
    root on a machine that makes them and fails instead of skipping."""
    mount = hierarchy(controller)
    why = usable(mount)
    if why is not None or mount is None:
        message = f"real cgroups cannot be made here ({why}); {instead}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    cgroups = Cgroups(mount)
    yield cgroups
    cgroups.close()
    assert not cgroups.root.exists()


def write_process(procfs: Path, pid: int, cgroup: str, started: int = 1000, uid: int = 1000) -> None:
    """A process as /proc shows it: its stat (start time in field 22), cgroup and status."""
    d = procfs / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 5 2 0 0 20 0 4 0 {started} 1 2\n")
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")


def cgroup_tree(sysfs: Path, *dirs: str) -> None:
    """Directories of the cgroup tree under `<sysfs>/fs/cgroup` (what `slurm_cgroups` looks for)."""
    for d in dirs:
        (sysfs / "fs" / "cgroup" / d).mkdir(parents=True)
