"""A dead letter is identified by its record, not by its broker offset alone.

A broker that loses its log (tansu memory storage after a restart) or a topic deleted and
created again starts every partition at offset 0 again, so a new bad record can arrive at the
(topic, partition, offset) of an old dead letter. Under the old unique key it was taken for a
redelivery of the old one: not stored, not published, yet acknowledged (issue 18, finding 3).

The identity is now the coordinates plus the record's broker timestamp and the SHA-256 of its
value. A redelivery carries the same timestamp and bytes (both are stored in the broker's log)
and still finds its row; a different record at a reused offset differs in its bytes, and the
same bytes published again differ in their timestamp. Rows from before this migration have no
timestamp (NULL, and NULLs count as equal so a redelivery without one still dedupes).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE dead_letters ADD COLUMN record_timestamp timestamptz")
    # Generated, so it is the digest of the stored bytes by construction (backfilled here too).
    op.execute(
        "ALTER TABLE dead_letters ADD COLUMN raw_sha256 bytea"
        " GENERATED ALWAYS AS (sha256(raw)) STORED NOT NULL"
    )
    op.execute("ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_topic_partition_offset_key")
    op.execute(
        "ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_record UNIQUE NULLS NOT DISTINCT"
        ' (topic, partition, "offset", record_timestamp, raw_sha256)'
    )


def downgrade() -> None:
    # Fails while two letters share an offset: that is the data the old key cannot hold.
    op.execute("ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_record")
    op.execute(
        "ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_topic_partition_offset_key"
        ' UNIQUE (topic, partition, "offset")'
    )
    op.execute("ALTER TABLE dead_letters DROP COLUMN raw_sha256")
    op.execute("ALTER TABLE dead_letters DROP COLUMN record_timestamp")
