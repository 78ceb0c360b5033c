"""The migration history is one linear chain with a single head (read from the
scripts; no database)."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from storage.db import alembic_config


def test_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("postgresql+psycopg://u@127.0.0.1:1/x"))
    heads = script.get_heads()
    assert len(heads) == 1, heads
    # the history is one linear chain from base to the head
    revs = list(script.walk_revisions("base", "heads"))
    assert revs[0].revision == heads[0]
    assert revs[-1].down_revision is None
    assert all(not r.is_merge_point for r in revs)
