"""Where each partition's indexing stands (issue 8, finding 8): the next offset to handle,
when it last moved, and whether a transient failure is being retried, so `kgstream status`
and the API can tell a stalled consumer from an idle one.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE indexer_progress (
            consumer_group text NOT NULL,
            topic          text NOT NULL,
            partition      integer NOT NULL,
            next_offset    bigint NOT NULL,
            handled_total  bigint NOT NULL DEFAULT 0,
            updated_at     timestamptz NOT NULL DEFAULT now(),
            retrying_since timestamptz,
            last_error     text,
            last_error_at  timestamptz,
            PRIMARY KEY (consumer_group, topic, partition)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE indexer_progress")
