"""The package's layout rules, read from its source: no import circles, collectors that import no other collector
nor the composition root, settings and the exposition that import no collector, no collector that stamps owners
itself (the owner transform does, jaxmon.ownership.owners), imports that run one way from the sources through the
ownership wing to the collectors, no basename that names two things, docs that name only modules that exist, and no
module over 800 lines but a table of data.

Imports are read with `ast`, those under `if TYPE_CHECKING:` and inside functions included: a circle through a
type-only or a lazy import is still a circle in the design.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "jaxmon"
# A module is one concept, whole: the cap is there to catch two concepts in one file, not to split one (client_python's
# metrics.py, one concept, is 804 lines).
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The jaxmon module `name` refers to (a name imported from a module is that module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@functools.cache
def tree(module: str) -> ast.Module:
    """A module's syntax tree, parsed once for the tests that read it (none changes it)."""
    return ast.parse(MODULES[module].read_text())


def statements(node: ast.AST) -> Iterator[ast.stmt]:
    """Every statement in `node`, at any depth (in function and class bodies, under `if`, `try`, `with`, `match`):
    an import is a statement, so a walk of the statements alone finds every one, without the expressions (most of a
    module's nodes: ast.walk of them all took a third of a second of the first test's second and a half)."""
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, ()):
            if isinstance(child, ast.stmt):
                yield child
            yield from statements(child)


def imports(module: str) -> set[str]:
    """Every jaxmon module `module` imports, anywhere in its source."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in statements(tree(module)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                out.add(target)
    return out


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every jaxmon module's imports (made by the first test that reads it, not as every worker collects the file)."""
    return {module: imports(module) for module in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph()[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph()):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_the_imports_it_should() -> None:
    """A check on the check: known edges are found, a type-only one too."""
    assert "jaxmon.collectors.base" in graph()["jaxmon.collectors.probe"]
    assert "jaxmon.settings.schema" in graph()["jaxmon.collectors.base"]
    assert "jaxmon.collectors" in graph()["jaxmon.compose"]


def test_the_reader_sees_the_wings_imports() -> None:
    """A check on the check below: the wing's edge to a source is found, and the kubernetes collector's to the wing."""
    assert "jaxmon.sources.kubernetes_api" in graph()["jaxmon.ownership.dra"]
    assert "jaxmon.ownership.pidowners" in graph()["jaxmon.collectors.kubernetes"]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_imports_run_one_way_from_the_sources_through_the_ownership_wing_to_the_collectors() -> None:
    """Sources give readings, the ownership wing resolves them, collectors offer them: no source imports the wing or
    a collector, and the wing imports no collector."""
    above = {"jaxmon.sources": ("jaxmon.ownership", "jaxmon.collectors"), "jaxmon.ownership": ("jaxmon.collectors",)}
    for module in sorted(MODULES):
        for package, upper in above.items():
            if _within(module, package):
                bad = {t for t in graph()[module] if any(_within(t, u) for u in upper)}
                assert not bad, f"{module} imports {sorted(bad)}"


# Basenames that may name several modules: one domain's collector, families and source (collectors/<x>.py,
# families/<x>.py, sources/<x>.py or sources/local/<x>.py: the probe's, the training's, the spool's, ...), whose
# packages say which of the three each is; and each command's command line (cli.py: `jaxmon`'s and `jaxmon top`'s).
DOMAIN_LAYERS = {"jaxmon.collectors", "jaxmon.families", "jaxmon.sources", "jaxmon.sources.local"}
SHARED_BASENAMES = {"cli"}


def test_no_module_basename_names_two_different_things() -> None:
    by_name: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, []).append(module)
    for name, modules in sorted(by_name.items()):
        if len(modules) < 2 or name in SHARED_BASENAMES:
            continue
        packages = [m.rpartition(".")[0] for m in modules]
        assert set(packages) <= DOMAIN_LAYERS, f"{name}.py names {sorted(modules)}"
        assert not {"jaxmon.sources", "jaxmon.sources.local"} <= set(packages), f"two sources named {name}.py"


# Classes of one name in two modules, each with why it is left so: the training room's programs (jaxmon/training/
# handed.py: a tracked function's program as the tracker books it; hlo.py: a program's HLO as the analysis reads it),
# which its rebuild renames.
SHARED_CLASS_NAMES = {"Program"}


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = {}
    for module in MODULES:
        for node in tree(module).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module)
    twice = {name: sorted(modules) for name, modules in where.items() if len(modules) > 1}
    assert set(twice) <= SHARED_CLASS_NAMES, {n: m for n, m in twice.items() if n not in SHARED_CLASS_NAMES}


def test_no_module_imports_itself_round_a_circle() -> None:
    assert _cycles() == []


def test_no_collector_imports_another_collector_or_the_composition_root() -> None:
    collectors = {m for m in MODULES if m.startswith("jaxmon.collectors.") and m != "jaxmon.collectors.base"}
    for module in collectors:
        bad = {t for t in graph()[module] if t in collectors or t in ("jaxmon.compose", "jaxmon.cli")}
        assert not bad, f"{module} imports {sorted(bad)}"


