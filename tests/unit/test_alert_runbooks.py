"""docs/alerts.md, the alerts' runbooks: every alert of alerts.yml and job.yml has a section there and every section
an alert; each alert's runbook_url is its section's anchor (GitHub's slug of the heading), and deploy/generate.py
--runbook-base-url puts a URL in front of the anchors in what it generates."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.deploy_files import (
    DEPLOY,
    FLEET_RULES,
    JOB_RULES,
    RULES,
    alert_rules,
    metric_tokens,
    parse_yaml,
    readme_metrics,
)

RUNBOOKS = ROOT / "docs" / "alerts.md"
BASE = "https://docs.example.com/jaxmon/alerts.md"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _text() -> str:
    return RUNBOOKS.read_text(encoding="utf-8")


def _sections() -> dict[str, str]:
    """Each `### ` heading of docs/alerts.md and its text, up to the next heading of any level up to 3."""
    parts = re.split(r"^(#{2,3}) (.+)$", _text(), flags=re.MULTILINE)
    return {parts[i + 1].strip(): parts[i + 2] for i in range(1, len(parts), 3) if parts[i] == "###"}


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for path in (RULES, JOB_RULES) for rule in alert_rules(path)}


def test_every_alert_has_a_section_and_every_section_an_alert() -> None:
    sections, alerts = _sections(), _alerts()
    assert sorted(sections) == sorted(alerts), set(sections) ^ set(alerts)


def test_each_alert_links_to_its_section_and_keeps_its_notification_short() -> None:
    anchors = {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", _text(), flags=re.MULTILINE)}
    for name, rule in _alerts().items():
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["runbook_url"] == f"docs/alerts.md#{_slug(name)}", name
        assert _slug(name) in anchors, name
        # The long text lives in the runbook; the notification carries a line and a paragraph.
        assert len(annotations["summary"]) <= 200, name


# Every annotation of a shipped alert, as the rules file has it (templates unexpanded), is under this many characters:
# a notification carries a line and a paragraph, the runbook the rest.
ANNOTATION_CHARACTERS = 400


def test_every_annotation_of_the_shipped_rules_is_under_400_characters() -> None:
    long = {
        (name, key): len(text)
        for name, rule in _alerts().items()
        for key, text in rule["annotations"].items()
        if len(text) >= ANNOTATION_CHARACTERS
    }
    assert long == {}, f"move the rest to the alert's section of docs/alerts.md: {long}"
    assert len(_alerts()) >= 40  # alerts.yml's and job.yml's


def test_each_section_says_what_it_means_how_to_confirm_it_and_what_to_do() -> None:
    alerts = _alerts()
    for name, body in _sections().items():
        rule = alerts[name]
        assert f"**{rule['labels']['severity']}**, for {rule['for']};" in body, name
        for part in ("**What it means.**", "**Confirm it.**", "**What to do.**"):
            assert part in body, (name, part)
        queries = re.findall(r"```promql\n(.*?)```", body, flags=re.DOTALL)
        # The first query is the alert's own expression, as the rules file has it.
        assert queries and queries[0] == rule["expr"].rstrip("\n") + "\n", name
    # The job alerts' sections say where their thresholds are set.
    for name in {r["alert"] for r in alert_rules(JOB_RULES)}:
        assert "jaxmon:param:" in _sections()[name], name


def test_the_overview_table_lists_each_alert_once_with_its_severity_and_for() -> None:
    rows = re.findall(r"^\| \[`(Jaxmon\w+)`\]\(#(\w+)\) \| (\w+) \| (\w+) \|", _text(), flags=re.MULTILINE)
    alerts = _alerts()
    assert sorted(r[0] for r in rows) == sorted(alerts)
    for name, anchor, severity, duration in rows:
        assert (anchor, severity, duration) == (_slug(name), alerts[name]["labels"]["severity"], alerts[name]["for"])


def test_links_within_the_page_resolve_and_queries_name_known_metrics() -> None:
    text = _text()
    anchors = {_slug(heading) for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
    assert set(re.findall(r"\]\(#([^)]+)\)", text)) <= anchors
    unknown = metric_tokens(text) - set(readme_metrics())
    assert not unknown, f"docs/alerts.md names metrics the reference does not define: {sorted(unknown)}"


# --------------------------------------------------------------------------------------------------------------
# deploy/generate.py --runbook-base-url
# --------------------------------------------------------------------------------------------------------------


def _rules_generator() -> Any:
    """deploy/generators/rules.py, imported as generate.py imports it (deploy/ on the path)."""
    if str(DEPLOY) not in sys.path:
        sys.path.insert(0, str(DEPLOY))
    return importlib.import_module("generators.rules")


def _with_base(doc: Any, base: str) -> Any:
    """The parsed rules with each runbook_url's docs/alerts.md replaced by `base`."""
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["annotations"]["runbook_url"] = rule["annotations"]["runbook_url"].replace("docs/alerts.md", base)
    return doc


