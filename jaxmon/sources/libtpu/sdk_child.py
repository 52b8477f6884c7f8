"""The child process that imports libtpu's monitoring SDK (`libtpu.sdk.tpumonitoring`) for the daemon's tpu collector.

Run as a script (`python -P sdk_child.py`), never imported by jaxmon: it uses the standard library alone, so the
child holds libtpu and nothing of jaxmon, and a crash or a hang in libtpu costs this process, not the daemon.
Importing libtpu inside a multi-threaded ML process has crashed (duplicate protobuf descriptor registration), which
is why Google's tpu-info imports it only after a canary subprocess survived the import (tpu_info/cli_helper.py,
`_initialize_libtpu_safely`); jaxmon goes one step further and never imports it outside this child.

The protocol, one JSON object per line:
- the child, once the import is done: {"status": "ok", "supported": [name, ...], "version": "..."} or
  {"status": "not_installed" | "import_failed" | "failed", "detail": "..."} (then it exits);
- the parent, per poll: {"metrics": [name, ...]};
- the child: {"data": {name: [str, ...]}, "errors": {name: "ExceptionType: message"}}.
The SDK's `get_metric(name).data()` returns a list of strings, one per chip or core (tensorcore_util: one
percentage per TensorCore, e.g. "12.5"; tpu-info shows each as f"{value}%", TensorCoreUtilizationTable); the child
passes them on as strings and the parent reads them (jaxmon/sources/libtpu/sdk.py).

The SDK's C++ may write to file descriptor 1: the child moves the protocol to a duplicate of it and points fd 1 at
stderr, so nothing but protocol lines reaches the parent's pipe.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, TextIO


def _protocol_out() -> TextIO:
    proto = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(proto, "w", buffering=1, encoding="utf-8")


def _send(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _read(monitoring: Any, names: list[str]) -> dict[str, Any]:
    data: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            values = monitoring.get_metric(name).data()
            data[name] = [str(v) for v in (values or [])]
        except Exception as exc:  # any failure of one metric is reported, the others go on
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
    return {"data": data, "errors": errors}


def _exit_with_parent(parent: int) -> None:
    """A thread that ends this process once its parent is gone (reparented): a child hung in libtpu does not
    outlive a daemon that was killed (one not hung reads the end of its stdin and exits by itself)."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="jaxmon-sdk-parent-watch", daemon=True).start()


def main() -> int:
    _exit_with_parent(os.getppid())
    out = _protocol_out()
    try:
        from libtpu.sdk import tpumonitoring
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        status = "not_installed" if missing in ("libtpu", "libtpu.sdk") else "import_failed"
        _send(out, {"status": status, "detail": f"{type(exc).__name__}: {exc}"[:500]})
        return 0
    except Exception as exc:  # libtpu's import can fail in any way; the parent says why
        _send(out, {"status": "import_failed", "detail": f"{type(exc).__name__}: {exc}"[:500]})
        return 0
    try:
        supported = [str(name) for name in tpumonitoring.list_supported_metrics()]
    except Exception as exc:
        _send(out, {"status": "failed", "detail": f"list_supported_metrics: {type(exc).__name__}: {exc}"[:500]})
        return 0
    try:
        import libtpu

        version = str(getattr(libtpu, "__version__", ""))
    except Exception:
        version = ""
    _send(out, {"status": "ok", "supported": supported, "version": version})
    for line in sys.stdin:
        try:
            names = [str(n) for n in json.loads(line)["metrics"]]
        except (ValueError, KeyError, TypeError):
            return 2
        _send(out, _read(tpumonitoring, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
