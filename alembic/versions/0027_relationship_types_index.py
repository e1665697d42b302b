"""An index on relationships.type (issue 33): the graph's relationship types, read by typed
graph plans from questions (services/retrieval/plan_rules.py ``GraphWords``, once a minute per
query process), come from a loose index scan (one probe per distinct type) instead of a
sequential scan of every relationship (2.4M rows, ~0.3 s at 1M entities); plans that name
relationship types also filter on it.

Built CONCURRENTLY, outside the migration's transaction (seconds at millions of relationships,
without blocking the indexer or the queries); a build that failed leaves an invalid index,
dropped first, so the step can run again.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_INDEX = "relationships_type"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_INDEX}")
        op.execute(f"CREATE INDEX CONCURRENTLY {_INDEX} ON relationships (type)")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
