"""The Python stubs of the kubelet's pod-resources v1 API (`api.proto` beside this module), made at first use.

No maintained package ships them, and generated code is not committed: the first call of `stubs()` in a process
runs grpcio-tools' protoc on `api.proto` (`python -m grpc_tools.protoc` in a child interpreter: the compiler's
extension is about 7 MiB of RSS the daemon would otherwise keep mapped for its one use), into a private temporary
directory that is removed at once, and executes the two generated files as the modules
`jaxmon.sources.kubelet.api_pb2` and `jaxmon.sources.kubelet.api_pb2_grpc`. grpcio-tools is a runtime dependency
rather than a build one because its protoc writes code for the protobuf and grpcio it was released with, and
both generated files refuse an older runtime: installed in the same environment, pip resolves the three together,
where a build-time generator would bring its own versions. Nothing is written where the package lives, so a
read-only root file system only needs a writable temporary directory (the manifests mount one at /tmp).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO = Path(__file__).with_name("api.proto")
PACKAGE = __name__.rpartition(".")[0]  # jaxmon.sources.kubelet
_MODULES = (f"{PACKAGE}.api_pb2", f"{PACKAGE}.api_pb2_grpc")

_lock = threading.Lock()
# After a failure to generate them, the stubs are not tried again for this long: a poll that finds the socket does
# not start protoc (a 20 MiB child) each time, and the error it raises says so.
RETRY_SECONDS = 600.0
_failed: tuple[float, str] | None = None  # when (time.monotonic()) and why the last generation failed


class StubsUnavailable(RuntimeError):
    """The stubs cannot be generated here (grpcio-tools missing, or protoc failed)."""


def stubs() -> tuple[Any, Any]:
    """The generated `api_pb2` (messages) and `api_pb2_grpc` (stub, servicer) modules; raises StubsUnavailable."""
    with _lock:
        if all(name in sys.modules for name in _MODULES):
            return sys.modules[_MODULES[0]], sys.modules[_MODULES[1]]
        global _failed
        if _failed is not None and time.monotonic() - _failed[0] < RETRY_SECONDS:
            raise StubsUnavailable(f"{_failed[1]} (not tried again until {RETRY_SECONDS:.0f} s after that)")
        try:
            sources = _generate()
        except StubsUnavailable as exc:
            _failed = (time.monotonic(), str(exc))
            raise
        _failed = None
        modules = []
        for name in _MODULES:
            module = ModuleType(name)
            module.__file__ = str(PROTO)  # the code's source: tracebacks name the .proto, not a removed file
            # The grpc module imports the messages module by name: it must be importable before the grpc one runs.
            sys.modules[name] = module
            try:
                exec(compile(sources[name], f"<generated from {PROTO.name}: {name}>", "exec"), module.__dict__)
            except Exception as exc:
                del sys.modules[name]
                raise StubsUnavailable(f"the code protoc generated from {PROTO} does not load: {exc}") from exc
            modules.append(module)
        return modules[0], modules[1]


def _generate() -> dict[str, str]:
    """protoc --python_out --grpc_python_out for api.proto, named by its path under the package root."""
    if importlib.util.find_spec("grpc_tools") is None:
        raise StubsUnavailable("grpcio-tools is not installed (no module named 'grpc_tools')")
    root = Path(__file__).resolve().parents[len(PACKAGE.split("."))]
    relative = PROTO.resolve().relative_to(root)
    with tempfile.TemporaryDirectory(prefix="jaxmon-protoc-") as out:
        status = _protoc([f"--proto_path={root}", f"--python_out={out}", f"--grpc_python_out={out}", str(relative)])
        if status != 0:
            raise StubsUnavailable(f"protoc failed on {PROTO} (status {status}; its errors are on stderr)")
        generated = Path(out) / relative.parent
        return {
            _MODULES[0]: (generated / "api_pb2.py").read_text(encoding="utf-8"),
            _MODULES[1]: (generated / "api_pb2_grpc.py").read_text(encoding="utf-8"),
        }


def _protoc(arguments: list[str]) -> int:
    """grpcio-tools' protoc with `arguments`, in a child interpreter with this one's module path (its stderr is this
    process's); in this process where there is no interpreter to start (an embedding application without
    sys.executable)."""
    if not sys.executable:
        from grpc_tools import protoc

        return int(protoc.main(["protoc", *arguments]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        command = [sys.executable, "-m", "grpc_tools.protoc", *arguments]
        done = subprocess.run(command, env=env, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StubsUnavailable(f"protoc did not run: {exc}") from exc
    return done.returncode
