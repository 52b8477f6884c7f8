#!/usr/bin/env python3
"""Generate the deployment files that must agree with a single source.

- deploy/kubernetes/prometheusrule*.yaml and gmp-rules*.yaml: the Prometheus Operator's PrometheusRule and Google
  Managed Prometheus's Rules of deploy/prometheus/alerts.yml and job.yml (the same rules Prometheus loads in the
  compose stack), comments included, by deploy/generators/rules.py;
- grafana/dashboards/jaxmon.json and jaxmon-job.json: the Grafana dashboards, built by deploy/generators/dashboard.py
  from the rows of panels in deploy/generators/rows/ (job.py: the Job dashboard's).

    python deploy/generate.py           # rewrite those that changed
    python deploy/generate.py --check   # exit 1 if a committed file differs from what would be generated

Needs only the standard library and PyYAML. tests/e2e/test_deploy.py runs --check, so edit the sources and regenerate.
"""

from __future__ import annotations

import argparse
import sys

# Run as a script, deploy/ is sys.path[0], so the package beside this file imports by its own name.
from generators import ROOT, outputs


def main(argv: list[str] | None = None) -> int:
    """Write the generated files that differ from what they should be, or with --check list them and return 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a committed file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    for path in stale:
        print(f"{path.relative_to(ROOT)} is out of date: run python deploy/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
