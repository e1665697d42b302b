"""A GIN index on documents.metadata (jsonb_path_ops) for filtered reads (issue 31).

A query's filters compile to ``kgstream_doc_matches`` (alembic 0022), a PL/pgSQL function the
planner cannot look into: every candidate document costs a call, and no index narrows them.
The scope now also carries a jsonpath that every admitted document matches (its first any-of
condition: ``$."source" ? (@ == "The Verge")``, services/core/doc_scope.py), tested first with
``@?``, which this index answers: the function runs only on the documents it lets through.

Built CONCURRENTLY, outside the migration's transaction (minutes at millions of documents,
without blocking the indexer or the queries); a build that failed leaves an invalid index,
dropped first, so the step can run again.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

_INDEX = "documents_metadata_path"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_INDEX}")
        op.execute(
            f"CREATE INDEX CONCURRENTLY {_INDEX} ON documents USING gin (metadata jsonb_path_ops)"
        )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
