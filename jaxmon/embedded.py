"""`jaxmon.start()`: the exporter inside a training process, on the trainer's own allocator; `jaxmon.stop()`.

How the process ends is the exporter's last word (jaxmon.lastword): `stop()` and the interpreter's exit say
`normal`, unless an uncaught exception ends the script (`exception`: jaxmon chains itself into `sys.excepthook`)
or a signal does (`signal`: KeyboardInterrupt for SIGINT, and SIGTERM through a handler `start()` installs where
the process has none, Python's or a C library's: it says the word, then lets SIGTERM end the process as it would
have). The handler runs when the main thread next runs Python code: a main thread stuck in a device call for
longer is ended by the scheduler's SIGKILL, as without it.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
import time
from types import TracebackType
from typing import Any

import structlog

from jaxmon.finalization import EXIT_WAIT, before_finalization
from jaxmon.lastword import EXCEPTION, NORMAL, SIGNAL, LastWord
from jaxmon.logsetup import ensure_library_logging
from jaxmon.publisher import default_workload_name
from jaxmon.settings import Settings
from jaxmon.sources import InProcess
from jaxmon.threads import PROBE

log = structlog.get_logger("jaxmon.embedded")


class Exporter:
    """A running in-process exporter: scheduler plus HTTP server on a background thread."""

    def __init__(self, settings: Settings, workload: str) -> None:
        from jaxmon.compose import build_runtime, workload_source
        from jaxmon.web.server import HttpServer

        self.settings = settings
        self.workload = workload
        self._pid = os.getpid()
        self._stopped = False
        self._stop_lock = threading.Lock()
        source, in_process = workload_source(settings)  # the trainer's JAX: change none of its settings
        self._in_process: InProcess | None = in_process  # released once, at the stop
        try:
            self.runtime = build_runtime(settings, source, workload=workload, in_process=in_process)
        except BaseException:
            self._release_tracker()
            raise
        self.runtime.last_word = LastWord()
        self.runtime.start()
        self._unregister_exit = before_finalization(self._exit)
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None
        # Why the endpoint does not serve (a busy port, a bad web config), None while it does: the script's way to
        # know, beside `serving`.
        self.error: str | None = None
        try:
            self._server = HttpServer(self.runtime, settings)
        except (OSError, ValueError) as exc:
            # A busy port or a bad web config must not take the training run down: keep collecting, say so.
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("jaxmon could not serve HTTP", address=settings.web.listen_address, error=str(exc))
            return
        self._thread = threading.Thread(target=self._serve, name="jaxmon-http", daemon=True)
        self._thread.start()
        if not self._server.started.wait(10):
            self.error = "the HTTP server did not start within 10 s"
            log.error("jaxmon could not serve HTTP", address=settings.web.listen_address, error=self.error)
            return
        log.info(f"jaxmon serving on {self.public_url}", url=self.public_url, workload=workload)

    def _serve(self) -> None:
        assert self._server is not None
        asyncio.run(self._server.serve())

    @property
    def serving(self) -> bool:
        """True while the HTTP endpoint runs (False when it could not start: `error` says why)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int | None:
        """The port actually bound (useful with port 0)."""
        return self._server.port if self._server is not None else None

    @property
    def url(self) -> str | None:
        """Base URL of the endpoint on loopback."""
        if self._server is None:
            return None
        return f"{self._server.scheme}://127.0.0.1:{self._server.port}"

    @property
    def public_url(self) -> str | None:
        """The metrics URL as the listen address has it (a host of all interfaces shown as this host's name)."""
        return None if self._server is None else self._server.metrics_url

    def stop(self, reason: str = NORMAL, signal_name: str = "") -> None:
        """Stop serving and collecting, and let go of what the exporter holds for the process: its exit callback
        (so nothing keeps its runtime alive) and its share of the training tracker (the last holder stops it, and
        a later `jaxmon.start()` gets a tracker with its own training options). First it says how the process ends
        (`reason`: jaxmon.lastword; `jaxmon_exporter_stopping 1` for a normal end) and waits until each Prometheus
        that scrapes it regularly has been served that (each until its next scrape is due: 1.5 of its intervals
        + 1 s after its last, 61 s at most in all), so that Prometheus knows the job finished rather than died.
        A second call does nothing."""
        global _running
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self._unregister_exit()
        self.last_word(reason, signal_name)
        if self._server is not None and self._thread is not None:
            self._server.stop()
            self._thread.join(timeout=10)
        self.runtime.stop()
        self._release_tracker()
        with _running_lock:
            if _running is self:
                _running = None

    def last_word(self, reason: str, signal_name: str = "") -> None:
        """Say how the process ends and, while serving, wait for the Prometheus scrapers to read it."""
        word = self.runtime.last_word
        if word is None:
            return
        if not self.serving:
            word.say(reason, signal_name)
            return
        started = time.monotonic()
        read = word.stop(reason, signal_name)
        log.info(
            "jaxmon said how the process ends",
            reason=word.reason,
            signal=word.signal,
            scrapers=word.waited_for,
            every_scraper_read_it=read,
            waited_seconds=round(time.monotonic() - started, 3),
        )

    def _release_tracker(self) -> None:
        in_process, self._in_process = self._in_process, None
        if in_process is not None and os.getpid() == self._pid:  # a forked child's copy holds no share
            in_process.release()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _exit(self) -> None:
        """At interpreter exit: stop, and let the probe's threads leave JAX before finalization
        (jaxmon.finalization); the scheduler's workers are joined by concurrent.futures itself."""
        if os.getpid() != self._pid or self._stopped:
            return
        self.stop(*_ending())
        deadline = time.monotonic() + EXIT_WAIT
        for thread in threading.enumerate():
            if thread.name.startswith(PROBE):
                thread.join(max(deadline - time.monotonic(), 0.0))
                if thread.is_alive():
                    log.warning("exiting while a probe is still inside JAX", thread=thread.name)

    def _forked(self) -> None:
        """In a forked child: the threads are gone; let go of the port so it is the parent's alone."""
        if self._server is not None:
            self._server.close_listener()
        self._thread = None


