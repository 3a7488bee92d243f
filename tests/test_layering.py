"""The source tree keeps its shape: imports point down the stages, never in a circle, and nothing grows huge.

A static scan of `src/breakwater` (no imports are executed): every `import` and `from ... import` is read
from the syntax tree, including those under `if TYPE_CHECKING:` and inside functions, because a lazy
import is still a dependency and a cycle closed by one is still a cycle. docs/architecture.md explains
the stages; this file is where their order is written down.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Read from the checkout, not imported: importing breakwater would cost more than the whole scan.
SRC = Path(__file__).resolve().parents[1] / "src" / "breakwater"
ROOT = "breakwater"

#: The stages, low → high. A module may import its own stage's layer or a lower one, never a higher one.
#: Keys are the first name under `breakwater.`: a subpackage or a top-level module.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "core",
        frozenset(
            {"_clock", "_backoff", "_codec", "_paths", "_platform", "_startup", "_wire", "_groups", "_sqlite", "errors", "status"}
        ),
    ),
    ("config", frozenset({"config"})),
    ("wire extensions", frozenset({"tasks", "idempotency"})),
    ("connect, catalog, journal", frozenset({"auth", "connect", "catalog", "journal"})),
    ("gate", frozenset({"gate"})),
    ("state, observe", frozenset({"state", "observe"})),
    ("library", frozenset({"_breakwater"})),
    ("gateway", frozenset({"gateway"})),
    # `breakwater` itself (the public door, `__init__.py`) re-exports from every stage, so it sits on top.
    ("entry points", frozenset({"", "cli", "testing", "lab", "testserver", "__main__"})),
)

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: Modules allowed over MAX_MODULE_LINES, each with its reason. Keep it short; a reason is not "it grew".
LONG_MODULES: dict[str, str] = {}

#: Functions allowed over MAX_FUNCTION_LINES ("path::Qualified.name"), each with its reason.
LONG_FUNCTIONS: dict[str, str] = {
    "lab/engine.py::_Sim.run": "the simulator's event loop: one dispatch over every event kind, read top to bottom",
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. "breakwater.gate._gate" ("breakwater" for the package's __init__)
    rel: str  # path under src/breakwater
    lines: int
    #: (dotted module named by the statement, alias names, relative level, line) per import statement.
    imports: tuple[tuple[str, tuple[str, ...], int, int], ...]
    #: (qualified name, length in lines) per function or method, nested ones included.
    functions: tuple[tuple[str, int], ...]

    @property
    def is_package(self) -> bool:
        return self.rel.endswith("__init__.py")


def _statements(body: list[ast.stmt], prefix: str, imports: list[Any], funcs: list[tuple[str, int]]) -> None:
    """Walk statements only (imports and defs are statements; expressions are most of a tree's nodes)."""
    for node in body:
        if isinstance(node, ast.Import):
            imports.extend((alias.name, (), 0, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.module or "", tuple(a.name for a in node.names), node.level, node.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            funcs.append((name, (node.end_lineno or node.lineno) - node.lineno + 1))
            _statements(node.body, f"{name}.", imports, funcs)
        elif isinstance(node, ast.ClassDef):
            _statements(node.body, f"{prefix}{node.name}.", imports, funcs)
        else:
            for value in vars(node).values():
                if isinstance(value, list):
                    for item in value:
                        if isinstance(item, ast.stmt):
                            _statements([item], prefix, imports, funcs)
                        elif isinstance(item, (ast.ExceptHandler, ast.match_case)):
                            _statements(item.body, prefix, imports, funcs)


@functools.cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = (ROOT, *path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        text = path.read_text(encoding="utf-8")
        imports: list[Any] = []
        funcs: list[tuple[str, int]] = []
        _statements(ast.parse(text, str(path)).body, "", imports, funcs)
        name = ".".join(parts)
        rel = path.relative_to(SRC).as_posix()
        found[name] = Module(name, rel, text.count("\n") + 1, tuple(imports), tuple(funcs))
    return found


def imported(module: Module, known: dict[str, Module]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import of a breakwater module, wherever it is written."""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for base, names, level, line in module.imports:
        if level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        if base != ROOT and not base.startswith(ROOT + "."):
            continue
        if not names:  # `import breakwater.x.y`
            yield base, line
        for alias in names:
            # `from breakwater import _paths` imports the submodule, not the public door.
            sub = f"{base}.{alias}"
            yield (sub if sub in known else base), line


@functools.cache
def edges() -> dict[str, dict[str, int]]:
    """module → {module it imports: first line}, within breakwater, self-imports left out."""
    known = modules()
    out: dict[str, dict[str, int]] = {}
    for name, module in known.items():
        targets: dict[str, int] = {}
        for target, line in imported(module, known):
            if target != name and target in known:
                targets.setdefault(target, line)
        out[name] = targets
    return out


def stage_of(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def layer_of(name: str) -> int:
    stage = stage_of(name)
    for rank, (_, members) in enumerate(LAYERS):
        if stage in members:
            return rank
    raise AssertionError(f"{name}: stage {stage!r} is in no layer; add it to LAYERS in tests/test_layering.py")


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def long_modules() -> dict[str, int]:
    return {m.rel: m.lines for m in modules().values() if m.lines > MAX_MODULE_LINES}


def long_functions() -> dict[str, int]:
    return {f"{m.rel}::{name}": length for m in modules().values() for name, length in m.functions if length > MAX_FUNCTION_LINES}


def test_the_scan_sees_the_whole_tree() -> None:
    """A scan that found nothing would pass everything: check it reads the package and its edges."""
    graph = edges()
    assert {"breakwater", "breakwater.errors", "breakwater.gate._gate", "breakwater.cli"} <= set(graph)
    assert sum(len(targets) for targets in graph.values()) > 100
    assert "breakwater._breakwater" in graph["breakwater.gateway._server"]


SAMPLE = """
from typing import TYPE_CHECKING
import breakwater.status
from breakwater import _paths, Breakwater
from . import _sibling
if TYPE_CHECKING:
    from breakwater.gateway._server import Gateway
class C:
    def method(self):
        try:
            from ..config import Config
        except ImportError:
            import breakwater.lab.engine as engine
        async def inner():
            with open("x"):
                from breakwater.cli import main
"""


def test_lazy_type_checking_and_relative_imports_all_count() -> None:
    imports: list[Any] = []
    funcs: list[tuple[str, int]] = []
    _statements(ast.parse(SAMPLE).body, "", imports, funcs)
    known = {
        name: Module(name, "x.py", 1, (), ())
        for name in ("breakwater", "breakwater._paths", "breakwater.gate._sibling", "breakwater.config")
    }
    module = Module("breakwater.gate._here", "gate/_here.py", 1, tuple(imports), tuple(funcs))
    found = {target for target, _ in imported(module, known)}
    assert found == {
        "breakwater.status",
        "breakwater._paths",  # a submodule named in `from breakwater import ...`, not the public door
        "breakwater",  # `Breakwater` is a name of the door itself
        "breakwater.gate._sibling",
        "breakwater.gateway._server",
        "breakwater.config",
        "breakwater.lab.engine",
        "breakwater.cli",
    }
    assert [name for name, _ in funcs] == ["C.method", "C.method.inner"]


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_module_import_cycle_not_even_a_lazy_one() -> None:
    found = cycles(edges())
    assert not found, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(" ↔ ".join(c) for c in found)


def test_imports_never_point_up_the_stages() -> None:
    upward = [
        f"{modules()[src].rel}:{line}: {src} imports {dst} ({LAYERS[layer_of(src)][0]} may not import {LAYERS[layer_of(dst)][0]})"
        for src, targets in edges().items()
        for dst, line in targets.items()
        if layer_of(dst) > layer_of(src)
    ]
    assert not upward, "imports from a lower stage to a higher one:\n" + "\n".join(sorted(upward))


def test_no_module_over_600_lines_outside_the_allow_list() -> None:
    found = long_modules()
    over = {rel: n for rel, n in found.items() if rel not in LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split by concept): {over}"
    stale = sorted(set(LONG_MODULES) - set(found))
    assert not stale, f"allowed long modules that are no longer long (remove them from LONG_MODULES): {stale}"


def test_no_function_over_80_lines_outside_the_allow_list() -> None:
    found = long_functions()
    over = {name: n for name, n in found.items() if name not in LONG_FUNCTIONS}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split into named steps): {over}"
    stale = sorted(set(LONG_FUNCTIONS) - set(found))
    assert not stale, f"allowed long functions that are no longer long (remove them from LONG_FUNCTIONS): {stale}"


def test_every_allowance_gives_a_reason() -> None:
    for name, reason in {**LONG_MODULES, **LONG_FUNCTIONS}.items():
        assert len(reason.split()) >= 4, f"{name}: say why it may stay long"
