"""When each handled event happened and was published, beside when it was handled, so status
and the dashboard can report freshness (commit time minus ``occurred_at``, and minus the Kafka
record timestamp) from the database (issue 9). ``processed_at`` is set again when the outcome
is settled, just before the event's transaction commits. Both new columns are NULL for rows
written before this revision (and ``published_at`` for events that came with no record
timestamp). Indexes on the three tables' times serve the windows status and the dashboard read
(the last minutes, the last hour).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE processed_events ADD COLUMN occurred_at timestamptz")
    op.execute("ALTER TABLE processed_events ADD COLUMN published_at timestamptz")
    op.execute("CREATE INDEX processed_events_processed_at ON processed_events (processed_at)")
    op.execute("CREATE INDEX dead_letters_created_at ON dead_letters (created_at)")
    op.execute("CREATE INDEX token_usage_created_at ON token_usage (created_at)")


def downgrade() -> None:
    op.execute("DROP INDEX token_usage_created_at")
    op.execute("DROP INDEX dead_letters_created_at")
    op.execute("DROP INDEX processed_events_processed_at")
    op.execute("ALTER TABLE processed_events DROP COLUMN published_at")
    op.execute("ALTER TABLE processed_events DROP COLUMN occurred_at")
