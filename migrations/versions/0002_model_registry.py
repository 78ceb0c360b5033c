"""Model registry: one row per (name, version) with the repository manifest.

The 0001 ``models`` table had one row per public name pointing at a
``builtin://`` loader. Models now live in a model repository on the object
store (``models/<name>/<version>/``); a row records where (object_prefix),
what (files: a manifest of {path, bytes, sha256}), where it came from
(source), the context length, and whether it is the default version of its
name (a partial unique index allows at most one default per name).

Upgrade drops the old rows: they named no repository files, and
``inferq models import`` (run by ``inferq up``) registers the builtin models
again. Downgrade restores the 0001 table with one row per name, taken from
the default versions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 09:12:40.118204
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table('models')
    op.create_table('models',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    sa.Column('object_prefix', sa.String(length=1024), nullable=False),
    sa.Column('files', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('context_length', sa.Integer(), nullable=False),
    sa.Column('is_default', sa.Boolean(), nullable=False),
    sa.Column('owned_by', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('name', 'version')
    )
    op.create_index('uq_models_default_version', 'models', ['name'], unique=True,
                    postgresql_where=sa.text('is_default'))


def downgrade() -> None:
    rows = op.get_bind().execute(sa.text(
        "SELECT name, version, kind, owned_by, created_at FROM models WHERE is_default"
    )).mappings().all()
    op.drop_index('uq_models_default_version', table_name='models',
                  postgresql_where=sa.text('is_default'))
    op.drop_table('models')
    models = op.create_table('models',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('uri', sa.String(length=1024), nullable=False),
    sa.Column('owned_by', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    if rows:
        op.bulk_insert(models, [
            {"id": r["name"], "version": r["version"], "kind": r["kind"],
             "uri": f"builtin://{r['name']}", "owned_by": r["owned_by"],
             "created_at": r["created_at"]}
            for r in rows
        ])
