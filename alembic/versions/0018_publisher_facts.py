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

Adding a column with a constant default does not rewrite a table (PostgreSQL 11+); the new
unique index on relationship_evidence is built in full (minutes at millions of rows: run the
migration job before rolling out the new image).

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

_ORIGIN = (
    " ADD COLUMN origin text NOT NULL DEFAULT 'extracted'"
    " CHECK (origin IN ('extracted', 'publisher'))"
)


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN facts jsonb")
    op.execute("ALTER TABLE mentions" + _ORIGIN)
    op.execute("ALTER TABLE relationship_evidence" + _ORIGIN)
    op.execute(
        "ALTER TABLE relationship_evidence"
        " DROP CONSTRAINT relationship_evidence_relationship_id_chunk_id_key,"
        " ADD CONSTRAINT relationship_evidence_relationship_id_chunk_id_origin_key"
        " UNIQUE (relationship_id, chunk_id, origin)"
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
