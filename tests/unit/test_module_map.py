"""docs/ARCHITECTURE.md's module map names every module of the service's packages,
and every module it names exists.

The map is a code block under the "Module map" heading. A line that starts with a
directory (``api/``, or ``runtime/`` indented under ``workers/``) opens it; the more
indented lines below it name that directory's modules (``files.py``, ...). A package's
``__init__.py`` holding only a docstring is the directory itself and needs no entry.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "inferq", "jobs", "storage", "workers")
MODULE = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def map_block() -> list[str]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Module map", 1)[1]
    block = section.split("```", 2)[1]
    return block.splitlines()[1:]  # the first line is the fence's info string


def mapped_modules() -> set[str]:
    """Paths (from the repository root) of the modules the map names."""
    found: set[str] = set()
    dirs: list[tuple[int, str]] = []  # (indent, path) of the directories open here
    for line in map_block():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while dirs and dirs[-1][0] >= indent:
            dirs.pop()
        first = line.split()[0]
        if first.endswith("/"):
            parent = dirs[-1][1] if dirs else ""
            dirs.append((indent, parent + first))
            line = line.replace(first, "", 1)
        if dirs and dirs[0][1].rstrip("/") in PACKAGES:
            found.update(dirs[-1][1] + name for name in MODULE.findall(line))
    return found


def is_marker(path: Path) -> bool:
    """A package's ``__init__.py`` with nothing but a docstring."""
    if path.name != "__init__.py":
        return False
    body = ast.parse(path.read_text()).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES
            for p in (ROOT / pkg).rglob("*.py") if not is_marker(p)}


def test_the_map_lists_every_module() -> None:
    missing = sorted(modules() - mapped_modules())
    assert not missing, f"docs/ARCHITECTURE.md's module map does not list {missing}"


def test_every_module_in_the_map_exists() -> None:
    gone = sorted(m for m in mapped_modules() if not (ROOT / m).is_file())
    assert not gone, f"docs/ARCHITECTURE.md's module map lists modules that do not exist: {gone}"


def test_the_map_is_read_as_written() -> None:
    """The reader finds entries at both depths (a broken reader would find nothing)."""
    found = mapped_modules()
    assert {"api/errors.py", "workers/celery/tasks.py", "workers/models/chat.py"} <= found
