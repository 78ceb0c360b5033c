"""A batch's status changes only through jobs.batches.lifecycle.move, which refuses a
step its lifecycle does not have and stamps each status's time once."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import cast

import pytest
from sqlalchemy.orm import Session

from jobs.batches import lifecycle
from jobs.core.context import Context
from jobs.core.schema import Batch
from jobs.core.status import BatchStatus

ROOT = Path(__file__).resolve().parents[2]
NO_CTX = cast(Context, None)  # non-terminal moves write no event
NO_SESSION = cast(Session, None)


def batch(status: BatchStatus) -> Batch:
    return Batch(id="batch_x", tenant_id="proj_x", status=status)


def test_a_step_of_the_lifecycle_is_taken_and_stamped() -> None:
    b = batch(BatchStatus.VALIDATING)
    lifecycle.move(NO_CTX, NO_SESSION, b, BatchStatus.IN_PROGRESS)
    assert b.status == BatchStatus.IN_PROGRESS and b.in_progress_at is not None


def test_a_status_entered_again_keeps_its_first_time() -> None:
    b = batch(BatchStatus.FINALIZING)
    b.finalizing_at = 123
    lifecycle.move(NO_CTX, NO_SESSION, b, BatchStatus.FINALIZING)
    assert b.finalizing_at == 123


@pytest.mark.parametrize("src,dst", [(BatchStatus.COMPLETED, BatchStatus.IN_PROGRESS),
                                     (BatchStatus.VALIDATING, BatchStatus.COMPLETED),
                                     (BatchStatus.CANCELLED, BatchStatus.FINALIZING)])
def test_a_step_the_lifecycle_lacks_is_refused(src: BatchStatus, dst: BatchStatus) -> None:
    b = batch(src)
    with pytest.raises(lifecycle.IllegalMove):
        lifecycle.move(NO_CTX, NO_SESSION, b, dst)
    assert b.status == src


def _status_assignments(path: Path) -> list[int]:
    """Lines that assign a BatchStatus to some ``.status``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in flat) and \
                    node.value is not None and "BatchStatus" in ast.unparse(node.value):
                found.append(node.lineno)
    return found


def test_only_the_lifecycle_sets_a_batch_status() -> None:
    where = {p.relative_to(ROOT).as_posix(): lines for p in (ROOT / "jobs").rglob("*.py")
             if (lines := _status_assignments(p))}
    assert not where


def test_the_check_finds_an_assignment(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("b.status, b.at = BatchStatus.FAILED, 1\n")
    assert _status_assignments(f) == [1]
