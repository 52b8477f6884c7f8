"""libtpu's monitoring SDK (`libtpu.sdk.tpumonitoring`), read in a long-lived child process of its own.

The SDK serves `tensorcore_util` (per TensorCore), which libtpu's gRPC service does not. Importing libtpu is not
safe everywhere (see sdk_child.py), so the daemon never imports it: a child does (`sdk_child.py`, stdlib only), and
the daemon talks to it over a pipe, one JSON line each way per poll. Every read has a deadline; a child that crashes
or does not answer in time is killed and its series are absent, with a status that says why; it is started again
after a back-off (1 s, doubling to 5 minutes; a missing libtpu is looked for again every 5 minutes). A child that
cannot be started at all (fork's EAGAIN at a pod's pids limit, no temporary directory for its stderr) is the same:
status `spawn_failed`, counted (`spawn_failures`), tried again after the back-off; `read()` never raises.

Why one long-lived child rather than a child per poll: a child pays a Python start and libtpu's import (seconds, and
hundreds of MB mapped) before it can answer; per poll that would cost the daemon's host more than everything else it
does. A long-lived child pays them once and then answers a poll in a few milliseconds (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

CHILD = Path(__file__).with_name("sdk_child.py")

TENSORCORE_UTIL = "tensorcore_util"
# One entry per chip: they tell how many TensorCores each chip has (tensorcore_util has one per core).
PER_CHIP = ("hbm_capacity_total", "duty_cycle_pct")

# Why there is no data (or that there is): the values of the status series' `status` label.
STATUSES = (
    "ok", "empty", "starting", "not_installed", "import_failed", "failed", "crashed", "timeout", "spawn_failed",
)  # fmt: skip

_BACKOFF_MIN, _BACKOFF_MAX = 1.0, 300.0
_NOT_INSTALLED_RETRY = 300.0


@dataclass(frozen=True)
class SdkReading:
    """One poll: the status, why (detail), and the SDK's strings per metric asked for and answered."""

    status: str
    detail: str = ""
    data: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)
    supported: frozenset[str] = frozenset()
    version: str = ""


def percents(values: Sequence[str]) -> list[float | None]:
    """The SDK's percentage strings ("12.5", "12.5%") as ratios 0-1; None for one that is not a percentage."""
    out: list[float | None] = []
    for text in values:
        try:
            value = float(text.strip().rstrip("%"))
        except ValueError:
            out.append(None)
            continue
        out.append(value / 100.0 if math.isfinite(value) and 0.0 <= value <= 100.0 else None)
    return out


class SdkChild:
    """The child that reads the SDK; `read()` never blocks longer than `timeout` seconds."""

    def __init__(self, timeout: float, start_timeout: float = 60.0, python: str = sys.executable) -> None:
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.python = python
        self.starts = 0
        self.spawn_failures = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._buffer = b""
        self._hello: dict[str, Any] | None = None
        self._started_at = 0.0
        self._retry_at = 0.0
        self._backoff = _BACKOFF_MIN
        self._last_failure = SdkReading("starting")

    def read(self, metrics: Sequence[str]) -> SdkReading:
        """The SDK's answer for `metrics`, or a reading whose status says why there is none."""
        now = time.monotonic()
        if self._proc is None:
            if now < self._retry_at:
                return self._last_failure
            try:
                self._spawn(now)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                self.spawn_failures += 1
                return self._fail("spawn_failed", f"the SDK child could not be started: {type(exc).__name__}: {exc}")
        if self._hello is None:
            hello = self._hello_line(now)
            if isinstance(hello, SdkReading):
                return hello
            self._hello = hello
        hello = self._hello
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write((json.dumps({"metrics": list(metrics)}) + "\n").encode())
            self._proc.stdin.flush()
        except OSError:
            return self._fail("crashed", self._exit_detail())
        line = self._line(now + self.timeout)
        if line is None:
            return self._fail("timeout", f"the SDK child did not answer within {self.timeout:g} s")
        if line == b"":
            return self._fail("crashed", self._exit_detail())
        try:
            answer = json.loads(line)
            data = {str(k): tuple(str(v) for v in vs) for k, vs in answer["data"].items()}
            errors = {str(k): str(v) for k, v in answer.get("errors", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._fail("failed", f"the SDK child answered a line jaxmon cannot read: {exc}")
        self._backoff = _BACKOFF_MIN
        supported = frozenset(str(n) for n in hello.get("supported", ()))
        version = str(hello.get("version", ""))
        if any(data.get(name) for name in metrics):
            status, detail = "ok", ""
        elif errors:
            status, detail = "failed", "; ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
        else:
            status, detail = "empty", "the SDK answered no value for " + ", ".join(metrics)
        return SdkReading(status, detail, data, errors, supported, version)

    def close(self) -> None:
        """Stop the child (the next read starts a new one)."""
        self._kill()

    def _spawn(self, now: float) -> None:
        """Start the child; raises OSError where it cannot be (no temporary file, no fork), leaving nothing open."""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the child's stderr, closed with the child
        try:
            # -P: the script's directory (jaxmon/sources/libtpu) stays off sys.path, so `import libtpu` finds libtpu.
            self._proc = subprocess.Popen(
                [self.python, "-P", str(CHILD)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                close_fds=True,
                start_new_session=True,  # a signal to the daemon's group (Ctrl-C) is not the child's
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except BaseException:
            self._stderr.close()
            self._stderr = None
            raise
        self.starts += 1
        self._buffer = b""
        self._hello = None
        self._started_at = now

    def _hello_line(self, now: float) -> dict[str, Any] | SdkReading:
        start_deadline = self._started_at + self.start_timeout
        line = self._line(min(now + self.timeout, start_deadline))
        if line is None:
            if time.monotonic() >= start_deadline:
                return self._fail("timeout", f"libtpu's import took longer than {self.start_timeout:g} s")
            return SdkReading("starting", "the SDK child is importing libtpu")
        if line == b"":
            return self._fail("crashed", "while importing libtpu: " + self._exit_detail())
        try:
            hello = json.loads(line)
            status = str(hello["status"])
        except (ValueError, KeyError, TypeError) as exc:
            return self._fail("failed", f"the SDK child's first line cannot be read: {exc}")
        if status != "ok":
            retry = _NOT_INSTALLED_RETRY if status == "not_installed" else None
            return self._fail(status if status in STATUSES else "failed", str(hello.get("detail", "")), retry)
        return dict(hello)

    def _line(self, deadline: float) -> bytes | None:
        """The child's next line (without its newline), b"" at end of file, None past the deadline."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _exit_detail(self) -> str:
        assert self._proc is not None
        try:
            code = self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "the SDK child closed its pipe"
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        tail = self._stderr_tail()
        return f"the SDK child {why}" + (f": {tail}" if tail else "")

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            lines = self._stderr.read()[-2000:].decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _fail(self, status: str, detail: str, retry: float | None = None) -> SdkReading:
        self._kill()
        if retry is None:
            retry, self._backoff = self._backoff, min(self._backoff * 2, _BACKOFF_MAX)
        self._retry_at = time.monotonic() + retry
        self._last_failure = SdkReading(status, detail)
        return self._last_failure

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._hello = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
