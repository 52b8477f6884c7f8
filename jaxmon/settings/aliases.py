"""Old setting names that keep working: users have them in manifests, compose files and shell history.

Each collector's settings now live in its own section, `collector.<name>`; the probe's and the spool's used to be
top-level sections. Every spelling of the old names still works: `--probe.interval` is
`--collector.probe.interval`, `JAXMON_PROBE__INTERVAL` is `JAXMON_COLLECTOR__PROBE__INTERVAL`, a YAML `probe:`
section is `collector: {probe: …}`, and `jaxmon.start(probe={…})` is `collector={"probe": {…}}`. Where both names
set one setting, the current name wins.
"""

from __future__ import annotations

Path_ = tuple[str, ...]

# old top-level section -> where its settings live now
SECTIONS: dict[str, Path_] = {
    "probe": ("collector", "probe"),
    "spool": ("collector", "spool"),
    # Not an old name: the training telemetry's documented spelling, `jaxmon.start(training={...})`.
    "training": ("collector", "training"),
}
# The ones that are old names (noted once in the log when used).
OLD = frozenset({"probe", "spool"})


def current_path(path: Path_) -> Path_:
    """The current path of a setting written as `path` (an old name mapped, anything else unchanged)."""
    if path and path[0] in SECTIONS:
        return SECTIONS[path[0]] + path[1:]
    return path


def old_path(path: Path_) -> Path_ | None:
    """The old spelling of a current path, where it has one."""
    for old, new in SECTIONS.items():
        if path[: len(new)] == new:
            return (old, *path[len(new) :])
    return None
