"""The code docs/ shows is code the suite runs: each fenced block marked `<!-- from PATH -->` is, line for line, the
region of PATH between `# docs:start` and `# docs:end` (tests/e2e/test_docs_loops.py runs those files, and
checks that the PromQL of docs/training.md parses)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("**/*.md"))
MARKED = re.compile(r"^<!-- from (\S+) -->\n```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def region(path: Path) -> str:
    """The lines of `path` between its `# docs:start` and `# docs:end` lines."""
    lines = path.read_text().splitlines()
    assert lines.count("# docs:start") == 1 and lines.count("# docs:end") == 1, path
    return "\n".join(lines[lines.index("# docs:start") + 1 : lines.index("# docs:end")]) + "\n"


def marked(doc: Path) -> list[tuple[str, str]]:
    """(source path, block) of each block of `doc` marked with the file it comes from."""
    return [(m.group(1), m.group(3)) for m in MARKED.finditer(doc.read_text())]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_marked_block_is_its_files_region(doc: Path) -> None:
    for source, block in marked(doc):
        path = ROOT / source
        assert path.is_file(), f"{doc.name}: {source} does not exist"
        assert block == region(path), f"{doc.name}: the block from {source} differs from its docs:start region"


def test_training_md_shows_both_loops_from_the_files_the_suite_runs() -> None:
    sources = [s for s, _ in marked(ROOT / "docs" / "training-loops.md")]
    assert sources == ["tests/workloads/flax_loop.py", "tests/workloads/maxtext_loop.py"]
    # Each is run by the e2e test, as a child process of its own.
    runs = (ROOT / "tests" / "e2e" / "test_docs_loops.py").read_text()
    assert all(f'"{Path(s).name}"' in runs for s in sources)
