"""What jaxmon costs a training loop per step, at its defaults: throughput side by side, its threads' CPU, its RSS.

    .venv/bin/python bench/step_cost.py                          # three step lengths on one XLA:CPU device
    .venv/bin/python bench/step_cost.py --sizes 1,0.3 --alternations 5 --out results.json
    .venv/bin/python bench/step_cost.py --platform tpu --sizes 16,1,0.36 --out /tmp/step_cost.json   # a TPU host
    .venv/bin/python bench/step_cost.py --against DIR            # beside another tree's jaxmon/, in turn
    .venv/bin/python bench/step_cost.py --tree DIR               # another tree's jaxmon/ (DIR: `git archive REV
                                                                 #   jaxmon | tar -x -C DIR`), for a before/after
    .venv/bin/python bench/step_cost.py --rss-steps 1000000      # also RSS over a long no-device run
    .venv/bin/python bench/step_cost.py --sizes "" --paced-steps 2000   # step()'s median in a loop paced at 2 ms

Each figure comes from child processes, alternated: the plain loop, then the same loop with jaxmon at its defaults
(`jaxmon.start(port)`, `jaxmon.track(jitted step)`, `jaxmon.step(n, loss, examples=, tokens=, model_flops=)`), in
the order plain, jaxmon, jaxmon, plain, ... so that a drift of the machine's load falls on both. The loop is the
docs' loop: a jitted step donating its state, returning the state and a loss, and waiting for the step before last
(two in flight). The step is a chain of `k` tanh(state @ w) updates of a D x D state, `k` calibrated once per step
length (in a child of its own) so that the plain loop's step takes about the length asked.

- `ratio`: the plain loop's steps/s over jaxmon's, per alternation; its median is the throughput lost (1.02 = 2 %).
- `thread_cpu_us`: the CPU time jaxmon's own threads (every Python thread named `jaxmon-*`, from
  /proc/self/task/TID/schedstat, or the thread's CPU clock where that reads 0) took over the measured steps, per
  step; `step_us` the training thread's time in `jaxmon.step()` (time.perf_counter_ns around it: wall time), per
  step; `track_us` what the tracked call took beyond the plain loop's raw call (each loop's own mean; noisy: a
  difference of two means of tens of microseconds). `main_cpu_us` the training thread's CPU a step beyond the plain
  loop's, by its own CPU clock (a median of the pairs' differences), and `cpu_total_us` it with jaxmon's threads:
  jaxmon's host CPU a step as the issue counts it. `total_us` is the first three together: all of jaxmon's host time
  per step.
- `--parts`: which parts the jaxmon child uses beside `jaxmon.start()` (`track`, `step`; several sets alternated in
  turn: `--parts "/track/step/track,step"` measures start() alone, each part, and both; `noop` and `thin` in place
  of `step` and `track` are their floors, a Python function of step()'s signature that does nothing and a Python
  wrapper that only calls the step, so that `step_us` and `track_us` say what any Python call there costs, at the
  same point of the same loop); `--profile`: one more
  jaxmon child per size under cProfile, its training thread's costliest functions.
- `paced`: step()'s own wall time (median, p90) in a loop paced at one step every 2 ms, a ready loss and three
  figures (the waiter idle between steps).
- `rss`: a loop of `--rss-steps` steps with no device work (`jaxmon.step(n, ready, examples=...)` on one computed
  array) and the process's RSS every tenth of them: flat means the step path keeps nothing per step.

Output: JSON at `--out` (default bench/results/step_cost.json). No socket is needed: where `jaxmon.start()` cannot
bind it logs so and goes on (a TPU host with no network).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WARM_SECONDS = 5.0  # each child's loop runs this long before its measured steps
D = 128  # the state's side: one tanh(state @ w) update is 2 D^3 FLOPs


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--platform", default="cpu", help="JAX platform of the one device the loop runs on")
    ap.add_argument("--sizes", default="10,1,0.3", help="plain step lengths to measure, in ms, comma-separated")
    ap.add_argument("--alternations", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured loop time per child")
    ap.add_argument("--rss-steps", type=int, default=0, help="steps of the no-device RSS run (0: none)")
    ap.add_argument("--paced-steps", type=int, default=0, help="steps of the paced step() timing, one every 2 ms")
    ap.add_argument("--tree", help="a directory holding another tree's jaxmon/ package, measured instead of this one")
    ap.add_argument(
        "--against",
        help="a directory holding another tree's jaxmon/ package, measured beside this one: each alternation runs "
        "the plain loop, this tree's and that tree's jaxmon child, in turn",
    )
    ap.add_argument("--port", type=int, default=0, help="jaxmon.start()'s port (0: any free one)")
    ap.add_argument("--out", help="where the JSON goes (default bench/results/step_cost.json)")
    ap.add_argument(
        "--parts",
        default="track,step",
        help="what the jaxmon child uses beside jaxmon.start(), comma-separated: track, step (none: start() alone); "
        "several sets separated by '/' are each alternated with the plain loop, e.g. '/track/step/track,step'",
    )
    ap.add_argument("--profile", action="store_true", help="also one jaxmon child per size under cProfile (its "
                    "training thread's 25 costliest functions, by own time)")  # fmt: skip
    ap.add_argument("--child", help=argparse.SUPPRESS)  # plain | jaxmon | calibrate | rss
    ap.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=1000, help=argparse.SUPPRESS)
    ap.add_argument("--target", type=float, default=1.0, help=argparse.SUPPRESS)
    return ap.parse_args()


# -- the children --------------------------------------------------------------------------------------------


def jaxmon_threads() -> dict[int, str]:
    """The native ids of jaxmon's own Python threads."""
    return {t.native_id: t.name for t in threading.enumerate() if t.name.startswith("jaxmon") and t.native_id}


