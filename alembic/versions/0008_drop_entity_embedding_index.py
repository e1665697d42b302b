"""Drop the HNSW index on entities.embedding: no query orders entities by vector distance.

Entity embeddings are read only by entity resolution, which finds candidates by trigram
(entities_name_trgm) and computes the cosine of those few rows directly. Every entity insert
paid for a graph-index insert nobody searched (issue 10: PostgreSQL CPU during ingest).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS entities_embedding_hnsw")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX entities_embedding_hnsw ON entities USING hnsw (embedding vector_cosine_ops)"
    )
