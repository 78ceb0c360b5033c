"""Every end-to-end test runs: `make test` names each file of tests/e2e in the order its
stack process runs them, and names no other."""

from __future__ import annotations

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
