#!/usr/bin/env python3
"""Generate the deployment files that must agree with a single source.

- deploy/kubernetes/prometheusrule*.yaml and gmp-rules*.yaml: the Prometheus Operator's PrometheusRule and Google
  Managed Prometheus's Rules of deploy/prometheus/alerts.yml, job.yml and fleet.yml (the same rules Prometheus loads
  in the compose stack), comments included, by deploy/generators/rules.py;
- grafana/dashboards/jaxmon.json and jaxmon-job.json: the Grafana dashboards, built by deploy/generators/dashboard.py
  from the rows of panels in deploy/generators/rows/ (job.py: the Job dashboard's).

    python deploy/generate.py           # rewrite those that changed
    python deploy/generate.py --check   # exit 1 if a committed file differs from what would be generated

Each alert's runbook_url is its section of docs/alerts.md. The rules files and the committed manifests carry it as
the path `docs/alerts.md#<alert name in lower case>`; --runbook-base-url puts the URL where your copy of
docs/alerts.md is served in its place, in the manifests (and in the rules files written to --prometheus-rules-dir):

    python deploy/generate.py --runbook-base-url https://github.com/ORG/jaxmon/blob/main/docs/alerts.md
    python deploy/generate.py --runbook-base-url URL --prometheus-rules-dir /etc/prometheus/rules

Needs only the standard library and PyYAML. tests/e2e/test_deploy.py runs --check, so edit the sources and regenerate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a script, deploy/ is sys.path[0], so the package beside this file imports by its own name.
from generators import ROOT, outputs, rules


def main(argv: list[str] | None = None) -> int:
    """Write the generated files that differ from what they should be, or with --check list them and return 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a committed file is out of date")
    parser.add_argument(
        "--runbook-base-url",
        default=rules.DEFAULT_RUNBOOK_BASE_URL,
        metavar="URL",
        help="where docs/alerts.md is served: each alert's runbook_url becomes URL#<alert name in lower case> "
        f"(default: {rules.DEFAULT_RUNBOOK_BASE_URL}, the path in this repository, as committed)",
    )
    parser.add_argument(
        "--prometheus-rules-dir",
        type=Path,
        metavar="DIR",
        help="also write alerts.yml, job.yml and fleet.yml with those runbook URLs into DIR (for a Prometheus loading "
        "rule files)",
    )
    args = parser.parse_args(argv)
    files = outputs()
    files.update(rules.outputs(args.runbook_base_url))
    if args.prometheus_rules_dir is not None:
        files.update(rules.prometheus_rules(args.prometheus_rules_dir.resolve(), args.runbook_base_url))
    stale = []
    for path, text in files.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_shown(path)}")
    for path in stale:
        print(f"{_shown(path)} is out of date: run python deploy/generate.py", file=sys.stderr)
    return 1 if stale else 0


def _shown(path: Path) -> str:
    """The path relative to the repository where it is in it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    raise SystemExit(main())
