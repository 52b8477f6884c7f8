"""Command line: `jaxmon serve` (the daemon) and `jaxmon snapshot` (one look at this machine)."""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

# Each command imports what it needs: `jaxmon healthcheck`, the image's HEALTHCHECK every 30 s within a 5 s timeout,
# loads neither the settings model nor the collectors nor structlog (about 1 s of CPU to start with them).
if TYPE_CHECKING:
    from jaxmon.settings import Settings

COMMANDS = ("serve", "snapshot", "top", "healthcheck")

USAGE = """usage: jaxmon {serve,snapshot,top,healthcheck} [options]

commands:
  serve        run the exporter (jaxmon serve --help lists every setting)
  snapshot     poll and probe every device once and print a table (--json for JSON)
  top          live view of running jaxmon endpoints (jaxmon top --help)
  healthcheck  ask the daemon on this machine for /healthz through its --health.socket: exit 0 when healthy
               (the image's HEALTHCHECK; it reads the daemon's JAXMON_* settings)
"""


def _load(argv: Sequence[str], prog: str, quiet: bool = False, **help_options: Any) -> Settings:
    """Settings, or exit 2 with what is wrong; then logging (`quiet`: warnings and errors only, unless the
    user chose a level)."""
    from jaxmon.compose import load_settings, log_settings_notes
    from jaxmon.logsetup import configure_logging
    from jaxmon.settings import SettingsError

    try:
        settings = load_settings(argv, prog=prog, **help_options)
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    level = "warning" if quiet and "level" not in settings.log.model_fields_set else settings.log.level
    configure_logging(level, settings.log.format)
    log_settings_notes(settings)
    return settings


def serve(argv: Sequence[str]) -> int:
    """Run the daemon until SIGTERM/SIGINT."""
    from jaxmon.compose import build_runtime
    from jaxmon.healthcheck import HealthSocket, HealthSocketError
    from jaxmon.sources.replay import ReplayError
    from jaxmon.web.config_error import WebConfigError
    from jaxmon.web.server import HttpServer
    from jaxmon.web.signals import hold_signals_until_serving, serve_until_signalled

    hold_signals_until_serving()
    settings = _load(argv, "jaxmon serve")
    log = _log()
    try:
        runtime = build_runtime(settings)
    except ReplayError as exc:
        print(f"jaxmon serve: --replay: {exc}", file=sys.stderr)
        return 2
    health = None
    if settings.health.socket is not None:
        try:
            health = HealthSocket(runtime, settings.health.socket)
        except HealthSocketError as exc:
            # Serve on: the metrics matter more than the check, which then says there is no socket.
            log.error(
                "no health socket: `jaxmon healthcheck` will fail", socket=str(settings.health.socket), error=str(exc)
            )
    try:
        server = HttpServer(runtime, settings, health)
    except WebConfigError as exc:
        print(f"jaxmon serve: --web.config.file: {exc}", file=sys.stderr)
        runtime.stop()
        if health is not None:
            health.close()
        return 2
    except OSError as exc:
        print(f"jaxmon serve: cannot listen on {settings.web.listen_address}: {exc.strerror or exc}", file=sys.stderr)
        runtime.stop()
        if health is not None:
            health.close()
        return 1
    # Bound already (connections wait in the backlog): say so before the first poll can announce "ready".
    log.info(
        "serving",
        url=server.metrics_url,
        listen_address=settings.web.listen_address,
        **({"health_socket": str(health.path)} if health is not None else {}),
    )
    runtime.start()
    serve_until_signalled(runtime, server)
    # Two seconds from the start of runtime.stop() (which waits for running polls within them): SIGTERM exits in 5 s.
    _exit_despite_hung_calls(deadline=(runtime.stopped_at or time.monotonic()) + 2.0)
    log.info("stopped")
    return 0


def _log() -> Any:
    import structlog

    return structlog.get_logger("jaxmon")


def _exit_despite_hung_calls(deadline: float) -> None:
    """Give running jobs until `deadline`; a device call hung in native code cannot be interrupted, so then
    exit at once rather than let the interpreter wait for it (SIGTERM must exit 0 within 5 s)."""
    # Daemon threads count too: concurrent.futures joins its workers at exit whatever their daemon flag.
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        thread.join(max(deadline - time.monotonic(), 0.0))
        if thread.is_alive():
            _log().warning("exiting with a device call still running", thread=thread.name)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


# What `jaxmon snapshot` accepts (a shared config file may set them) but does not use: it serves nothing, runs no
# schedule and has no health to report.
_SERVE_ONLY = ("--web.", "--no-web.", "--health.", "--poll.")


def _serve_only(flag: str) -> bool:
    return flag.startswith(_SERVE_ONLY) or (flag.startswith("--collector.") and flag.endswith(".interval"))


def snapshot(argv: Sequence[str]) -> int:
    """One poll and one probe per device, printed; the log shows warnings and errors only (--log.level for more)."""
    from jaxmon.compose import build_runtime
    from jaxmon.sources.replay import ReplayError
    from jaxmon.table import format_table, snapshot_json

    as_json = "--json" in argv
    settings = _load(
        [a for a in argv if a != "--json"],
        "jaxmon snapshot",
        quiet=True,
        help_extra=[("--json", "print JSON instead of a table")],
        help_hidden=_serve_only,
    )
    try:
        runtime = build_runtime(settings)
    except ReplayError as exc:
        print(f"jaxmon snapshot: --replay: {exc}", file=sys.stderr)
        return 2
    try:
        runtime.update_all_once()
        snap = runtime.snapshot()
    finally:
        runtime.stop()
    if as_json:
        print(json.dumps(snapshot_json(snap), indent=2, sort_keys=True))
    else:
        print(format_table(snap))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `jaxmon` console script and `python -m jaxmon`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(USAGE, file=sys.stderr)  # a usage error, as argparse reports one
        return 2
    if args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args[0] == "--version":
        from jaxmon.versions import package_version

        print(f"jaxmon {package_version('jaxmon')}")
        return 0
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    if command == "snapshot":
        return snapshot(rest)
    if command == "healthcheck":
        from jaxmon.healthcheck import main as healthcheck

        return healthcheck(rest)
    if command == "top":
        from jaxmon.top import main as top  # rich and the terminal code only for this command

        return top(rest)
    close = difflib.get_close_matches(command, COMMANDS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    print(f"jaxmon: unknown command {command!r}{hint}\n{USAGE}", file=sys.stderr)
    return 2