_running: Exporter | None = None
_running_lock = threading.Lock()
_uncaught: BaseException | None = None  # what ended the script, as sys.excepthook saw it
_hooked = False
_previous_excepthook = sys.excepthook


def _ending() -> tuple[str, str]:
    """How the process is ending at the interpreter's exit: (reason, signal name)."""
    if isinstance(_uncaught, KeyboardInterrupt):
        return SIGNAL, "SIGINT"
    if _uncaught is not None:
        return EXCEPTION, ""
    return NORMAL, ""


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """An uncaught exception ends the main thread: note it (the exit's last word), then whatever hook was there."""
    global _uncaught
    _uncaught = value
    _previous_excepthook(kind, value, tb)


def _c_default(signum: int) -> bool:
    """Whether the process's handler of `signum` is the default at the C level (a library's handler, such as a
    runtime's preemption notice, is not Python's and not visible to signal.getsignal)."""
    if not sys.platform.startswith(("linux", "darwin")) or os.uname().machine.startswith("mips"):
        return False  # struct sigaction does not start with its handler there
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(1024)  # a struct sigaction, whatever its size
        if libc.sigaction(signum, None, buf) != 0:
            return False
        return not ctypes.c_void_p.from_buffer(buf).value  # SIG_DFL is 0
    except (OSError, AttributeError, ValueError):
        return False


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM: the running exporter says so (and waits for its scrapers), then the signal ends the process as it
    would have without jaxmon."""
    exporter = _running
    if exporter is not None and os.getpid() == exporter._pid:
        try:
            exporter.last_word(SIGNAL, "SIGTERM")
        except Exception as exc:  # the process ends anyway
            log.error("jaxmon could not say the process ends by SIGTERM", error=f"{type(exc).__name__}: {exc}")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_hooks() -> None:
    """Once a process: sys.excepthook's chain, and the SIGTERM handler where the process has no handler of its own
    and this is the main thread (only it may set one)."""
    global _hooked, _previous_excepthook
    if _hooked:
        return
    _hooked = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and _c_default(signal.SIGTERM):
        signal.signal(signal.SIGTERM, _on_sigterm)


def stop() -> None:
    """Stop the exporter `jaxmon.start()` runs in this process, if any (its `stop()`: the last word said, the
    scrapers waited for, everything let go)."""
    with _running_lock:
        running = _running
    if running is not None:
        running.stop()


def _after_fork_in_child() -> None:
    """A forked child (multiprocessing's fork start method, data loader workers) inherits the exporter's
    listening socket but none of its threads: holding the socket would keep the port bound, and queue scrapes
    that nobody answers, after the parent stops. Close it and forget the parent's exporter."""
    global _running, _running_lock
    parent, _running = _running, None
    _running_lock = threading.Lock()  # it may have been held by another thread at fork
    if parent is not None:
        url = parent.url  # before the sockets it is read from are closed
        parent._forked()
        log.warning(
            "forked child is not monitored: jaxmon serves the parent process only (call jaxmon.start() in the "
            "child to export it on another port)",
            parent_url=url,
        )


os.register_at_fork(after_in_child=_after_fork_in_child)


def start(port: int | None = None, *, workload: str | None = None, **overrides: Any) -> Exporter:
    """Start jaxmon inside this process and return its handle (`stop()`, or use it as a context manager).

    Settings come from the arguments, then `JAXMON_*` environment variables (and the YAML file they name), then
    defaults. `overrides` take the settings' sections as dicts: `start(9400, collector={"probe": {"interval":
    "30s"}})` (the old `probe={...}` works too). Calling it again while one runs returns the running exporter and
    logs a warning when the call asked for something else.
    """
    global _running
    ensure_library_logging()
    from jaxmon.compose import load_settings, log_settings_notes

    _install_hooks()

    with _running_lock:
        if _running is not None:
            if port is not None or workload is not None or overrides:
                log.warning(
                    "jaxmon is already running in this process: returning it, this call's arguments are not applied "
                    "(stop() it first to start another)",
                    url=_running.public_url,
                    workload=_running.workload,
                    asked_port=port,
                    asked_workload=workload,
                )
            return _running
        arguments = dict(overrides)
        if port is not None:
            web = dict(arguments.get("web") or {})
            web["listen_address"] = f":{port}"
            arguments["web"] = web
        settings = load_settings([], arguments=arguments, prog="jaxmon.start", title="jaxmon.start: invalid settings")
        log_settings_notes(settings)
        _running = Exporter(settings, workload or default_workload_name())
        return _running
