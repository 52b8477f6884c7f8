"""`jaxmon.start()`: the exporter inside a training process, on the trainer's own allocator."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import structlog

from jaxmon.faults import Faults
from jaxmon.publisher import default_workload_name
from jaxmon.settings import Settings, SettingsError, load_settings

log = structlog.get_logger("jaxmon.embedded")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class Exporter:
    """A running in-process exporter: scheduler plus HTTP server on a background thread."""

    def __init__(self, settings: Settings, workload: str) -> None:
        from jaxmon.cli import build_info, runtime_config
        from jaxmon.jaxdevices import InProcessWorkload, LocalSource
        from jaxmon.runtime import Runtime
        from jaxmon.server import make_server

        self.settings = settings
        self.workload = workload
        source = LocalSource(sidecar_defaults=False)  # the trainer's JAX: change none of its settings
        self.runtime = Runtime(
            source,
            runtime_config(settings, workload=workload),
            build_info(),
            Faults.from_env(),
            workload_probe=InProcessWorkload(source),
        )
        self._server = make_server(self.runtime, settings)
        self.runtime.start()
        self._thread = threading.Thread(target=self._serve, name="jaxmon-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.serving = bool(self._server.started)
        if not self.serving:
            # A busy port must not take the training run down with it: keep collecting, say so loudly.
            log.error("jaxmon could not serve HTTP", address=settings.web.listen_address)

    def _serve(self) -> None:
        with contextlib.suppress(SystemExit):  # uvicorn exits when it cannot bind
            self._server.run()

    @property
    def port(self) -> int | None:
        """The port actually bound (useful with port 0)."""
        for server in getattr(self._server, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return None

    @property
    def url(self) -> str | None:
        """Base URL of the endpoint on loopback."""
        port = self.port
        return f"http://127.0.0.1:{port}" if port is not None else None

    def stop(self) -> None:
        """Stop serving and collecting."""
        global _running
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.runtime.stop()
        with _running_lock:
            if _running is self:
                _running = None

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_running: Exporter | None = None
_running_lock = threading.Lock()


def start(port: int | None = None, *, workload: str | None = None, **overrides: Any) -> Exporter:
    """Start jaxmon inside this process and return its handle (`stop()`, or use it as a context manager).

    Settings come from the arguments, then `JAXMON_*` environment variables (and the YAML file they name), then
    defaults. `overrides` take the settings' sections as dicts: `start(9400, probe={"interval": "30s"})`.
    Calling it again while one runs returns the running exporter.
    """
    global _running
    with _running_lock:
        if _running is not None:
            log.info("jaxmon already running in this process", url=_running.url)
            return _running
        base = load_settings([], prog="jaxmon.start").model_dump()
        if port is not None:
            overrides = _merge(overrides, {"web": {"listen_address": f":{port}"}})
        try:
            settings = Settings.model_validate(_merge(base, overrides))
        except Exception as exc:
            raise SettingsError(f"jaxmon.start: {exc}") from exc
        _running = Exporter(settings, workload or default_workload_name())
        return _running
