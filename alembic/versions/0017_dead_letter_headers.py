"""Dead letters keep the record's headers (issue 22, CloudEvents in): a CloudEvent in the Kafka
binding's binary mode carries its attributes in ``ce_*`` headers, so its value alone is not the
event. ``dead_letters.headers`` holds them in order as a JSON array of
``{"key": ..., "value_base64": ...}`` (``value_base64`` null for a null header value);
`kgstream dlq replay` sends them again with the value. Rows stored before have none (``[]``).

Adding a column with a constant default rewrites nothing (PostgreSQL 11+).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE dead_letters ADD COLUMN headers jsonb NOT NULL DEFAULT '[]'")


def downgrade() -> None:
    op.execute("ALTER TABLE dead_letters DROP COLUMN headers")
