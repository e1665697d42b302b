"""Which log each consumer group reads, and what a replaced log took along (issue 30).

``topic_identities`` keeps the documents topic's id (Kafka's topic id, KIP-516) per consumer
group; ``indexer_progress.seen_end_offset`` the greatest end offset the indexer saw per
partition; ``broker_losses`` one row per replaced log found at an indexer's start, with the
offsets acknowledged by the broker and never applied and how many events accepted over HTTP
were published again (services/indexer/topic_identity.py); ``accepted_events`` the events the
query API answered 202 for, until the indexer has them (services/core/accepted_events.py).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE topic_identities ("
        " consumer_group text NOT NULL, topic text NOT NULL, topic_id text NOT NULL,"
        " seen_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer_group, topic))"
    )
    op.execute(
        "CREATE TABLE broker_losses ("
        " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " detected_at timestamptz NOT NULL DEFAULT now(),"
        " consumer_group text NOT NULL, topic text NOT NULL,"
        " old_topic_id text NOT NULL, new_topic_id text NOT NULL,"
        " records bigint NOT NULL, ranges jsonb NOT NULL,"
        " republished bigint NOT NULL DEFAULT 0)"
    )
    op.execute(
        "CREATE TABLE accepted_events ("
        " event_id text PRIMARY KEY, doc_id text NOT NULL, value bytea NOT NULL,"
        " accepted_at timestamptz NOT NULL DEFAULT now())"
    )
    # A constant default: no table rewrite.
    op.execute("ALTER TABLE indexer_progress ADD COLUMN seen_end_offset bigint NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE indexer_progress DROP COLUMN seen_end_offset")
    op.execute("DROP TABLE accepted_events")
    op.execute("DROP TABLE broker_losses")
    op.execute("DROP TABLE topic_identities")
