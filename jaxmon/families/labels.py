"""Each family's labels and where its number comes from, for the metrics reference (jaxmon/families/reference.py,
docs/metrics.md): plain data, one entry per family, keyed by its name without `_total`.

`(+ pod, namespace, container)` marks the families whose series may carry the owner labels: no collector writes
them; the owner transform (jaxmon.owners) adds them to every series of a device or process an owner source names,
so a family gets them where its series name a device (`source="nvml"`, `source="libtpu"`, this process's own JAX
devices where the nvml collector matched them to a GPU) or a `pid`.
"""

from __future__ import annotations

from jaxmon.families import libtpu, training

# Each family's labels and the source of its number (name without `_total`).
LABELS_AND_SOURCE: dict[str, tuple[str, str]] = {
    "jaxmon_memory_bytes_in_use": ("device, platform (+ pod, namespace, container)", "`bytes_in_use`"),
    "jaxmon_memory_peak_bytes_in_use": ("device, platform (+ pod, namespace, container)", "`peak_bytes_in_use`"),
    "jaxmon_memory_limit_bytes": ("device, platform (+ pod, namespace, container)", "`bytes_limit`"),
    "jaxmon_memory_pool_bytes": ("device, platform (+ pod, namespace, container)", "`pool_bytes`"),
    "jaxmon_memory_free_bytes": ("device, platform (+ pod, namespace, container)", "derived"),
    "jaxmon_memory_largest_free_block_bytes": (
        "device, platform (+ pod, namespace, container)",
        "`largest_free_block_bytes`",
    ),
    "jaxmon_memory_fragmentation_ratio": ("device, platform (+ pod, namespace, container)", "derived"),
    "jaxmon_memory_largest_allocatable_bytes": ("device, platform (+ pod, namespace, container)", "derived"),
    "jaxmon_memory_largest_alloc_bytes": ("device, platform (+ pod, namespace, container)", "`largest_alloc_size`"),
    "jaxmon_memory_allocations": ("device, platform (+ pod, namespace, container)", "`num_allocs`"),
    "jaxmon_memory_reserved_bytes": ("device, platform (+ pod, namespace, container)", "`bytes_reserved`"),
    "jaxmon_memory_peak_reserved_bytes": ("device, platform (+ pod, namespace, container)", "`peak_bytes_reserved`"),
    "jaxmon_memory_reservable_limit_bytes": (
        "device, platform (+ pod, namespace, container)",
        "`bytes_reservable_limit`",
    ),
    "jaxmon_memory_stats_supported": ("device, platform (+ pod, namespace, container)", "—"),
    "jaxmon_memory_read_success": ("device, platform (+ pod, namespace, container)", "—"),
    "jaxmon_memory_read_errors": ("device, platform (+ pod, namespace, container)", "—"),
    "jaxmon_memory_live_array_bytes": (
        "device, platform, workload (+ pod, namespace, container)",
        "`jax.live_arrays()`",
    ),
    "jaxmon_memory_replicated_array_bytes": (
        "device, platform, workload (+ pod, namespace, container)",
        "`jax.live_arrays()`: `sharding.is_fully_replicated` over more than one device",
    ),
    "jaxmon_memory_host_array_bytes": (
        "device, platform, memory_kind, workload (+ pod, namespace, container)",
        "`jax.live_arrays()`: `sharding.memory_kind` `pinned_host`, `unpinned_host`",
    ),
    "jaxmon_device_info": (
        "device, platform, device_kind, process_index, coords, core_on_chip, source (+ workload; + pod, namespace, "
        'container where not `source="spool"`); for '
        '`source="nvml"`: device, platform, source, uuid, pci_bus_id, name, device_match (+ pod, namespace, '
        "container)",
        "JAX device attributes; NVML",
    ),
    "jaxmon_device_up": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_device_utilization_ratio": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_device_source_up": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML; libtpu `tpu.runtime.hbm.memory.{total,usage}.bytes`",
    ),
    "jaxmon_device_memory_total_bytes": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML memory info; libtpu `tpu.runtime.hbm.memory.total.bytes`",
    ),
    "jaxmon_device_memory_used_bytes": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML memory info (v2, else v1); libtpu `tpu.runtime.hbm.memory.usage.bytes`",
    ),
    "jaxmon_device_duty_cycle_ratio": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML `utilization.gpu` / 100; libtpu `tpu.runtime.tensorcore.dutycycle.percent` / 100",
    ),
    "jaxmon_device_memory_bandwidth_utilization_ratio": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML `utilization.memory` / 100; libtpu `tpu.runtime.hbm.utilization.percent` / 100",
    ),
    "jaxmon_device_power_watts": ("device, platform, source (+ pod, namespace, container)", "NVML power usage"),
    "jaxmon_device_power_limit_watts": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML enforced power limit",
    ),
    "jaxmon_device_power_management_limit_watts": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML power management limit",
    ),
    "jaxmon_device_energy_joules": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML total energy consumption (mJ) / 1000",
    ),
    "jaxmon_device_temperature_celsius": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML temperature (GPU sensor)",
    ),
    "jaxmon_device_fan_speed_ratio": (
        "device, platform, source, fan (+ pod, namespace, container)",
        'NVML fan speed per fan (`nvmlDeviceGetNumFans`, `_FanSpeed_v2`; one fan, `fan="0"`, through '
        "`nvmlDeviceGetFanSpeed` on older drivers) / 100",
    ),
    "jaxmon_device_encoder_utilization_ratio": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML encoder utilization / 100",
    ),
    "jaxmon_device_decoder_utilization_ratio": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML decoder utilization / 100",
    ),
    "jaxmon_device_gpm_supported": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML `nvmlGpmQueryDeviceSupport`",
    ),
    "jaxmon_device_sm_active_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`",
        "NVML GPM `SM_UTIL` / 100",
    ),
    "jaxmon_device_sm_occupancy_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`",
        "NVML GPM `SM_OCCUPANCY` / 100",
    ),
    "jaxmon_device_tensor_active_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`",
        "NVML GPM `ANY_TENSOR_UTIL` / 100",
    ),
    "jaxmon_device_dram_active_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`",
        "NVML GPM `DRAM_BW_UTIL` / 100",
    ),
    "jaxmon_device_graphics_engine_active_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`",
        "NVML GPM `GRAPHICS_UTIL` / 100",
    ),
    "jaxmon_device_pipe_active_ratio": (
        "device, platform, source (+ pod, namespace, container); a MIG GPU instance's: with `mig_uuid`, "
        "`gpu_instance`, `compute_instance`, `profile`; pipe",
        "NVML GPM `FP64_UTIL` (11), `FP32_UTIL` (12), `FP16_UTIL` (13), `HMMA_TENSOR_UTIL` (7), `IMMA_TENSOR_UTIL` "
        "(9), `DFMA_TENSOR_UTIL` (6), `INTEGER_UTIL` (4) / 100",
    ),
    "jaxmon_device_graphics_clock_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML clock info (graphics)",
    ),
    "jaxmon_device_sm_clock_hertz": ("device, platform, source (+ pod, namespace, container)", "NVML clock info (SM)"),
    "jaxmon_device_memory_clock_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML clock info (memory)",
    ),
    "jaxmon_device_video_clock_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML clock info (video)",
    ),
    "jaxmon_device_graphics_clock_max_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML max clock info (graphics)",
    ),
    "jaxmon_device_sm_clock_max_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML max clock info (SM)",
    ),
    "jaxmon_device_memory_clock_max_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML max clock info (memory)",
    ),
    "jaxmon_device_video_clock_max_hertz": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML max clock info (video)",
    ),
    "jaxmon_device_throttled": (
        "device, platform, source, reason (+ pod, namespace, container)",
        "NVML clocks event reasons",
    ),
    "jaxmon_device_ecc_errors": (
        "device, platform, source, kind (+ pod, namespace, container)",
        "NVML total ECC errors",
    ),
    "jaxmon_device_remapped_rows": (
        "device, platform, source, kind (+ pod, namespace, container)",
        "NVML remapped rows",
    ),
    "jaxmon_device_row_remapping_pending": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML remapped rows (pending)",
    ),
    "jaxmon_device_row_remapping_failed": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML remapped rows (failure occurred)",
    ),
    "jaxmon_device_pcie_throughput_bytes_per_second": (
        "device, platform, source, direction (+ pod, namespace, container)",
        "NVML PCIe throughput (KB/s, taken as KiB) × 1024",
    ),
    "jaxmon_device_pcie_replays": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML PCIe replay counter",
    ),
    "jaxmon_device_nvlink_active": (
        "device, platform, source, link (+ pod, namespace, container)",
        "NVML NVLink state",
    ),
    "jaxmon_device_nvlink_data_bytes": (
        "device, platform, source, direction (+ pod, namespace, container); `link` with "
        "`--collector.nvml.nvlink-links`",
        "NVML field values `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`/`_RX` (KiB) × 1024, scope = link",
    ),
    "jaxmon_device_nvlink_errors": (
        "device, platform, source, kind (+ pod, namespace, container); `link` with `--collector.nvml.nvlink-links`",
        "NVML NVLink error counters",
    ),
    "jaxmon_device_mig_enabled": ("device, platform, source (+ pod, namespace, container)", "NVML MIG mode (current)"),
    "jaxmon_mig_device_info": (
        "device, platform, source, mig_uuid, gpu_instance, compute_instance, profile, name (+ pod, namespace, "
        "container)",
        "NVML MIG device handles, UUID, GPU and compute instance ids, name",
    ),
    "jaxmon_mig_device_memory_total_bytes": (
        "device, platform, source, mig_uuid, gpu_instance, compute_instance, profile (+ pod, namespace, container)",
        "NVML memory info of the MIG device",
    ),
    "jaxmon_mig_device_memory_used_bytes": (
        "device, platform, source, mig_uuid, gpu_instance, compute_instance, profile (+ pod, namespace, container)",
        "same",
    ),
    "jaxmon_mig_device_duty_cycle_ratio": (
        "device, platform, source, mig_uuid, gpu_instance, compute_instance, profile (+ pod, namespace, container)",
        "NVML utilization of the MIG device / 100",
    ),
    "jaxmon_device_xid_errors": ("device, platform, source, xid (+ pod, namespace, container)", "NVML event set"),
    "jaxmon_process_device_memory_bytes": (
        "device, platform, source, pid (+ workload, pod, namespace, container)",
        "NVML running compute processes",
    ),
    "jaxmon_process_device_memory_other_bytes": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML running compute processes",
    ),
    "jaxmon_process_device_memory_other_processes": (
        "device, platform, source (+ pod, namespace, container)",
        "NVML running compute processes",
    ),
    "jaxmon_process_sm_utilization_ratio": (
        "device, platform, source, pid (+ workload, pod, namespace, container)",
        "NVML per-process utilization `smUtil` / 100, mean of the samples since the last poll",
    ),
    "jaxmon_process_memory_bandwidth_utilization_ratio": (
        "device, platform, source, pid (+ workload, pod, namespace, container)",
        "NVML per-process utilization `memUtil` / 100, same",
    ),
    "jaxmon_process_encoder_utilization_ratio": (
        "device, platform, source, pid (+ workload, pod, namespace, container)",
        "NVML per-process utilization `encUtil` / 100, same",
    ),
    "jaxmon_process_decoder_utilization_ratio": (
        "device, platform, source, pid (+ workload, pod, namespace, container)",
        "NVML per-process utilization `decUtil` / 100, same",
    ),
    "jaxmon_probe_duration_seconds": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_baseline_seconds": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_flops_per_second": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_memory_bytes": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_steps": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_baseline_info": ("device, platform, origin (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_runs": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_failures": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_timeouts": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_skipped": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_deferred": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_probe_busy_seconds": ("device, platform (+ pod, namespace, container)", "probe"),
    "jaxmon_jit_compilations": (
        "workload, process_index",
        "`jax.monitoring` `/jax/core/compile/backend_compile_duration`",
    ),
    "jaxmon_jit_compile_seconds": ("workload, process_index", "same event's duration"),
    "jaxmon_compilation_cache_hits": ("workload, process_index", "`/jax/compilation_cache/cache_hits`"),
    "jaxmon_compilation_cache_misses": (
        "workload, process_index",
        "`/jax/compilation_cache/compile_requests_use_cache` − `cache_hits`",
    ),
    "jaxmon_training_steps": ("workload, process_index, process_count, host", "`jaxmon.step()`"),
    "jaxmon_training_step": ("workload, process_index, process_count, host", "`jaxmon.step(n)`"),
    "jaxmon_training_dispatched_step": ("workload, process_index, process_count, host", "`jaxmon.step(n)`"),
    "jaxmon_training_loss": ("workload, process_index, process_count, host, name", "`step(n, loss)`, waiter thread"),
    "jaxmon_training_loss_step": ("workload, process_index, process_count, host", "same"),
    "jaxmon_training_last_step_timestamp_seconds": ("workload, process_index, process_count, host", "waiter thread"),
    "jaxmon_training_step_duration_seconds": ("workload, process_index, process_count, host (+ le)", "waiter thread"),
    "jaxmon_training_examples": ("workload, process_index, process_count, host", "`step(examples=)`"),
    "jaxmon_training_tokens": ("workload, process_index, process_count, host", "`step(tokens=)`"),
    "jaxmon_training_model_flops": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "`step(model_flops=)`",
    ),
    "jaxmon_training_hardware_flops": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "`jaxmon.track()`, `compile().cost_analysis()`",
    ),
    "jaxmon_training_hardware_accessed_bytes": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "same",
    ),
    "jaxmon_training_collective_bytes": (
        "device, platform, op, axes, link, workload, process_index, process_count, host (+ pod, namespace, container)",
        "`jaxmon.track()`, the compiled HLO (`compile().as_text()`), off the training thread",
    ),
    "jaxmon_link_nominal_bandwidth_bytes_per_second": (
        "device, platform, link, workload, process_index, process_count, host (+ pod, namespace, container)",
        "nominal link table (vendor figures)",
    ),
    "jaxmon_training_program_peak_memory_bytes": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "`jaxmon.track()`, `compile().memory_analysis()`, off the training thread",
    ),
    "jaxmon_device_peak_flops_per_second": (
        "device, platform, workload, process_index, process_count, host, origin (+ pod, namespace, container)",
        "peak table",
    ),
    "jaxmon_training_model_flops_utilization_ratio": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "derived",
    ),
    "jaxmon_training_hardware_flops_utilization_ratio": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "derived",
    ),
    "jaxmon_training_host_wait_seconds": ("workload, process_index, process_count, host", "waiter thread"),
    "jaxmon_training_start_time_seconds": ("workload, process_index, process_count, host", "tracker"),
    "jaxmon_training_productive_seconds": ("workload, process_index, process_count, host", "derived"),
    "jaxmon_training_badput_seconds": (
        "workload, process_index, process_count, host, kind",
        "`badput()`, `jax.monitoring`",
    ),
    "jaxmon_training_tracking_problems": ("workload, process_index, process_count, host, reason", "tracker"),
    "jaxmon_training_profiles": ("workload, process_index, process_count, host, result", "sampled traces"),
    "jaxmon_training_profiled_seconds": (
        "device, platform, workload, process_index, process_count, host (+ pod, namespace, container)",
        "sampled traces (`jax.profiler`), the tracker's step intervals",
    ),
    "jaxmon_training_profile_seconds": (
        "device, platform, workload, process_index, process_count, host, part (+ pod, namespace, container)",
        "sampled traces: union of the device's op intervals",
    ),
    "jaxmon_training_profile_collective_seconds": (
        "device, platform, workload, process_index, process_count, host, op, axes, link (+ pod, namespace, container)",
        "sampled traces: union of each collective instruction's intervals, by its place (compiled HLO)",
    ),
    "jaxmon_training_profile_exposed_collective_seconds": (
        "device, platform, workload, process_index, process_count, host, op, axes, link (+ pod, namespace, container)",
        "sampled traces: each collective's time with no compute running",
    ),
    "jaxmon_training_profile_collective_bytes": (
        "device, platform, workload, process_index, process_count, host, op, axes, link (+ pod, namespace, container)",
        "sampled traces' events x the compiled HLO's bytes per execution",
    ),
    "jaxmon_training_profile_copy_seconds": (
        "device, platform, workload, process_index, process_count, host, direction (+ pod, namespace, container)",
        "sampled traces: the copy part by each copy event's direction",
    ),
    "jaxmon_training_profile_copy_bytes": (
        "device, platform, workload, process_index, process_count, host, direction (+ pod, namespace, container)",
        "sampled traces: GPU memcpy events' sizes",
    ),
    "jaxmon_workload_info": (
        "workload, process_index, host, pid, jax_version (+ pod, namespace, node, slurm_job_id where set)",
        "spool; the process",
    ),
    "jaxmon_workload_last_report_timestamp_seconds": ("workload, process_index", "spool"),
    "jaxmon_spool_rejected_files": ("reason", "spool"),
    "jaxmon_spool_overflow_files": ("reason", "spool"),
    "jaxmon_spool_removed_files": ("kind", "spool"),
    "jaxmon_spool_stale_files": ("—", "spool"),
    **libtpu.LIBTPU_LABELS_AND_SOURCE,
    "jaxmon_kubernetes_pod_device_info": (
        "namespace, pod, container, resource, device_id (+ claim: DRA)",
        "kubelet pod-resources `List` (`devices`, `dynamic_resources`)",
    ),
    "jaxmon_kubernetes_api_up": ("list", "API server `GET` of the node's resourceslices, pods"),
    "jaxmon_kubernetes_api_failures": ("list, reason", "API server `GET` of the node's resourceslices, pods"),
    "jaxmon_kubernetes_api_last_success_timestamp_seconds": (
        "list",
        "API server `GET` of the node's resourceslices, pods",
    ),
    "jaxmon_kubernetes_dra_problems": ("reason", "kubelet `dynamic_resources` against the node's ResourceSlices"),
    "jaxmon_kubernetes_process_problems": (
        "reason",
        "NVML compute processes' `/proc/<pid>/cgroup` against the API server's pods on the node",
    ),
    "jaxmon_slurm_job_device_info": (
        "job_id, uid, device, uuid",
        "NVML compute processes' `/proc/<pid>/cgroup` (Slurm's job cgroups)",
    ),
    "jaxmon_backend_up": ("backend", "JAX"),
    "jaxmon_collector_success": ("collector", "—"),
    "jaxmon_collector_duration_seconds": ("collector", "—"),
    "jaxmon_collector_last_success_timestamp_seconds": ("collector", "—"),
    "jaxmon_build_info": ("version, jax_version, jaxlib_version, python_version", "package metadata"),
    "jaxmon_exporter_stopping": ("—", "`jaxmon.stop()`, the `Exporter`'s `stop()`, the interpreter's exit"),
} | training.WAIT_LABELS_AND_SOURCE
