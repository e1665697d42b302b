"""Facts from the publisher (issue 22): document event v2 may carry the entities and
relationships its publisher already knows (docs/ingest.md, "Facts the publisher already knows").

- ``documents.facts``: the event's facts as services/core/facts.py ``stored_form`` keeps them
  (NULL for a document without any), so a curation's apply, a replay and a rebuild write them
  again exactly; a new version replaces them, a delete clears them with the document.
- ``mentions.origin``, ``relationship_evidence.origin``: where a row comes from, ``extracted``
  (every row so far) or ``publisher``. A provided fact is anchored to its document's first
  chunk with no span (services/indexer/provided.py), so the readers and the access rules that
  go through chunks and documents see it as they see extracted rows.
- One piece of evidence per relationship, chunk and origin: a publisher's relationship on the
  first chunk may repeat an extracted one of the same chunk.

Adding a column with a constant default does not rewrite a table (PostgreSQL 11+), and the
origin checks are added NOT VALID (no scan: the existing rows hold the default). The new unique
key on relationship_evidence is built CONCURRENTLY outside the migration's transaction
(minutes at millions of rows, without blocking the indexer or the queries), then swapped in.
Every step can run again after a failure.

Downgrade deletes the publisher's rows but does not recompute what they supported (mention
counts, weights, descriptions, entities only they kept): after a downgrade, rebuild the graph
from the topic (docs/operations.md, "Re-indexing from the topic").

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_KEY = "relationship_evidence_relationship_id_chunk_id_origin_key"


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN IF NOT EXISTS facts jsonb")
    for table in ("mentions", "relationship_evidence"):
        # A constant default: no rewrite. The check is NOT VALID: every existing row has the
        # default, and new rows are checked; validating would scan the table under the lock.
        op.execute(
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS origin text NOT NULL DEFAULT 'extracted'"
        )
        op.execute(
            f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_origin_check,"
            f" ADD CONSTRAINT {table}_origin_check"
            " CHECK (origin IN ('extracted', 'publisher')) NOT VALID"
        )
    # The new unique key is built CONCURRENTLY, outside the transaction (the columns above are
    # committed first, so their brief exclusive lock is not held through the build): writers
    # and readers go on meanwhile. A build that failed leaves an invalid index: dropped first.
    with op.get_context().autocommit_block():
        op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_KEY}")
        op.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {_KEY}"
            " ON relationship_evidence (relationship_id, chunk_id, origin)"
        )
    op.execute(
        "ALTER TABLE relationship_evidence"
        " DROP CONSTRAINT IF EXISTS relationship_evidence_relationship_id_chunk_id_key,"
        f" ADD CONSTRAINT {_KEY} UNIQUE USING INDEX {_KEY}"
    )


def downgrade() -> None:
    op.execute("DELETE FROM relationship_evidence WHERE origin = 'publisher'")
    op.execute("DELETE FROM mentions WHERE origin = 'publisher'")
    op.execute(
        "ALTER TABLE relationship_evidence"
        " DROP CONSTRAINT relationship_evidence_relationship_id_chunk_id_origin_key,"
        " ADD CONSTRAINT relationship_evidence_relationship_id_chunk_id_key"
        " UNIQUE (relationship_id, chunk_id)"
    )
    op.execute("ALTER TABLE relationship_evidence DROP COLUMN origin")
    op.execute("ALTER TABLE mentions DROP COLUMN origin")
    op.execute("ALTER TABLE documents DROP COLUMN facts")
