"""A data pipeline with the real grain, and a prometheus_client Counter of the loop's own, under jaxmon.start(),
run as a child process by tests/e2e/test_registry.py.

Usage: registry.py (JAXMON_* settings from the environment). Answers `OK {"url": ...}`, then reads commands on stdin,
each answered with `OK <json>`:
  batches N   read N batches from the grain pipeline, counting each in the loop's own Counter; answer with the
              batches read so far
  exit
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import grain
from prometheus_client import Counter

import jaxmon
from jaxmon.logsetup import configure_logging
from tests.workloads.protocol import answer

# The loop's own metric, in prometheus_client's default registry as every prometheus_client user writes it.
BATCHES = Counter("trainer_batches", "Batches the training loop read.", ["split"])


def main() -> None:
    configure_logging("info", "json", stream=sys.stderr)
    exporter = jaxmon.start(0, workload="grainy", poll={"interval": 0.2}, collector={"probe": False})
    answer(url=exporter.url, pid=os.getpid())
    dataset = grain.MapDataset.range(1_000_000).map(lambda x: x * 2).batch(8).to_iter_dataset()
    batches = iter(dataset)
    read = 0
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "batches":
            for _ in range(int(rest[0])):
                next(batches)
                BATCHES.labels(split="train").inc()
                read += 1
            answer(read=read)
        elif cmd == "exit":
            break
    exporter.stop()
    answer(stopped=True)


if __name__ == "__main__":
    main()
