"""The tree's shape, from the code's own imports: packages stacked in layers that import only
downwards, no import cycle among modules, the worker's side of the trust boundary importing only
what both sides share, modules and functions of a readable size, and docs that name modules
that exist."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kbench"

# Lowest first: an entry may import its own layer and those before it, never one after it.
LAYERS = ("shared", "results", "host", "problems", "sandbox", "grading", "reports", "grader",
          "cli", "__main__")
# The untrusted side: a worker process imports what both sides share and itself, nothing else.
WORKER_MAY_IMPORT = {"shared", "worker"}
# Entries outside the layers: submissions and the reference are graded code, imported by none.
OUTSIDE = {"__init__", "worker", "reference", "submissions"}
MAX_TOP = 14  # __init__.py and __main__.py included
# Inside grading/: the core beside four concerns that import one way (running -> timing ->
# checking, running -> building); each entry may import of grading only what it names here.
_CORE = {"options", "context", "jobs", "channel"}
GRADING_MAY_IMPORT = {
    "options": set(), "context": {"options"}, "jobs": {"options"},
    "channel": {"options", "context"},
    "checking": _CORE, "building": _CORE, "timing": _CORE | {"checking"},
    "running": _CORE | {"checking", "building", "timing"},
}
MAX_GRADING_ENTRIES = 8  # __init__.py left out
MAX_GRADING_LEVELS = 6  # the longest chain of grading's entries importing one another
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "submissions" in path.relative_to(PACKAGE).parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The kbench modules a module imports anywhere in its body (inside functions and
    ``TYPE_CHECKING`` too: a layer that needs another only for a type still leans on it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {c for c in candidates if c in MODULES and c != name}
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _entry(module: str) -> str:
    """The top-level entry of kbench/ a module lives in (``kbench`` itself: ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycle_among_kbench_modules():
    try:
        list(TopologicalSorter(GRAPH).static_order())
    except CycleError as exc:
        pytest.fail("import cycle: " + " -> ".join(exc.args[1]))


def test_every_top_level_entry_has_a_place_and_there_are_few():
    entries = sorted(p.stem for p in PACKAGE.iterdir()
                     if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py"))
    assert len(entries) <= MAX_TOP, entries
    unplaced = [e for e in entries if e not in LAYERS and e not in OUTSIDE]
    assert not unplaced, f"top-level entries in no layer (add them to LAYERS): {unplaced}"


def test_layers_import_only_downwards():
    upward = []
    for module, imported in GRAPH.items():
        here = _entry(module)
        if here not in LAYERS:
            continue
        for other in imported:
            there = _entry(other)
            if there == "__init__":
                continue  # kbench/__init__.py holds the version, nothing else
            if there not in LAYERS or LAYERS.index(there) > LAYERS.index(here):
                upward.append(f"{module} -> {other}")
    assert not upward, "imports from a lower layer up (or into the worker):\n" + "\n".join(upward)


def _grading_entry(module: str) -> str | None:
    """The entry of grading/ a module lives in (a sub-package or a module beside them)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "grading" else None


def _grading_graph() -> dict[str, set[str]]:
    """grading's entries, each one node, and the entries each imports."""
    graph: dict[str, set[str]] = {}
    for module, imported in GRAPH.items():
        if (here := _grading_entry(module)) is not None:
            graph.setdefault(here, set()).update(
                there for o in imported if (there := _grading_entry(o)) not in (None, here))
    return graph


def test_grading_is_a_few_entries_in_few_levels():
    graph = _grading_graph()
    assert len(graph) <= MAX_GRADING_ENTRIES, sorted(graph)
    unplaced = sorted(set(graph) - set(GRADING_MAY_IMPORT))
    assert not unplaced, f"grading entries in no place (add them to GRADING_MAY_IMPORT): {unplaced}"
    levels: dict[str, int] = {}
    for entry in TopologicalSorter(graph).static_order():
        levels[entry] = 1 + max((levels[o] for o in graph.get(entry, ())), default=0)
    assert max(levels.values()) <= MAX_GRADING_LEVELS, levels


def test_grading_concerns_import_one_way():
    wrong = []
    for module, imported in GRAPH.items():
        here = _grading_entry(module)
        if here is None:
            continue
        allowed = GRADING_MAY_IMPORT.get(here, set()) | {here}
        wrong += [f"{module} -> {o}" for o in imported
                  if (there := _grading_entry(o)) is not None and there not in allowed]
    assert not wrong, "imports against grading's one way:\n" + "\n".join(sorted(wrong))


def test_the_worker_and_the_shared_modules_import_nothing_of_the_trusted_side():
    crossing = []
    for module, imported in GRAPH.items():
        allowed = {"worker": WORKER_MAY_IMPORT, "shared": {"shared"}}.get(_entry(module))
        if allowed is None:
            continue
        crossing += [f"{module} -> {o}" for o in imported
                     if _entry(o) not in allowed | {"__init__"}]
    assert not crossing, "\n".join(crossing)
    assert (PACKAGE / "__init__.py").read_text().count("import") == 0, \
        "kbench/__init__.py runs in every worker: it must import nothing"


def test_a_worker_process_loads_no_module_of_the_trusted_side():
    """What the static check above promises, seen in a fresh interpreter: importing the
    worker's entry loads kbench's shared modules and the worker's own, nothing else."""
    code = ("import sys, kbench.worker.serve; "
            "print(' '.join(m for m in sys.modules if m.split('.')[0] == 'kbench'))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=True).stdout.split()
    assert "kbench.worker.serve" in loaded
    assert [m for m in loaded if _entry(m) not in WORKER_MAY_IMPORT | {"__init__"}] == []


def test_modules_and_functions_stay_readable():
    too_long = []
    for name, path in MODULES.items():
        text = path.read_text()
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, too_long


_DOTTED = re.compile(r"\bkbench(?:\.[a-z_][a-z0-9_]*)+")
_SLASHED = re.compile(r"\bkbench/[\w/]+\.py\b")
_FILE_SUFFIXES = {"log", "yaml", "sqlite3", "json", "csv", "md", "html"}  # kbench.log: a file


def _texts() -> list[Path]:
    """The README, the docs (not the evidence: records of what older trees printed) and the
    docstrings and comments of kbench and bench (tests name missing modules on purpose)."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    code = [p for folder in ("kbench", "bench") for p in (ROOT / folder).rglob("*.py")]
    return docs + code


def _resolves(dotted: str) -> bool:
    """A module, or one attribute of a module (``kbench.grading.checking.compare.fingerprint``)."""
    parts = dotted.split(".")
    if parts[-1] in _FILE_SUFFIXES or dotted in MODULES or (ROOT / Path(*parts)).exists():
        return True
    return len(parts) > 2 and ".".join(parts[:-1]) in MODULES


def test_docs_and_docstrings_name_modules_that_exist():
    stale = []
    for path in _texts():
        text = path.read_text()
        for name in set(_DOTTED.findall(text)):
            if not _resolves(name):
                stale.append(f"{path.relative_to(ROOT)}: {name}")
        for name in set(_SLASHED.findall(text)):
            if not (ROOT / name).exists():
                stale.append(f"{path.relative_to(ROOT)}: {name}")
    assert not stale, "\n".join(sorted(stale))


def test_the_architecture_map_lists_every_module_and_only_those():
    """docs/architecture.md names each module of the tree once in its tables, by file name."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"^\| `([\w/]+\.py|[\w/]+/)` \|", text, re.M))
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if p.name != "__init__.py" and "submissions" not in p.parts
             and "reference" not in p.parts}
    missing = sorted(files - named)
    unknown = sorted(n for n in named if not (PACKAGE / n).exists())
    assert not missing and not unknown, f"not in the map: {missing}; not in the tree: {unknown}"
