"""The tests' own house: every end-to-end test runs (`make test` names each file of
tests/e2e in the order its stack process runs them, and names no other), and no test
module imports another (what modules share lives in tests/helpers.py, factories.py,
stacks.py, polling.py, tool_cases.py or a conftest)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stack_tests() -> list[str]:
    make = (ROOT / "Makefile").read_text()
    block = make[make.index("STACK_TESTS :="):make.index("PYTEST :=")]
    return re.findall(r"(test_\w+\.py)", block)


def test_the_stack_process_runs_every_e2e_file_once() -> None:
    named = stack_tests()
    assert len(named) == len(set(named)) > 0
    assert sorted(named) == sorted(p.name for p in (ROOT / "tests" / "e2e").glob("test_*.py"))


def imported_modules(path: Path) -> set[str]:
    """The dotted names a module imports, and each ``from X import name`` as ``X.name``
    too (so ``from tests.e2e import test_x`` counts)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def test_no_test_module_imports_another() -> None:
    tests = ROOT / "tests"
    modules = sorted(tests.rglob("*.py"))
    test_modules = {".".join(p.relative_to(ROOT).with_suffix("").parts)
                    for p in modules if p.name.startswith("test_")}
    assert "tests.unit.test_test_layout" in test_modules  # the walk found them
    crossing = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & test_modules)
                for p in modules}
    assert {p: names for p, names in crossing.items() if names} == {}