def thread_ns(tids: dict[int, str]) -> dict[str, int]:
    """CPU nanoseconds each of the threads `tids` ran, by name (a thread that ended since counts nothing more): from
    /proc/self/task/TID/schedstat, or the thread's CPU-time clock where the kernel has no schedstat (gVisor reads
    0 there)."""
    out: dict[str, int] = {}
    idents = {t.native_id: t.ident for t in threading.enumerate()}
    for tid, name in tids.items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[name] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        if not out.get(name) and (ident := idents.get(tid)) is not None:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                out[name] = time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    return out


def waiter_looks(jaxmon: Any) -> int:
    """The looks jaxmon's waiter took so far (0 without jaxmon or a tracker)."""
    tracker = jaxmon.training.current() if jaxmon is not None else None
    return tracker.waiter.looks if tracker is not None else 0


def make_step(k: int) -> Any:
    import jax
    import jax.numpy as jnp

    def step(state: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        state = jax.lax.fori_loop(0, k, lambda _, s: s - 1e-3 * jnp.tanh(s @ w), state)
        return state, jnp.mean(state * state)

    return jax.jit(step, donate_argnums=0)


def loop(args: argparse.Namespace, with_jaxmon: bool, profile: bool = False) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    device = jax.devices(args.platform)[0]
    jaxmon: Any = None
    if with_jaxmon:
        import jaxmon

        exporter = jaxmon.start(args.port, workload="bench")
    fn = make_step(args.k)
    parts = set(filter(None, args.parts.split(","))) if with_jaxmon else set()
    step_fn = jaxmon.track(fn) if "track" in parts else thin(fn) if "thin" in parts else fn
    stepping = "step" in parts or "noop" in parts
    step_call = jaxmon.step if "step" in parts else noop
    profiler = None
    state = jax.device_put(jnp.eye(D, dtype=jnp.float32), device)
    w = jax.device_put(jnp.full((D, D), 1.0 / D, dtype=jnp.float32), device)
    flops = 2.0 * D**3 * args.k
    warm = max(args.steps // 10, 20)
    losses: list[Any] = []
    call_ns = step_ns = looks0 = main0 = 0
    mine: dict[int, str] = {}
    cpu0: dict[str, int] = {}
    start = 0.0
    clock = time.perf_counter_ns  # thread_time_ns ticks in 10 ms on some hosts (a TPU VM's gVisor)
    # Steady state: the measured steps start after `warm` steps and WARM_SECONDS, past jaxmon's start-up work (the
    # probe's calibration, the first programs' analysis, the first sampled trace at step 1000).
    began, n, measured = time.perf_counter(), 0, -1
    while measured < args.steps:
        if measured < 0 and n >= warm and time.perf_counter() - began >= WARM_SECONDS:
            warm, measured = n, 0
            mine = jaxmon_threads()
            cpu0, start, call_ns, step_ns = thread_ns(mine), time.perf_counter(), 0, 0
            main0 = time.thread_time_ns()
            looks0 = waiter_looks(jaxmon)
            if profile:
                here, saved = Path(__file__).resolve().parent, sys.path[:]
                sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]  # bench/profile.py is not
                import cProfile  # the standard library's profile, which cProfile imports

                sys.path[:] = saved
                profiler = cProfile.Profile()
                profiler.enable()
        t0 = clock()
        state, loss = step_fn(state, w)
        t1 = clock()
        if stepping:
            step_call(n, loss, examples=32, tokens=32 * 512, model_flops=flops)
            step_ns += clock() - t1
        call_ns += t1 - t0
        losses.append(loss)
        if len(losses) > 2:
            losses.pop(0).block_until_ready()  # the step before last
        n += 1
        if measured >= 0:
            measured += 1
    for x in losses:
        x.block_until_ready()
    elapsed = time.perf_counter() - start
    main_ns = time.thread_time_ns() - main0
    out: dict[str, Any] = {"steps_per_s": args.steps / elapsed, "step_ms": elapsed / args.steps * 1e3}
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        out["profile"] = text.getvalue().splitlines()
    out["call_us"] = call_ns / args.steps / 1e3
    out["main_cpu_us"] = main_ns / args.steps / 1e3  # the training thread's CPU a step, whatever it did
    if with_jaxmon:
        cpu1 = thread_ns(mine)
        per = {name: (ns - cpu0.get(name, 0)) / args.steps / 1e3 for name, ns in cpu1.items()}
        out["thread_cpu_us"] = sum(per.values())
        out["thread_cpu_us_by_thread"] = per
        out["step_us"] = step_ns / args.steps / 1e3
        tracker = jaxmon.training.current()
        if tracker is not None:  # the waiter's looks over the measured steps, and its look interval at their end
            out["looks"] = waiter_looks(jaxmon) - looks0
            out["look_every_s"] = tracker.waiter.every
        out["threads"] = sorted(mine.values())
        out["jaxmon"] = jaxmon.__file__
        from jaxmon import training

        tracker = training.current()
        deadline = time.monotonic() + 30
        while tracker is not None and time.monotonic() < deadline:
            reading = tracker.reading()
            if reading is not None and reading.steps_total >= warm + args.steps:
                break
            time.sleep(0.01)
        reading = tracker.reading() if tracker is not None else None
        out["booked"] = reading.steps_total if reading is not None else None
        out["problems"] = dict(reading.problems) if reading is not None else None
        exporter.stop()
    return out


def noop(n: Any, *ready: Any, examples: Any = None, tokens: Any = None, model_flops: Any = None) -> None:
    """The floor of `jaxmon.step()`: a Python function of its signature that does nothing (part `noop`)."""


def thin(fn: Any) -> Any:
    """The floor of `jaxmon.track()`: a Python wrapper that only calls `fn` (part `thin`)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


def calibrate(args: argparse.Namespace) -> dict[str, Any]:
    """The plain step's milliseconds for k = 1, 2, 4, ... (the loop as measured, two in flight)."""
    import jax
    import jax.numpy as jnp

    device = jax.devices(args.platform)[0]
    times: dict[int, float] = {}
    k = 1
    while True:
        fn = make_step(k)
        state = jax.device_put(jnp.eye(D, dtype=jnp.float32), device)
        w = jax.device_put(jnp.full((D, D), 1.0 / D, dtype=jnp.float32), device)
        state, _ = fn(state, w)
        state.block_until_ready()
        runs = min(max(int(100 / max(times.get(k // 2, 0.05), 0.05)), 20), 2000)  # about 0.1 s
        best = float("inf")
        for _ in range(3):  # the least of three: the machine's other load only ever adds
            losses: list[Any] = []
            t0 = time.perf_counter()
            for _ in range(runs):
                state, loss = fn(state, w)
                losses.append(loss)
                if len(losses) > 2:
                    losses.pop(0).block_until_ready()
            state.block_until_ready()
            best = min(best, (time.perf_counter() - t0) / runs * 1e3)
        times[k] = best
        if times[k] > args.target or k >= 1 << 16:  # the longest length asked, in ms
            return {"ms": {str(key): value for key, value in times.items()}}
        k *= 2


def rss(args: argparse.Namespace) -> dict[str, Any]:
    """RSS over a long run of steps with no device work: the step path must keep nothing per step."""
    import jax.numpy as jnp

    import jaxmon

    exporter = jaxmon.start(args.port, workload="bench")
    ready = jnp.ones(())
    ready.block_until_ready()
    samples = []
    tenth = max(args.steps // 10, 1)
    t0 = time.perf_counter()
    for n in range(args.steps):
        jaxmon.step(n, ready, examples=32, tokens=32 * 512, model_flops=1e9)
        if n % tenth == 0 or n == args.steps - 1:
            samples.append((n, rss_kib()))
    elapsed = time.perf_counter() - t0
    exporter.stop()
    return {"steps": args.steps, "seconds": elapsed, "rss_kib": samples}


def paced(args: argparse.Namespace) -> dict[str, Any]:
    """step()'s own wall time on the training thread in a loop paced at one step every 2 ms (the waiter idle between
    steps, as on a loop of 2 ms steps), with a ready loss and three figures: the median and p90 of the calls."""
    import jax
    import jax.numpy as jnp

    import jaxmon

    exporter = jaxmon.start(args.port, workload="bench")
    fn = jaxmon.track(make_step(1))
    device = jax.devices(args.platform)[0]
    state = jax.device_put(jnp.eye(D, dtype=jnp.float32), device)
    w = jax.device_put(jnp.full((D, D), 1.0 / D, dtype=jnp.float32), device)
    calls, losses = [], []
    tick = time.perf_counter()
    for n in range(args.steps):
        state, loss = fn(state, w)
        t0 = time.perf_counter()
        jaxmon.step(n, loss, examples=32, tokens=32 * 512, model_flops=1e9)
        calls.append((time.perf_counter() - t0) * 1e6)
        losses.append(loss)
        if len(losses) > 2:
            losses.pop(0).block_until_ready()
        tick += 0.002
        time.sleep(max(tick - time.perf_counter(), 0.0))
    exporter.stop()
    calls = calls[len(calls) // 10 :]
    ordered = sorted(calls)
    return {"steps": len(calls), "median_us": statistics.median(calls), "p90_us": ordered[int(0.9 * len(ordered))]}


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# -- the parent ----------------------------------------------------------------------------------------------


def child(args: argparse.Namespace, kind: str, tree: str | None = None, **extra: Any) -> dict[str, Any]:
    """A child process running `kind`, with this tree's jaxmon (or `tree`'s, else `args.tree`'s)."""
    tree = tree or args.tree
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--platform", args.platform]
    argv += ["--port", str(args.port)]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if args.platform == "cpu":
        env["JAX_NUM_CPU_DEVICES"] = "1"
        # The device's work on one thread of its own: the loop's host thread and jaxmon's share the other core.
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    path = [str(Path(tree).resolve())] if tree else [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tree or ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the {kind} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def pick_k(ms: dict[str, float], target: float) -> int:
    """The k whose step is nearest `target` ms, interpolated between the powers of two measured (linear in k)."""
    points = sorted((int(k), v) for k, v in ms.items())
    for (k0, v0), (k1, v1) in itertools.pairwise(points):
        if v0 <= target <= v1:
            return max(1, round(k0 + (target - v0) * (k1 - k0) / max(v1 - v0, 1e-9)))
    return points[0][0] if target < points[0][1] else points[-1][0]


def main() -> None:
    args = parse()
    if args.child:
        run = {"plain": lambda: loop(args, False), "jaxmon": lambda: loop(args, True)}
        run["profile"] = lambda: loop(args, True, profile=True)
        run |= {"calibrate": lambda: calibrate(args), "rss": lambda: rss(args), "paced": lambda: paced(args)}
        print(json.dumps(run[args.child]()))
        return
    sizes = [float(s) for s in args.sizes.split(",") if s]
    started = time.time()
    cal = child(args, "calibrate", target=max(sizes)) if sizes else {"ms": {}}
    result: dict[str, Any] = {
        "benchmark": "step_cost",
        "platform": args.platform,
        "tree": str(Path(args.tree).resolve()) if args.tree else "this",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "calibration_ms": cal["ms"],
        "sizes": {},
    }
    sets = args.parts.split("/")
    for size in sizes:
        k = pick_k(cal["ms"], size)
        steps = max(200, int(args.seconds * 1e3 / size))
        for parts in sets:
            rows = []
            kinds = ["plain", "jaxmon", "against"] if args.against else ["plain", "jaxmon"]
            for i in range(args.alternations):
                order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]  # each first in turn: a drift falls on all
                got = {
                    kind: child(args, "jaxmon" if kind == "against" else kind, tree=args.against if kind == "against"
                                else None, k=k, steps=steps, parts=parts)
                    for kind in order
                }  # fmt: skip
                rows.append({"ratio": got["plain"]["steps_per_s"] / got["jaxmon"]["steps_per_s"], **got})
                if args.against:
                    rows[-1]["against_ratio"] = got["plain"]["steps_per_s"] / got["against"]["steps_per_s"]
                said = "".join(f", against {r:.4f}" for r in [rows[-1].get("against_ratio")] if r is not None)
                print(f"{size} ms (k={k}) [{parts}] #{i}: ratio {rows[-1]['ratio']:.4f}{said}", file=sys.stderr,
                      flush=True)  # fmt: skip
            jm = [r["jaxmon"] for r in rows]
            track = statistics.median(r["jaxmon"]["call_us"] - r["plain"]["call_us"] for r in rows)
            thread = statistics.median(j["thread_cpu_us"] for j in jm)
            step = statistics.median(j["step_us"] for j in jm)
            # The training thread's extra CPU a step, by its own CPU clock (each pair of children's difference): all
            # of jaxmon's work there (step(), the tracked call's wrapper, GIL hand-offs, colder caches).
            main = statistics.median(r["jaxmon"]["main_cpu_us"] - r["plain"]["main_cpu_us"] for r in rows)
            key = str(size) if len(sets) == 1 else f"{size} [{parts or 'start'}]"
            result["sizes"][key] = {
                "k": k,
                "steps": steps,
                "parts": parts or "start",
                "plain_step_ms": statistics.median(r["plain"]["step_ms"] for r in rows),
                "jaxmon_step_ms": statistics.median(j["step_ms"] for j in jm),
                "ratio_median": statistics.median(r["ratio"] for r in rows),
                "ratios": [round(r["ratio"], 4) for r in rows],
                "thread_cpu_us": thread,
                "step_us": step,
                "track_us": track,
                "total_us": thread + step + max(track, 0.0),
                "main_cpu_us": main,
                "cpu_total_us": thread + main,  # jaxmon's threads and its share of the training thread, by CPU clocks
                "rows": rows,
            }
            if args.against:  # the other tree's, from the same alternations
                against = [r["against"] for r in rows]
                result["sizes"][key] |= {
                    "against": str(Path(args.against).resolve()),
                    "against_ratio_median": statistics.median(r["against_ratio"] for r in rows),
                    "against_ratios": [round(r["against_ratio"], 4) for r in rows],
                    "against_thread_cpu_us": statistics.median(j["thread_cpu_us"] for j in against),
                    "against_step_us": statistics.median(j["step_us"] for j in against),
                    # this tree's steps over the other's, alternation by alternation (below 1: this tree is faster)
                    "this_over_against": statistics.median(
                        r["jaxmon"]["step_ms"] / r["against"]["step_ms"] for r in rows
                    ),
                }
        if args.profile:
            result["sizes"][f"{size} profile"] = child(args, "profile", k=k, steps=steps, parts=sets[-1])
    if args.rss_steps:
        result["rss"] = child(args, "rss", steps=args.rss_steps)
    if args.paced_steps:
        result["paced"] = child(args, "paced", steps=args.paced_steps)
    result["seconds"] = time.time() - started
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "step_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    brief = {s: {k: v for k, v in r.items() if k != "rows"} for s, r in result["sizes"].items()}
    print(json.dumps({"sizes": brief, "rss": result.get("rss"), "paced": result.get("paced")}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