def test_the_base_url_reaches_every_manifest_and_nothing_else_changes() -> None:
    rules = _rules_generator()
    assert rules.DEFAULT_RUNBOOK_BASE_URL == "docs/alerts.md"
    for manifest in rules.MANIFESTS:
        committed = parse_yaml(manifest.target.read_text(encoding="utf-8"))
        based = parse_yaml(manifest.text(BASE))
        assert based["spec"] == _with_base(committed["spec"], BASE), manifest.target.name
        assert based["metadata"] == committed["metadata"]


@pytest.mark.parametrize("base", ["", "https://x.example/a b", 'https://x.example/"', "https://x.example/#a"])
def test_a_base_url_that_would_break_the_yaml_or_the_anchor_is_refused(base: str) -> None:
    with pytest.raises(SystemExit):
        _rules_generator().with_runbook_base_url(RULES.read_text(encoding="utf-8"), base)


def test_an_alert_without_a_runbook_url_is_refused() -> None:
    text = RULES.read_text(encoding="utf-8").replace('runbook_url: "docs/alerts.md#jaxmongpulost"', "", 1)
    with pytest.raises(SystemExit, match="runbook_url"):
        _rules_generator().with_runbook_base_url(text, BASE)


def test_generate_writes_prometheus_rule_files_with_the_base_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check with another base than the committed one finds every rules manifest stale, and the rules files of
    --prometheus-rules-dir missing; nothing is written (a unit test leaves the tree alone)."""
    _rules_generator()
    generate = importlib.import_module("generate")
    base = ["--runbook-base-url", BASE]
    assert generate.main(["--check", *base, "--prometheus-rules-dir", str(tmp_path)]) == 1
    stale = set(re.findall(r"^(\S+) is out of date", capsys.readouterr().err, flags=re.MULTILINE))
    # fleet.yml has no alerts: its manifests carry no runbook URL and stay as committed.
    expected = {f"deploy/kubernetes/{m.target.name}" for m in _rules_generator().MANIFESTS if alert_rules(m.source)}
    written = {str(tmp_path.resolve() / name) for name in ("alerts.yml", "job.yml", FLEET_RULES.name)}
    assert stale == expected | written
    # What it would write there: the rules files with the base URL, and with the default base the rules as they are.
    rules = _rules_generator()
    for base_url in (BASE, rules.DEFAULT_RUNBOOK_BASE_URL):
        files = rules.prometheus_rules(tmp_path, base_url)
        assert set(files) == {tmp_path / RULES.name, tmp_path / JOB_RULES.name, tmp_path / FLEET_RULES.name}
        for source in (RULES, JOB_RULES, FLEET_RULES):
            written = files[tmp_path / source.name]
            assert written.startswith("# GENERATED by `python deploy/generate.py` from deploy/prometheus/")
            expected = parse_yaml(source.read_text(encoding="utf-8"))
            assert parse_yaml(written) == _with_base(expected, base_url), (source.name, base_url)