def test_the_settings_import_no_collector() -> None:
    for module in (m for m in MODULES if m.startswith("jaxmon.settings")):
        bad = {t for t in graph()[module] if t.startswith("jaxmon.collectors")}
        assert not bad, f"{module} imports {sorted(bad)}"


# Rooms (issue 38). A room is a package directly under jaxmon (jaxmon.training, jaxmon.xla, jaxmon.sources with its
# subpackages, ...) or a module directly under it (jaxmon.exchange, jaxmon.threads). Room A imports room B when a module
# of A imports a module of B. An import runs back up when it closes a circle of rooms: A imports B while B, directly
# or through other rooms, imports A. Before issue 38, jaxmon.profile.classify imported jaxmon.training.hlo while
# jaxmon.training.sampler imported jaxmon.profile, and jaxmon.sources.local imported probe/engine.py's thread prefix
# while jaxmon.probe.idle imported jaxmon.sources.hostcpu.
# Issue 41's ownership wing removed the last one (jaxmon.sources.cluster_cache imported jaxmon.dra, which imported
# jaxmon.sources.kubelet).
def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _room_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The circles of rooms of a module graph: each set of two rooms or more that reach one another."""
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(_room(module), set()).update(_room(t) for t in targets if _room(t) != _room(module))

    def reached(room: str) -> set[str]:
        seen, todo = {room}, [room]
        while todo:
            for other in rooms.get(todo.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    reach = {room: reached(room) for room in rooms}
    circles = {frozenset(r for r in reach[room] if room in reach.get(r, ())) for room in rooms}
    return sorted((set(c) for c in circles if len(c) > 1), key=sorted)


def test_the_room_reader_finds_a_circle() -> None:
    """A check on the check: a circle through a third room is found, rooms inside a package are one room, and a
    one-way import is no circle."""
    graph = {
        "jaxmon.a.x": {"jaxmon.b"},
        "jaxmon.b": {"jaxmon.c"},
        "jaxmon.c": {"jaxmon.a.deep.y"},
        "jaxmon.a.deep.y": {"jaxmon.a.x", "jaxmon.d"},
        "jaxmon.d": set(),
    }
    assert _room_circles(graph) == [{"jaxmon.a", "jaxmon.b", "jaxmon.c"}]
    assert _room_circles({"jaxmon.a.x": {"jaxmon.b.y"}, "jaxmon.b.y": set()}) == []


def test_no_import_runs_back_up_between_rooms() -> None:
    assert _room_circles(graph()) == []


def _top_level_imports(module: str) -> set[str]:
    """The top-level names of every absolute import in a module (`jax` for `from jax.sharding import Mesh`)."""
    out: set[str] = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_xla_readers_import_only_the_standard_library_and_one_another() -> None:
    """jaxmon.xla reads what XLA writes as plain text and bytes: no JAX, no protobuf, no other room of jaxmon (not
    jaxmon.training, which uses it), and its __init__ imports nothing. So importing the HLO parser runs no
    jaxmon/training/__init__.py (which registers a fork hook); the root package's names load lazily (PEP 562)."""
    import sys

    readers = [m for m in MODULES if _room(m) == "jaxmon.xla"]
    assert {"jaxmon.xla.hlo", "jaxmon.xla.profile", "jaxmon.xla.xspace"} <= set(readers)
    assert graph()["jaxmon.xla"] == set() and _top_level_imports("jaxmon.xla") <= {"__future__"}
    for module in readers:
        others = {t for t in graph()[module] if _room(t) != "jaxmon.xla"}
        assert not others, f"{module} imports {sorted(others)}"
        foreign = _top_level_imports(module) - set(sys.stdlib_module_names) - {"jaxmon"}
        assert not foreign, f"{module} imports {sorted(foreign)}"


def test_the_exposition_imports_no_collector() -> None:
    """The exposition renders every collector by the collectors' shape (FamilySource), none by its module: not even
    jaxmon.collectors.base (the prometheus_client default registry is a collector like any other)."""
    bad = {t for t in graph()["jaxmon.exposition"] if t == "jaxmon.collectors" or t.startswith("jaxmon.collectors.")}
    assert not bad, f"jaxmon.exposition imports {sorted(bad)}"


# Who owns a device is said in these modules, and written on series (these labels) by the owner transform alone.
OWNER_MODULES = {m for m in MODULES if m == "jaxmon.ownership" or m.startswith("jaxmon.ownership.")}
OWNER_LABELS = {"namespace", "pod", "container"}
# The names that carry owners: the owner model and its channel, and DEVICE_PODS / DevicePods, the channel through
# which the nvml and tpu collectors read the kubelet's pods and stamped them themselves before issue 35.
OWNER_NAMES = {"OWNERS", "Owners", "Owner", "OwnerIndex", "owner_labels", "Attribution", "DEVICE_PODS", "DevicePods"}
# Owner sources: collectors whose state offers owners (they build them) and whose own families list them
# (jaxmon_kubernetes_pod_device_info).
OWNER_SOURCES = {"jaxmon.collectors.kubernetes"}


