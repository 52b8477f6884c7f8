"""Every relative link of README.md, BENCHMARKS.md, CHANGELOG.md and docs/ resolves: the file (or directory) it
names exists, and an anchor (`#section`, `other.md#section`) names a heading of that Markdown file, as GitHub slugs
them."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("**/*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+(?:\([^()\s]*\)[^()\s>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_LINK = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the Markdown outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lowercased, punctuation but `-` and `_` dropped, each space
    a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*)", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file: its headings' slugs (a repeated one numbered -1, -2, ... as GitHub does) and
    explicit `<a id=...>` / `<a name=...>`."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose(path.read_text()):
        out.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of each link of a Markdown file outside code."""
    out = []
    for n, line in prose(path.read_text()):
        bare = CODE_SPAN.sub("", line)
        for target in [*LINK.findall(bare), *HTML_LINK.findall(bare)]:
            out.append((n, target))
        m = REFERENCE.match(bare)
        if m:
            out.append((n, m.group(1)))
    return out


def broken(path: Path) -> list[str]:
    """What is wrong with each relative link of `path`."""
    problems = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
            continue  # absolute: https:, mailto:, ...
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: {file_part} does not exist")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken(path) == []


def test_the_slugs_are_githubs() -> None:
    assert slug("10. Training telemetry (`jaxmon/training`, the `training` collector)") == (
        "10-training-telemetry-jaxmontraining-the-training-collector"
    )
    assert slug("Node mode and pod attribution (DaemonSet)") == "node-mode-and-pod-attribution-daemonset"
    assert slug("What `step()` is given") == "what-step-is-given"
    assert slug("The job view: stragglers, stalls and skew") == "the-job-view-stragglers-stalls-and-skew"
    assert slug("jaxmon — design") == "jaxmon--design"
