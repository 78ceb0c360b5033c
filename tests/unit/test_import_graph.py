"""The import graph of the service's packages: no circles, layers that import one way,
and no function-level import where nothing needs one.

Edges are the imports that run: a module's own and those inside its functions (an
``if TYPE_CHECKING:`` block never runs and draws none). ``from pkg import name``
draws an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "inferq", "jobs", "storage", "workers")
# jobs/'s sub-packages, each importing only those before it (and itself).
JOBS_LAYERS = ("core", "protocol", "fleet", "tenants", "webhooks", "asyncjobs", "batches", "slo",
               "realtime")
# What each top-level package may import of the others.
ALLOWED = {
    "storage": {"storage"},
    "jobs": {"jobs", "storage"},
    "api": {"api", "jobs", "storage"},
    "workers": {"workers", "jobs", "storage"},
    "inferq": {"inferq", "cli", "jobs"},
    "cli": {"cli", "api", "jobs", "storage", "workers"},
}
# Where a function-level import of the service's own modules may stand: the workers
# import torch-bound modules lazily (a simulated or control worker never loads torch),
# and the command line keeps each command's start quick.
LAZY_ALLOWED = ("workers", "cli", "inferq")


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = p
    return found


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> Iterator[tuple[str, bool]]:
    """(imported name, whether inside a function) for every import that runs."""
    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for sub in child.orelse:
                    yield from walk(sub, in_function)
                continue
            if isinstance(child, ast.Import):
                yield from ((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                yield from ((f"{child.module}.{a.name}", in_function) for a in child.names)
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            yield from walk(child, inner)
    yield from walk(tree, False)


def graph() -> dict[str, dict[str, bool]]:
    """module -> {module it imports: whether only inside functions}."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: dict[str, dict[str, bool]] = {}
    for m, path in mods.items():
        edges: dict[str, bool] = {}
        for name, in_function in imports(ast.parse(path.read_text())):
            target = resolve(name)
            if target is not None and target != m:
                edges[target] = edges.get(target, True) and in_function
        out[m] = edges
    return out


def cycles(g: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_the_finder_sees_a_circle() -> None:
    """A circle drawn by hand is found (a broken finder would pass everything)."""
    assert cycles({"a": {"b": False}, "b": {"c": True}, "c": {"a": False}, "d": {}}) == [
        ["a", "b", "c"]]


def test_packages_import_one_way() -> None:
    wrong = sorted(f"{m} -> {t}" for m, edges in graph().items() for t in edges
                   if t.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not wrong


def test_jobs_layers_import_downwards() -> None:
    rank = {name: i for i, name in enumerate(JOBS_LAYERS)}
    wrong = []
    for m, edges in graph().items():
        parts = m.split(".")
        if parts[0] != "jobs" or len(parts) < 3:
            continue
        for t in edges:
            tp = t.split(".")
            if tp[0] == "jobs" and len(tp) >= 2 and rank[tp[1]] > rank[parts[1]]:
                wrong.append(f"{m} -> {t}")
    assert not sorted(wrong)


def test_every_jobs_module_is_in_a_layer() -> None:
    stray = sorted(m for m in modules() if m.startswith("jobs.") and
                   m.split(".")[1] not in JOBS_LAYERS)
    assert not stray


def test_no_function_level_import_of_our_own_modules_outside_lazy_places() -> None:
    hidden = sorted(f"{m} -> {t}" for m, edges in graph().items()
                    if m.split(".")[0] not in LAZY_ALLOWED
                    for t, only_in_function in edges.items() if only_in_function)
    assert not hidden
