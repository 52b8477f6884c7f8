"""Two versions of the job and fleet rules side by side on one TSDB: each rule's expression alone, A then B then A...

    .venv/bin/python bench/job_rules_compare.py DATA --a OLD_DIR --b NEW_DIR [--rounds 9] [--at T] [--out-name N]

DATA is a TSDB that `bench/job_rules_scale.py --keep` left (its `data`, read-only: copied first); OLD_DIR and NEW_DIR
each hold a job.yml and a fleet.yml (e.g. `git show REV:deploy/prometheus/job.yml`). A quiet Prometheus (no rules,
nothing scraped) opens the copy; every expression of A and of B is queried at T (default: the head's last sample
less 5 s) `--rounds` times, the two versions alternating query by query, so that the machine's load falls on both
alike. Per expression and per group: the median of Prometheus's CPU time (/proc, 10 ms ticks) and of its
evalTotalTime. Both versions must read only series that are in the TSDB (a rewrite that reads a new record needs a
TSDB from a run with it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from common import RESULTS, save
from job_rules_scale import Prometheus, rule_expressions, timed_query


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("--a", type=Path, required=True, help="a directory with job.yml and fleet.yml (before)")
    ap.add_argument("--b", type=Path, required=True, help="a directory with job.yml and fleet.yml (after)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--at", type=float, default=None)
    ap.add_argument("--out-name", default="job_rules_compare")
    args = ap.parse_args()
    versions = {
        v: [(g, k, e) for f in ("job.yml", "fleet.yml") for g, k, e in rule_expressions((d / f).read_text())]
        for v, d in (("a", args.a), ("b", args.b))
    }
    work = Path(tempfile.mkdtemp(prefix="jaxmon-rules-compare-", dir="/var/tmp"))
    try:
        shutil.copytree(args.data, work / "data")
        prom = Prometheus(work, work / "data", "", "", 0, 0, "job-rules-compare", quiet=True)
        try:
            idle = prom.wait_idle()
            head = requests.get(prom.url + "/api/v1/status/tsdb", timeout=30).json()["data"]["headStats"]
            at = args.at or round(head["maxTime"] / 1e3 - 5, 3)
            series = head["numSeries"]
            print(f"quiet Prometheus idle after {idle} s; {series:,} head series; queries at {at}")
            raw: dict[str, dict[str, list[dict[str, Any]]]] = {"a": {}, "b": {}}
            pairs = max(len(versions["a"]), len(versions["b"]))
            for r in range(args.rounds):
                order = range(pairs) if r % 2 == 0 else reversed(range(pairs))
                for i in order:
                    for v in ("a", "b") if (r + i) % 2 == 0 else ("b", "a"):
                        if i < len(versions[v]):
                            _, key, expr = versions[v][i]
                            runs = raw[v].setdefault(key, [])
                            runs.append(timed_query(prom, "/api/v1/query", query=expr, time=at))
                print(f"  round {r + 1} of {args.rounds}")
        finally:
            prom.child.stop(timeout=120)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(runs: list[dict[str, Any]], field: str) -> float:
        return statistics.median(x[field] for x in runs if field in x and x[field] is not None)

    command = " ".join(map(str, [args.data, args.a, args.b]))
    result: dict[str, Any] = {"command": command, "at": at, "rounds": args.rounds}
    for v in ("a", "b"):
        rules = {
            key: {
                "cpu_median_s": med(runs, "cpu_s"),
                "eval_median_s": med(runs, "eval_s"),
                "series": runs[-1].get("series"),
                "samples": runs[-1].get("samples"),
                "errors": sorted({x["error"] for x in runs if "error" in x}),
            }
            for key, runs in raw[v].items()
        }
        groups: dict[str, dict[str, float]] = {}
        for group, key, _ in versions[v]:
            g = groups.setdefault(group, {"cpu_s": 0.0, "eval_s": 0.0})
            g["cpu_s"] += rules[key]["cpu_median_s"]
            g["eval_s"] += rules[key]["eval_median_s"]
        result[v] = {"rules": rules, "groups": groups}
    print(f"{'group':45s} {'A cpu':>8s} {'B cpu':>8s} {'A eval':>8s} {'B eval':>8s}  (ms)")
    for group in sorted(result["a"]["groups"], key=lambda g: -result["a"]["groups"][g]["cpu_s"]):
        a, b = result["a"]["groups"][group], result["b"]["groups"].get(group, {"cpu_s": 0.0, "eval_s": 0.0})
        cpu = f"{a['cpu_s'] * 1e3:8.0f} {b['cpu_s'] * 1e3:8.0f}"
        ev = f"{a['eval_s'] * 1e3:8.1f} {b['eval_s'] * 1e3:8.1f}"
        print(f"{group:45s} {cpu} {ev}")
    changed = [k for k in result["a"]["rules"] if result["a"]["rules"][k] != result["b"]["rules"].get(k)]
    for key in sorted(changed, key=lambda k: -result["a"]["rules"][k]["cpu_median_s"])[:12]:
        a, b = result["a"]["rules"][key], result["b"]["rules"].get(key, {})
        print(
            f"  {key}: A cpu {a['cpu_median_s'] * 1e3:.0f} eval {a['eval_median_s'] * 1e3:.1f} ms, "
            f"B cpu {b.get('cpu_median_s', 0) * 1e3:.0f} eval {b.get('eval_median_s', 0) * 1e3:.1f} ms"
        )
    result["loadavg"] = list(os.getloadavg())
    result["finished"] = time.time()
    RESULTS.mkdir(parents=True, exist_ok=True)
    save(args.out_name, result)


if __name__ == "__main__":
    main()
