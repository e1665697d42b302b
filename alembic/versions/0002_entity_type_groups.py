"""Entity identity = (normalised key, type group): "Washington" the person and the place are
two entities; untyped mentions (titles, MISC) attach to whichever exists.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE entities ADD COLUMN type_group text NOT NULL DEFAULT 'ANY'")
    op.execute("ALTER TABLE entities DROP CONSTRAINT entities_key_key")
    op.execute("ALTER TABLE entities ADD CONSTRAINT entities_key_group UNIQUE (key, type_group)")


def downgrade() -> None:
    op.execute("ALTER TABLE entities DROP CONSTRAINT entities_key_group")
    op.execute("ALTER TABLE entities ADD CONSTRAINT entities_key_key UNIQUE (key)")
    op.execute("ALTER TABLE entities DROP COLUMN type_group")
