"""Time to read a large program's collectives from its HLO text (jaxmon.xla.hlo.parse, issue 34 groundwork).

    .venv/bin/python bench/hlo_parse.py            # about 10 seconds

A compiled program's optimized HLO text is megabytes for a large model; jaxmon will parse it once per program, off
the training thread. This builds synthetic HLO text of about 1, 5 and 10 MB shaped like what XLA prints: fusion
computations of ten instructions with long metadata, while loops nested two deep (trip counts 4 and 8) whose
bodies call the fusions, and a collective every tenth instruction in every spelling (explicit, iota and mesh-axes
replica groups, source_target_pairs, tuple-shaped combined all-reduces, async start/done pairs). It reports the
median of 5 parses of each size (seconds and MB/s) and the time per MB at each size: a flat time per MB is the
linear scaling the parser is meant to have. The figure for the brief is the ~5 MB text.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import save

from jaxmon.xla.hlo import parse, summarize

META = ', metadata={{op_name="jit(train_step)/transpose(jvp(while))/body/closed_call/layer_{i}/dot_general"' \
    ' source_file="/workspace/model/transformer.py" source_line={i}}}'  # fmt: skip
COLLECTIVES = [
    "%ar.{i} = f32[1024,1024]{{1,0}} all-reduce(%x.{i}), channel_id={i}, replica_groups=[2,4]<=[4,2]T(1,0),"
    " use_global_device_ids=true, to_apply=%add",
    "%ag.{i} = bf16[4096,1024]{{1,0}} all-gather(%x.{i}), channel_id={i}, replica_groups={{{{0,1},{{2,3}},{{4,5}},"
    "{{6,7}}}}, dimensions={{0}}, use_global_device_ids=true",
    "%rs.{i} = f32[256,1024]{{1,0}} reduce-scatter(%x.{i}), channel_id={i},"
    " replica_groups=mesh['axis_0'=4,'axis_1'=2] {{'axis_1'}}, use_global_device_ids=true, dimensions={{0}},"
    " to_apply=%add",
    "%arc.{i} = (f32[], f32[64,256]{{1,0}}, bf16[1024]{{0}}) all-reduce(%a.{i}, %b.{i}, %c.{i}), channel_id={i},"
    " replica_groups=[4,2]<=[8], use_global_device_ids=true, to_apply=%add",
    "%cps.{i} = (f32[512,512]{{1,0}}, f32[512,512]{{1,0}}, u32[], u32[]) collective-permute-start(%x.{i}),"
    " channel_id={i}, source_target_pairs={{{{0,2}},{{2,4}},{{4,6}},{{6,0}},{{1,3}},{{3,5}},{{5,7}},{{7,1}}}}",
    "%cpd.{i} = f32[512,512]{{1,0}} collective-permute-done(%cps.{i})",
]
PLAIN = "%op.{i} = f32[128,1024]{{1,0}} multiply(%p.{i}, %q.{i})"


def synthetic(target_bytes: int) -> str:
    """HLO text of about `target_bytes`: fusions, two nested whiles calling them, collectives every tenth line."""
    parts = ["HloModule jit_train_step, is_scheduled=true, num_partitions=8\n"]
    parts.append("%add (a: f32[], b: f32[]) -> f32[] {\n  ROOT %s = f32[] add(%a, %b)\n}\n")
    size = sum(map(len, parts))
    fusions: list[str] = []
    i = 0
    while size < target_bytes:
        name = f"fused_computation.{len(fusions)}"
        lines = [f"%{name} (param_0: f32[128,1024], param_1: f32[128,1024]) -> f32[128,1024] {{"]
        for k in range(10):
            i += 1
            template = COLLECTIVES[i % len(COLLECTIVES)] if k == 9 else PLAIN
            lines.append("  " + template.format(i=i) + META.format(i=i))
        lines.append("}\n")
        block = "\n".join(lines)
        parts.append(block)
        size += len(block)
        fusions.append(name)
    calls = [f"  %f.{n} = f32[128,1024]{{1,0}} fusion(%p, %q), kind=kLoop, calls=%{f}" for n, f in enumerate(fusions)]
    half = len(calls) // 2
    loop = '"known_trip_count":{{"n":"{n}"}}'
    cond = "%cond (c: (s32[], f32[128,1024])) -> pred[] {\n  ROOT %lt = pred[] compare(%a, %b), direction=LT\n}\n"
    inner = "%inner (t: (s32[], f32[128,1024])) -> (s32[], f32[128,1024]) {\n" + "\n".join(calls[:half]) + "\n}\n"
    outer = (
        "%outer (t: (s32[], f32[128,1024])) -> (s32[], f32[128,1024]) {\n"
        + "\n".join(calls[half:])
        + "\n  %w = (s32[], f32[128,1024]) while(%t), condition=%cond, body=%inner, backend_config={"
        + loop.format(n=8)
        + "}\n}\n"
    )
    entry = (
        "ENTRY %main (p: f32[128,1024]) -> f32[128,1024] {\n  %w = (s32[], f32[128,1024]) while(%t), condition=%cond,"
        " body=%outer, backend_config={" + loop.format(n=4) + "}\n}\n"
    )
    return "\n".join([*parts, cond, inner, outer, entry])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 5.0, 10.0])
    args = ap.parse_args()
    results = []
    for mb in args.sizes_mb:
        text = synthetic(int(mb * 2**20))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            program = parse(text)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        totals = summarize(program)
        summary_s = time.perf_counter() - t0
        seconds = statistics.median(times)
        real_mb = len(text) / 2**20
        results.append(
            {
                "text_mb": round(real_mb, 2),
                "lines": text.count("\n"),
                "collectives": len(program.collectives),
                "parse_seconds_median": round(seconds, 4),
                "mb_per_second": round(real_mb / seconds, 1),
                "seconds_per_mb": round(seconds / real_mb, 4),
                "summarize_seconds": round(summary_s, 4),
                "ops": sorted(op for op, _ in totals),
            }
        )
        print(
            f"{real_mb:5.2f} MB, {len(program.collectives)} collectives: parse {seconds * 1e3:.0f} ms median of"
            f" {args.repeats} ({real_mb / seconds:.1f} MB/s, {seconds / real_mb * 1e3:.0f} ms/MB),"
            f" summarize {summary_s * 1e3:.1f} ms",
            flush=True,
        )
    save("hlo_parse", {"command": "python bench/hlo_parse.py", "sizes": results})


if __name__ == "__main__":
    main()
