"""The package's layers hold by placement: every import, including one inside a function, points down.

The order of the layers is written once, in docs/architecture.md (the block after "## Layers"), and
read from there: a unit (a sub-package, or a module directly under groundup/) may import units on a
lower floor, and units listed before it on its own floor. This test also refuses import cycles between
modules (an import inside a function that "fixes" a cycle still counts) and imports inside functions
outside the command handlers, where a module's real dependencies would hide.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "groundup"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Modules whose functions may import: the command handlers (they load their stage only when the verb
# runs, so `groundup VERB --help` answers without importing torch) and the entry points.
HANDLER = re.compile(r"(^|\.)(commands|data_commands|cli|__main__)$")


def read_floors(text: str) -> list[list[str]]:
    """The floors of docs/architecture.md's layer block, lowest first: each a list of unit names."""
    match = re.search(r"## Layers.*?```text\n(.*?)```", text, re.S)
    assert match, f"{ARCHITECTURE}: no ```text block after '## Layers'"
    floors = []
    for line in match.group(1).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        names = line.split("|")[0].split()
        floors.append([n.rstrip("/") for n in names])
    return floors


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted
    line: int
    local: bool  # inside a function
    typing_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[Import] = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, local: bool, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner_local = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            inner_typing = typing_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(name, alias.name, child.lineno, local, typing_only))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:  # `from pkg import submodule` depends on the submodule alone
                    sub = f"{target}.{alias.name}"
                    found.append(Import(name, sub if sub in modules else target, child.lineno, local, typing_only))
            visit(child, inner_local, inner_typing)

    visit(tree, False, False)
    return [i for i in found if i.target == "groundup" or i.target.startswith("groundup.")]


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "groundup"


@pytest.fixture(scope="module")
def graph():
    modules = all_modules()
    edges = [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]
    return modules, edges


def test_every_unit_has_a_floor(graph):
    modules, _ = graph
    placed = {u for floor in read_floors(ARCHITECTURE.read_text()) for u in floor}
    unplaced = sorted({unit_of(m) for m in modules} - placed)
    assert not unplaced, f"place these in docs/architecture.md's layer block: {unplaced}"
    gone = sorted(placed - {unit_of(m) for m in modules})
    assert not gone, f"docs/architecture.md's layer block names units that do not exist: {gone}"


def test_imports_point_down(graph):
    _, edges = graph
    order = [u for floor in read_floors(ARCHITECTURE.read_text()) for u in floor]
    rank = {u: i for i, u in enumerate(order)}
    upward = [f"{e.source}:{e.line} imports {e.target} ({unit_of(e.source)} sits below {unit_of(e.target)})"
              for e in edges if rank[unit_of(e.target)] > rank[unit_of(e.source)]]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def test_no_import_cycles(graph):
    modules, edges = graph
    succ: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        if not e.typing_only and e.target in modules and e.target != e.source:
            succ[e.source].add(e.target)
    cycles = strongly_connected(succ)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_imports_inside_functions_only_in_command_handlers(graph):
    _, edges = graph
    hidden = sorted({f"{e.source}:{e.line} imports {e.target}" for e in edges
                     if e.local and not HANDLER.search(e.source)})
    assert not hidden, ("imports inside functions outside the command handlers (import at the top of the "
                        "module; a cycle it would create is a layering fault):\n" + "\n".join(hidden))


def strongly_connected(succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in succ:
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_the_checks_see_what_they_guard(tmp_path):
    """The parser finds function-local and relative imports, and the cycle finder finds a cycle."""
    pkg = tmp_path / "groundup" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from groundup.x import b\n")
    (pkg / "b.py").write_text("from . import a\nfrom groundup.errors import E\n")
    mods = {"groundup.x": pkg / "__init__.py", "groundup.x.a": pkg / "a.py", "groundup.x.b": pkg / "b.py"}
    a = imports_of("groundup.x.a", pkg / "a.py", mods)
    b = imports_of("groundup.x.b", pkg / "b.py", mods)
    assert [(i.target, i.local) for i in a] == [("groundup.x.b", True)]
    assert [(i.target, i.local) for i in b] == [("groundup.x.a", False), ("groundup.errors", False)]
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) != []
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    floors = read_floors("## Layers\n\n```text\n# comment\nerrors io | the ground\nmodel/ | the model\n```\n")
    assert floors == [["errors", "io"], ["model"]]
