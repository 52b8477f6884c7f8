"""Unit tests start no process and open no inet socket; a guard fails any test under tests/unit that tries.

One audit hook (`sys.addaudithook`, installed once: conftest modules are imported once per session, and an audit
hook cannot be removed) watches process starts (`subprocess.Popen`, `os.posix_spawn`, `os.fork`, `os.exec`, and
`os.spawn`, `os.system`, `os.forkpty`) and inet sockets (`socket.bind` / `socket.connect` with AF_INET or AF_INET6;
the AF_UNIX socket pairs asyncio makes are fine). It is armed only while a test under tests/unit runs: its setup
(module-scoped fixtures included), its call and its teardown, through the runtest hooks below, which pytest calls
for this directory's tests only. A forbidden event raises `UnitTestIsolationError` where it happens, and the test
fails naming what it did and where, even when the code under test caught that exception.

gRPC opens its sockets in C, where Python raises no audit event: while the guard is armed, `grpc.server` and the
channel constructors refuse too. A test that needs any of these belongs in tests/e2e.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import grpc
import pytest

from jaxmon.device_readings import DeviceInfo
from jaxmon.sources.local import LocalSource
from tests.helpers import ROOT

PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.spawn", "os.system", "os.forkpty"}
)
SOCKET_EVENTS = frozenset({"socket.bind", "socket.connect"})
INET = frozenset({socket.AF_INET, socket.AF_INET6})
GRPC_CALLS = ("server", "insecure_channel", "secure_channel")


class UnitTestIsolationError(RuntimeError):
    """A unit test started a process or used an inet socket."""


class _Guard:
    """The unit test running now (None: disarmed) and what it did that it must not."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.caught: list[str] = []

    def refuse(self, what: str) -> NoReturn:
        message = (
            f"{self.test} {what} at {_where()}: a unit test starts no process and opens no inet socket; "
            "move it to tests/e2e"
        )
        self.caught.append(message)
        raise UnitTestIsolationError(message)


GUARD = _Guard()


def _where() -> str:
    """The innermost line of the suite's or jaxmon's own code on the stack (not this file's)."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(str(ROOT)) and frame.filename != __file__ and "/.venv/" not in frame.filename:
            return f"{frame.filename.removeprefix(str(ROOT) + '/')}:{frame.lineno}"
    return "an unknown place"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if GUARD.test is None:
        return
    if event in PROCESS_EVENTS:
        shown = ", ".join(repr(a) for a in args[:2])
        GUARD.refuse(f"started a process ({event}{f' {shown}' if shown else ''})")
    elif event in SOCKET_EVENTS and getattr(args[0], "family", None) in INET:
        GUARD.refuse(f"{'bound' if event == 'socket.bind' else 'connected'} an inet socket ({event} {args[1]!r})")


sys.addaudithook(_audit)


def _refusing(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        GUARD.refuse(f"called grpc.{name} (gRPC opens its sockets in C, out of the audit hook's sight)")

    return call


@contextmanager
def _armed(item: pytest.Item) -> Iterator[None]:
    real = {name: getattr(grpc, name) for name in GRPC_CALLS}
    for name in GRPC_CALLS:
        setattr(grpc, name, _refusing(name))
    GUARD.test, GUARD.caught = item.nodeid, []
    escaped = False
    try:
        yield
    except UnitTestIsolationError:
        escaped = True  # the test fails with it, and its traceback shows the line
        raise
    finally:
        caught, GUARD.test = GUARD.caught, None
        for name, call in real.items():
            setattr(grpc, name, call)
        if caught and not escaped:  # the code under test caught the error: the test fails all the same
            pytest.fail("\n".join(caught), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _armed(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _armed(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    with _armed(item):
        return (yield)


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalSource, list[DeviceInfo]]]:
    """This process's JAX devices; the GPU variables LocalSource sets are removed again afterwards."""
    source = LocalSource(gpu_memory_fraction=0.02)
    devices, _ = source.discover()
    yield source, devices
    for name in source.applied_env:
        os.environ.pop(name, None)


def pick(devices: list[DeviceInfo], device_id: int) -> DeviceInfo:
    """The CPU device with `device_id`."""
    (dev,) = [d for d in devices if d.platform == "cpu" and d.id == device_id]
    return dev