def _names_and_strings(module: str) -> tuple[set[str], set[str]]:
    """Every identifier a module names (imported, read, or an attribute) and every short string constant in it."""
    names: set[str] = set()
    strings: set[str] = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rpartition(".")[2])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
            strings.add(node.value)
    return names, strings


def test_no_collector_stamps_owners_itself() -> None:
    """Owner labels come from one transform over every collector's families, never from a collector: no collector
    but the owner sources imports the owner modules, names the owners or their channel, or writes an owner label."""
    collectors = {m for m in MODULES if m.startswith("jaxmon.collectors.")}
    assert collectors >= OWNER_SOURCES
    for module in sorted(collectors - OWNER_SOURCES):
        names, strings = _names_and_strings(module)
        assert not graph()[module] & OWNER_MODULES, f"{module} imports {sorted(graph()[module] & OWNER_MODULES)}"
        assert not names & OWNER_NAMES, f"{module} reads the owners: {sorted(names & OWNER_NAMES)}"
        assert not strings & OWNER_LABELS, f"{module} writes owner labels: {sorted(strings & OWNER_LABELS)}"


def test_the_owner_sources_offer_owners() -> None:
    """A check on the exemption: each owner source is one because its state offers owners to the transform."""
    from jaxmon.collectors import registry
    from jaxmon.exchange import OWNERS

    sources = {f"{cls.__module__}" for cls in registry().values() if OWNERS in cls.offers}
    assert sources == OWNER_SOURCES
    names, strings = _names_and_strings("jaxmon.collectors.nvml")
    assert "DEVICE_IDENTITIES" in names and "device" in strings  # the reader sees what a collector names


def test_only_the_local_source_imports_jax() -> None:
    """jaxmon.sources.local is the one place that touches JAX; everything else receives plain data."""
    for module in MODULES:
        jax = [
            n
            for n in ast.walk(tree(module))
            if (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "jax" for a in n.names))
            or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "jax")
        ]
        assert not jax or module.startswith("jaxmon.sources.local."), module


def _python_files_outside(skipped: set[str]) -> set[str]:
    """The names of the repository's .py files, not walking into the folders named `skipped` (the venvs' many)."""
    found: set[str] = set()
    for _, folders, names in os.walk(ROOT):
        folders[:] = [f for f in folders if f not in skipped]
        found.update(n for n in names if n.endswith(".py"))
    return found


def test_the_docs_name_only_modules_that_exist() -> None:
    """DESIGN.md, CONTRIBUTING.md, README.md and docs/ name modules that exist: every `jaxmon/...py` path, and every
    module named by its file (`compose.py`) in DESIGN.md and CONTRIBUTING.md's maps has a file of that name."""
    docs = [ROOT / "DESIGN.md", ROOT / "CONTRIBUTING.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    files = _python_files_outside({".venv", ".venv-floors", ".git"})
    for doc in docs:
        text = doc.read_text()
        for path in re.findall(r"(?<![\w/])jaxmon/[\w/]+\.py\b", text):
            assert (ROOT / path).is_file(), f"{doc.name} names {path}, which does not exist"
        if doc.name in ("DESIGN.md", "CONTRIBUTING.md"):
            for name in re.findall(r"`(?:[\w]+/)*(\w+\.py)`", text):
                assert name in files, f"{doc.name} names `{name}`, which no module is"


# Tables of data, one entry per thing they list, as long as the things are many: the metric catalog.
TABLES = {"jaxmon.catalog.metrics"}


def test_no_module_is_over_800_lines_but_a_table() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= TABLES, {m: n for m, n in long.items() if m not in TABLES}


def test_sources_and_collectors_take_device_facts_from_the_hardware_catalog() -> None:
    """Peaks, nominal bandwidths, link kinds, NVML's topology levels: jaxmon.catalog.hardware's, read there by every
    wing; never through the training wing (whose links module re-exports the link kinds it classifies with)."""
    facts: set[str] = set()
    for statement in tree("jaxmon.catalog.hardware").body:
        if isinstance(statement, ast.FunctionDef | ast.ClassDef):
            facts.add(statement.name)
        elif isinstance(statement, ast.Assign):
            facts.update(n.id for target in statement.targets for n in ast.walk(target) if isinstance(n, ast.Name))
    assert {"LINKS", "NVLINK", "nvml_link", "device_peak", "nominal_bandwidth", "KINDS"} <= facts
    for module in sorted(m for m in MODULES if _room(m) in ("jaxmon.sources", "jaxmon.collectors")):
        for node in ast.walk(tree(module)):
            wing = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if _room(wing) in ("jaxmon.training", "jaxmon.xla") and isinstance(node, ast.ImportFrom):
                taken = {alias.name for alias in node.names} & facts
                assert not taken, f"{module} imports {sorted(taken)} from {node.module}"
    assert "jaxmon.catalog.hardware" in graph()["jaxmon.sources.nvml.topology"]
    assert graph()["jaxmon.catalog.hardware"] == set() and graph()["jaxmon.catalog.metrics"] == set()
