"""The daemon's signals: SIGTERM and SIGINT stop it, SIGHUP re-reads the web config, SIGUSR1 is ignored."""

from __future__ import annotations

import asyncio
import signal

import structlog

from jaxmon.runtime import Runtime
from jaxmon.web.server import HttpServer

log = structlog.get_logger("jaxmon.web.signals")


def hold_signals_until_serving() -> None:
    """Ignore SIGHUP and SIGUSR1 until serve_until_signalled handles them, so neither kills a starting daemon."""
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


def serve_until_signalled(runtime: Runtime, server: HttpServer) -> None:
    """Run the HTTP server in this thread until SIGTERM or SIGINT, then stop it and the scheduler.

    SIGHUP re-reads the web config at once (as Prometheus reloads its config); SIGUSR1 is logged and ignored.
    """

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[None]] = set()

        def stop(signame: str) -> None:
            log.info("shutting down", signal=signame)
            server.stop()

        def reload() -> None:
            log.info("reloading the web config", signal="SIGHUP")
            task = loop.create_task(server.reload_web_config("SIGHUP"))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        def ignore() -> None:
            log.info("signal ignored", signal="SIGUSR1")

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, reload)
        loop.add_signal_handler(signal.SIGUSR1, ignore)
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        runtime.stop()
