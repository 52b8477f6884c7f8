"""The "Memory" row: each device's allocator statistics (memory_stats()), live array bytes, and where the arrays lie
(replicated, in host memory)."""

from __future__ import annotations

from ..panels import DEVICE_LEGEND, MEM, OK_MAPPING, YES_NO_MAPPING, Panel, Row, Target, bottom, rate, top

ROW = Row(
    "Memory",
    [
        Panel(
            "Memory in use vs limit",
            "timeseries",
            "bytes",
            [
                Target(top(f"jaxmon_memory_bytes_in_use{{{MEM}}}"), DEVICE_LEGEND + " in use"),
                Target(top(f"jaxmon_memory_reserved_bytes{{{MEM}}}"), DEVICE_LEGEND + " reserved"),
                Target(top(f"jaxmon_memory_limit_bytes{{{MEM}}}"), DEVICE_LEGEND + " limit"),
                Target(top(f"jaxmon_memory_pool_bytes{{{MEM}}}"), DEVICE_LEGEND + " pool"),
                Target(top(f"jaxmon_memory_reservable_limit_bytes{{{MEM}}}"), DEVICE_LEGEND + " reservable limit"),
            ],
            "Bytes allocated, the allocator's limit (total x memory fraction) and, with the BFC allocator, the "
            "pool actually obtained from the driver. On TPU, reserved: what XLA holds for programs' temporaries "
            "at the other end of memory (not free for arrays), and the most the reservations may grow to.",
            min=0,
        ),
        Panel(
            "Memory in use / limit",
            "timeseries",
            "percentunit",
            [
                Target(
                    top(
                        f"(jaxmon_memory_bytes_in_use{{{MEM}}} + (jaxmon_memory_reserved_bytes{{{MEM}}} or "
                        f"jaxmon_memory_bytes_in_use{{{MEM}}} * 0)) / (jaxmon_memory_limit_bytes{{{MEM}}} > 0)"
                    )
                )
            ],
            "Share of the limit in use, with the programs' reservations on TPU; JaxmonMemoryNearLimit fires above "
            "95 % for 15 minutes.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.95, "red")],
        ),
        Panel(
            "Peak memory in use",
            "timeseries",
            "bytes",
            [
                Target(top(f"jaxmon_memory_peak_bytes_in_use{{{MEM}}}"), DEVICE_LEGEND + " in use"),
                Target(top(f"jaxmon_memory_peak_reserved_bytes{{{MEM}}}"), DEVICE_LEGEND + " reserved"),
            ],
            "The allocator's high-water marks since it started (never reset): of the arrays and, on TPU, of the "
            "programs' reservations.",
            min=0,
        ),
        Panel(
            "Free memory",
            "timeseries",
            "bytes",
            [Target(bottom(f"jaxmon_memory_free_bytes{{{MEM}}}"))],
            "What a new array can get: bytes_limit - bytes_in_use - bytes_reserved (TPU's reservations; 0 on GPU).",
            min=0,
        ),
        Panel(
            "Fragmentation",
            "timeseries",
            "percentunit",
            [Target(top(f"jaxmon_memory_fragmentation_ratio{{{MEM}}}"))],
            "1 - largest free block / free memory in the pool (reservations are not free); absent where the "
            "allocator does not track free blocks (cuda_async). JaxmonMemoryFragmented fires above 0.5 with under "
            "20 % free.",
            min=0,
            max=1,
            thresholds=[(0, "green"), (0.5, "orange"), (0.8, "red")],
        ),
        Panel(
            "Largest allocatable (OOM headroom)",
            "timeseries",
            "bytes",
            [Target(bottom(f"jaxmon_memory_largest_allocatable_bytes{{{MEM}}}"))],
            "Estimated largest single allocation that can still succeed.",
            min=0,
        ),
        Panel(
            "Largest free block",
            "timeseries",
            "bytes",
            [Target(bottom(f"jaxmon_memory_largest_free_block_bytes{{{MEM}}}"))],
            "Largest contiguous free block in the obtained pool.",
            min=0,
        ),
        Panel(
            "Largest allocation so far",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_largest_alloc_bytes{{{MEM}}}"))],
            "Largest single allocation the allocator has served; compare with the headroom.",
            min=0,
        ),
        Panel(
            "Allocations per second",
            "timeseries",
            "ops",
            [Target(top(rate("jaxmon_memory_allocations_total", MEM)))],
            "Rate of allocator allocations (num_allocs).",
            min=0,
        ),
        Panel(
            "Live array bytes (devices without allocator stats)",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_live_array_bytes{{{MEM}}}"))],
            "Bytes of live jax.Array shards in device memory in a workload process, where memory_stats() reports "
            "nothing (CPU).",
            min=0,
        ),
        Panel(
            "Replicated array bytes",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_replicated_array_bytes{{{MEM}}}"))],
            "Bytes of arrays fully replicated over several devices, per device (embedded): what a sharded layout "
            "would save.",
            min=0,
        ),
        Panel(
            "Host-offloaded array bytes",
            "timeseries",
            "bytes",
            [Target(top(f"jaxmon_memory_host_array_bytes{{{MEM}}} > 0"), DEVICE_LEGEND + " {{memory_kind}}")],
            "Bytes of live arrays in host memory kinds (pinned_host, unpinned_host) per device (embedded): "
            "offloaded state the allocator does not count.",
            min=0,
        ),
        Panel(
            "memory_stats() supported",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_memory_stats_supported{{{MEM}}}"))],
            "Whether the device's allocator reports statistics at all (not on CPU).",
            mappings=YES_NO_MAPPING,
        ),
        Panel(
            "memory_stats() read success",
            "state-timeline",
            "none",
            [Target(bottom(f"jaxmon_memory_read_success{{{MEM}}}"))],
            "Whether the last memory_stats() call returned (0: it raised).",
            mappings=OK_MAPPING,
        ),
        Panel(
            "memory_stats() errors",
            "timeseries",
            "short",
            [Target(top(f"increase(jaxmon_memory_read_errors_total{{{MEM}}}[$__rate_interval])"))],
            "memory_stats() calls that raised, per interval.",
            min=0,
        ),
    ],
)
