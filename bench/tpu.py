"""TPU facts for jaxmon, in one process that holds the chip (bench/tpu.sh runs it; see there for the files).

    python bench/tpu.py OUT_DIR [--dry-run]

On a TPU it records, beside each other, what jaxmon reports and the truth it must match; with --dry-run (or where JAX
sees no TPU) it runs the same stages with small sizes on whatever devices JAX has (CPU here), so the script is
tested before it spends TPU time. It uses no socket (the TPU machine refuses them all): the embedded exporter's
exposition is rendered in-process, and libtpu's monitoring SDK is read by jaxmon's own SDK child process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 100  # jaxmon's HFU window (TrackerConfig.window's default)
sys.path.insert(0, str(ROOT))
T0 = time.monotonic()


def log(out: Path, text: str) -> None:
    line = f"[tpu.py +{time.monotonic() - T0:.0f}s] {text}"
    print(line, flush=True)
    with open(out / "run.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")


def dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")


def environment(jax: Any) -> dict[str, Any]:
    """The machine, the versions, the devices."""
    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [repr(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
    }
    import jaxlib

    env["jaxlib"] = jaxlib.__version__
    from importlib import metadata

    for dist in ("libtpu", "libtpu-nightly", "tpu-info", "jaxmon", "prometheus-client", "grpcio"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    env["jaxmon_revision"] = os.environ.get("BENCH_REVISION", "")
    return env


def device_record(d: Any, stats: list[Any]) -> dict[str, Any]:
    """One device of a replay file (docs/replay.md), its memory_stats() one per stage."""
    rec: dict[str, Any] = {"id": d.id, "platform": d.platform, "device_kind": d.device_kind}
    rec["process_index"] = d.process_index
    if d.platform == "tpu":
        rec["coords"] = list(getattr(d, "coords", []))
        rec["core_on_chip"] = getattr(d, "core_on_chip", 0)
    rec["memory_stats"] = stats if any(s is not None for s in stats) else None
    return rec


def memory_stages(out: Path, jax: Any, jnp: Any, dry: bool) -> None:
    """memory_stats() of every local device at five stages, as a replay file ready for tests/fixtures."""
    devs = jax.local_devices()
    stages: list[str] = []
    stats: list[list[Any]] = [[] for _ in devs]
    notes: dict[str, Any] = {}

    def record(stage: str) -> None:
        for i, d in enumerate(devs):
            s = d.memory_stats()
            stats[i].append(None if s is None else {k: int(v) for k, v in s.items()})
        stages.append(stage)
        s0 = stats[0][-1]
        log(out, f"memory {stage}: {s0}")

    record("fresh")
    n = 1 << (20 if dry else 24)  # 4 MiB or 64 MiB of float32 per array
    arrays = [jnp.full((n,), float(i), jnp.float32, device=devs[0]) for i in range(8)]
    jax.block_until_ready(arrays)
    record("after_arrays")
    del arrays[::2]
    gc.collect()
    record("after_freeing_every_other")
    size = 2048 if dry else 14336  # the outer product: size^2 float32 temporaries (805 MiB on the chip)

    # A program whose temporaries are size^2 floats (805 MiB on the chip): the first of these whose compiled
    # memory_analysis() says so (XLA fuses a product into its consumer where it can, leaving no temporary).
    candidates = {
        "product_matmul": lambda x: ((x[:, None] * x[None, :]) @ (x[:, None] * x[None, :]))[0],
        "product_cumsum": lambda x: jnp.cumsum(x[:, None] * x[None, :], axis=0)[-1],
        "product_sort": lambda x: jnp.sort((x[:, None] * x[None, :]).ravel())[: x.shape[0]],
    }
    x = jnp.arange(size, dtype=jnp.float32) / size
    compiled = None
    for name, fn in candidates.items():
        compiled = jax.jit(fn).lower(x).compile()
        temp = getattr(compiled.memory_analysis(), "temp_size_in_bytes", 0) or 0
        notes.setdefault("temp_by_program", {})[name] = temp
        if temp >= size * size * 4:
            notes["program"] = name
            break
    assert compiled is not None
    analysis = compiled.memory_analysis()
    if analysis is not None:
        notes["large_temp_program"] = {
            k: getattr(analysis, k, None)
            for k in (
                "temp_size_in_bytes",
                "argument_size_in_bytes",
                "output_size_in_bytes",
                "generated_code_size_in_bytes",
                "peak_memory_in_bytes",
            )
        }
    y = compiled(x)
    y.block_until_ready()
    record("after_large_temp_program")
    del y, x, compiled, arrays
    gc.collect()
    jax.clear_caches()
    record("after_freeing_everything")
    replay = {"devices": [device_record(d, s) for d, s in zip(devs, stats, strict=True)]}
    dump(out / "replay-stages.json", replay)
    dump(out / "replay-stages.meta.json", {"stages": stages, "notes": notes, "array_bytes": n * 4})
    # Each stage alone too (a fixture of one shape): the first device's dict.
    for i, stage in enumerate(stages):
        one = {"devices": [device_record(devs[0], [stats[0][i]])]}
        if one["devices"][0]["memory_stats"] is not None:
            one["devices"][0]["memory_stats"] = stats[0][i]
        dump(out / f"replay-{stage}.json", one)
    try:
        from jaxmon.sources.replay import load_replay

        load_replay(out / "replay-stages.json")
        log(out, "replay-stages.json loads as a replay file")
    except Exception as exc:  # a bench records what failed and goes on
        log(out, f"replay-stages.json does not load as a replay file: {exc!r}")


class SdkWatch:
    """jaxmon's SDK child (the daemon's reader) polled on a thread while the loop runs: what it reads, how fast."""

    def __init__(self, out: Path) -> None:
        from jaxmon.sources.libtpu import sdk

        self.sdk = sdk
        self.out = out
        self.child = sdk.SdkChild(timeout=5.0, start_timeout=120.0)
        self.readings: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="sdk-watch", daemon=True)
        self.t_start = time.monotonic()

    def read(self, label: str) -> None:
        supported = sorted(self.readings[-1]["supported"]) if self.readings else []
        names = supported or [self.sdk.TENSORCORE_UTIL, *self.sdk.PER_CHIP]
        t = time.monotonic()
        r = self.child.read(names)
        rec = {
            "label": label,
            "at_s": round(t - self.t_start, 3),
            "read_ms": round((time.monotonic() - t) * 1e3, 3),
            "status": r.status,
            "detail": r.detail,
            "data": {k: list(v) for k, v in r.data.items()},
            "errors": dict(r.errors),
            "supported": sorted(r.supported),
            "version": r.version,
            "child_starts": self.child.starts,
            "child": self.child_status(),
        }
        self.readings.append(rec)

    def child_status(self) -> dict[str, str]:
        proc = getattr(self.child, "_proc", None)
        if proc is None:
            return {}
        try:
            lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        except OSError:
            return {}
        keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads")
        out = {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines) if k in keys}
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out["cpu_seconds"] = str((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, IndexError, ValueError):
            pass
        return out

    def run(self) -> None:
        while not self.stop.wait(1.0):
            self.read("during the loop")

    def __enter__(self) -> SdkWatch:
        self.read("before the loop")
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.read("after the loop")
        self.child.close()
        first_answer = next((r["at_s"] for r in self.readings if r["status"] != "starting"), None)
        summary = {
            "statuses": sorted({r["status"] for r in self.readings}),
            "first_answer_s": first_answer,
            "reads": len(self.readings),
            "read_ms_after_start": sorted(r["read_ms"] for r in self.readings if r["status"] not in ("starting",)),
            "any_data": sorted({k for r in self.readings for k, v in r["data"].items() if v}),
        }
        dump(self.out / "sdk.json", {"summary": summary, "readings": self.readings})
        log(
            self.out,
            f"SDK child: {summary['statuses']}, first answer after {first_answer} s, data for {summary['any_data']}",
        )


def mlp(jax: Any, jnp: Any, batch: int, width: int, layers: int) -> tuple[Any, list[Any], Any]:
    """The bf16 MLP step the TPU runs use (value_and_grad + SGD, params donated), jitted, with its params and batch."""

    def loss(params: list[Any], x: Any) -> Any:
        h = x
        for w in params:
            h = jnp.maximum(h @ w, 0)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    def step(params: list[Any], x: Any) -> tuple[list[Any], Any]:
        value, grads = jax.value_and_grad(loss)(params, x)
        return [w - 1e-4 * g.astype(w.dtype) for w, g in zip(params, grads, strict=True)], value

    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(key, (width, width), jnp.bfloat16) * 0.01 for _ in range(layers)]
    x = jax.random.normal(key, (batch, width), jnp.bfloat16)
    return jax.jit(step, donate_argnums=0), params, x


def tracked_loop(out: Path, jax: Any, jnp: Any, dry: bool, steps: int, every: int = 40, name: str = "") -> None:
    """The embedded exporter around a tracked bf16 MLP loop, its exposition rendered in-process beside the truth
    (sampled traces every `every` steps; 0: none, a plain loop). Files are suffixed `name`."""
    import jaxmon
    from jaxmon.exposition import Exposition

    batch, width, layers = (256, 256, 4) if dry else (8192, 4096, 4)
    # On CPU (a dry run) jaxmon knows no peak: the dry run gives it one, and the loop's truth uses the same.
    dry_peak = 1e11
    training: dict[str, Any] = {"profile": {"every": every, "steps": 2, "min_seconds": 0}}
    if dry:
        training["peak_flops"] = dry_peak
    exporter = jaxmon.start(workload="tpu-bench", collector={"training": training})
    rt = exporter.runtime

    jitted, params, x = mlp(jax, jnp, batch, width, layers)
    compiled = jitted.lower(params, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops = float(cost.get("flops", 0.0)) if cost else 0.0
    analysis = compiled.memory_analysis()
    tracked = jaxmon.track(jitted)
    params, value = tracked(params, x)  # warm
    value.block_until_ready()
    sdk_watch = SdkWatch(out)
    sdk_watch.__enter__()
    pending: list[Any] = []
    done: list[float] = []  # the loop's own completions, as its waits two steps behind see them
    t0 = time.perf_counter()
    try:
        for n in range(1, steps + 1):
            params, value = tracked(params, x)
            jaxmon.step(n, value, examples=batch, model_flops=flops)
            pending.append(value)
            if len(pending) > 2:
                pending.pop(0).block_until_ready()  # two steps in flight, as a real loop
                done.append(time.perf_counter())
        for v in pending:
            v.block_until_ready()
            done.append(time.perf_counter())
        wall = time.perf_counter() - t0
    finally:
        sdk_watch.__exit__()
    time.sleep(3.0)  # the waiter books the last steps; the collectors poll
    dev = jax.devices()[0]
    from jaxmon.catalog import hardware as peaks

    peak = dry_peak if dry else peaks.device_peak(dev.device_kind, None)
    truth = {
        "steps": steps,
        "wall_seconds": wall,
        "step_seconds_mean": wall / steps,
        "xla_flops_per_step": flops,
        "peak_flops_per_second": peak,
        "hfu_loop": (flops / (wall / steps) / peak) if peak and flops else None,
        # jaxmon's HFU is over its window (the last 100 steps, TrackerConfig.window): the loop's over the same steps
        # (a chip's step time drifts by a few percent over a run: 16.5 to 17.3 ms on 2026-12-07)
        "hfu_loop_window": (flops * WINDOW / (done[-1] - done[-1 - WINDOW]) / peak)
        if peak and flops and len(done) > WINDOW
        else None,
        "profile_every": every,
        "memory_analysis": {
            k: getattr(analysis, k, None)
            for k in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "peak_memory_in_bytes")
        }
        if analysis is not None
        else None,
        "memory_stats_after": dev.memory_stats(),
        "shape": {"batch": batch, "width": width, "layers": layers, "dtype": "bfloat16"},
    }
    # A series is held at 0 in the first exposition that has it (jaxmon.births): a first render, a poll, and the
    # second render reads the figures.
    Exposition(rt.snapshot, rt.collectors, rt.transform).render(False)
    time.sleep(6.0)  # the default poll interval (5 s) and a second
    text = Exposition(rt.snapshot, rt.collectors, rt.transform).render(False)
    body = text.decode() if isinstance(text, bytes) else str(text)
    (out / f"embedded-after-loop{name}.prom").write_text(body, encoding="utf-8")
    dump(out / f"truth{name}.json", truth)
    dump(out / f"compare{name}.json", compare(body, truth))
    log(out, f"loop{name}: {steps} steps, {truth['step_seconds_mean'] * 1e3:.3f} ms a step, HFU {truth['hfu_loop']}")
    if not every:
        exporter.stop()
        return
    # One trace of 3 steps, and jaxmon's split of it.
    trace_dir = out / "trace"
    with jax.profiler.trace(str(trace_dir)):
        for n in range(steps + 1, steps + 4):
            params, value = tracked(params, x)
            jaxmon.step(n, value, examples=batch, model_flops=flops)
        value.block_until_ready()
    exporter.stop()
    found = sorted(trace_dir.rglob("*.xplane.pb"))
    if found:
        data = found[0].read_bytes()
        (out / "trace-3steps.xplane.pb").write_bytes(data)
        from jaxmon.xla.profile import read

        split = {f"{p}:{i}": vars(s) for (p, i), s in read(data).split().items()}
        dump(out / "trace-split.json", split)
        shutil.rmtree(trace_dir, ignore_errors=True)
        log(out, f"trace: {len(data)} bytes, split {split}")
    else:
        log(out, "trace: no .xplane.pb written")


def compare(body: str, truth: dict[str, Any]) -> dict[str, Any]:
    """jaxmon's figures from the exposition beside the loop's own."""
    from prometheus_client.parser import text_string_to_metric_families

    got: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            got.setdefault(s.name, []).append((dict(s.labels), s.value))

    def first(name: str, **labels: str) -> float | None:
        for lbls, value in got.get(name, []):
            if all(lbls.get(k) == v for k, v in labels.items()):
                return value
        return None

    parts = {
        lbls["part"]: v for lbls, v in got.get("jaxmon_training_profile_seconds_total", []) if lbls.get("device") == "0"
    }
    ma = truth.get("memory_analysis") or {}
    ms = truth.get("memory_stats_after") or {}
    return {
        "hfu": {
            "jaxmon": first("jaxmon_training_hardware_flops_utilization_ratio", device="0"),
            "loop": truth["hfu_loop"],
            "loop_window": truth["hfu_loop_window"],
        },
        "step_seconds": {
            "jaxmon_sum_over_count": _ratio(
                first("jaxmon_training_step_duration_seconds_sum"), first("jaxmon_training_step_duration_seconds_count")
            ),
            "loop_mean": truth["step_seconds_mean"],
        },
        "sampled_split": {
            "parts": parts,
            "profiled_seconds": first("jaxmon_training_profiled_seconds_total", device="0"),
            "profiles": {lbls.get("result", ""): v for lbls, v in got.get("jaxmon_training_profiles_total", [])},
        },
        "predicted_peak": {
            "jaxmon": first("jaxmon_training_program_peak_memory_bytes", device="0"),
            "memory_analysis": ma.get("peak_memory_in_bytes"),
        },
        "memory": {
            name: {"jaxmon": first(f"jaxmon_memory_{name}", device="0"), "memory_stats": ms.get(key)}
            for name, key in (
                ("bytes_in_use", "bytes_in_use"),
                ("limit_bytes", "bytes_limit"),
                ("reserved_bytes", "bytes_reserved"),
                ("peak_reserved_bytes", "peak_bytes_reserved"),
                ("reservable_limit_bytes", "bytes_reservable_limit"),
                ("largest_free_block_bytes", "largest_free_block_bytes"),
                ("free_bytes", None),
            )
        },
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="small sizes on whatever devices JAX has (CPU here)")
    ap.add_argument("--steps", type=int, default=0, help="tracked loop steps (default 900 on TPU, 200 dry)")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    import jax
    import jax.numpy as jnp

    dry = args.dry_run or jax.default_backend() != "tpu"
    env = environment(jax)
    env["dry_run"] = dry
    dump(out / "env.json", env)
    log(out, f"devices {env['devices']}, dry run {dry}")
    memory_stages(out, jax, jnp, dry)
    steps = args.steps or (200 if dry else 900)
    tracked_loop(out, jax, jnp, dry, steps, every=0, name="-plain")  # HFU and step time against a plain loop's
    tracked_loop(out, jax, jnp, dry, steps)
    log(out, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
