"""Child of bench/tpu_poll.py: one tpu collector polling a libtpu service, one poll per line read from stdin.

    python bench/tpu_poller.py ADDRESS        # with PYTHONPATH=DIR to poll with the jaxmon package of DIR

Each "poll" line runs one `TpuCollector.update()` and answers "SECONDS SUCCESS SERIES" (the poll's wall time, 1 or
0, the number of samples its families hold). It imports nothing of bench/ or tests/, so that PYTHONPATH decides
which jaxmon it runs: this checkout's, or another one's (the code before a change).
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the protocol's
    from jaxmon.collectors.base import standalone_context
    from jaxmon.collectors.tpu import TpuCollector, TpuOptions
    from jaxmon.snapshot import Snapshot
    from jaxmon.sources.local import LocalSource

    source = LocalSource(environ={})
    ctx = standalone_context(source, source.discover()[0])
    collector = TpuCollector(TpuOptions(enabled=True, address=sys.argv[1], timeout=2.0), ctx)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "poll":
            break
        t0 = time.perf_counter()
        update = collector.update()
        elapsed = time.perf_counter() - t0
        series = sum(len(f.samples) for f in collector.families(Snapshot(), update.state))
        print(f"{elapsed!r} {int(update.success)} {series}", flush=True)
    collector.stop()


if __name__ == "__main__":
    main()
