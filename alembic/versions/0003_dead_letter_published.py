"""Dead letters remember when they reached the dead-letter topic, so a record redelivered
after a crash is not published there twice.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE dead_letters ADD COLUMN published_at timestamptz")
    # Rows from before this migration were published when they were written.
    op.execute("UPDATE dead_letters SET published_at = created_at")


def downgrade() -> None:
    op.execute("ALTER TABLE dead_letters DROP COLUMN published_at")
