"""Retained history for ``as_of`` reads (issue 31, step 4): what each document said and who
could read it, version by version, by the documents' own clock (``occurred_at``).

- ``chunks.born_at``: the ``occurred_at`` of the version that brought the chunk in. A chunk
  kept across versions keeps its time, so a current chunk existed at ``t`` exactly when
  ``born_at <= t``. Rows indexed before this revision get ``-infinity`` (a constant default:
  no rewrite): they existed when history began, and ``as_of`` never reaches further back.
- ``chunk_history``: a chunk a new version or a delete removed, under its own id, with
  ``[valid_from, valid_to)`` (its ``born_at``, the remover's ``occurred_at``). Its text,
  embedding and full-text vector; no mentions or evidence (``as_of`` reads passages, not the
  graph: docs/retrieval.md, "As of").
- ``document_versions``: the documents row a new version, a change of access or metadata, or
  a delete replaced, with ``[valid_from, valid_to)``.
- ``history_horizon``: the time from which history is complete (NULL: not kept, as_of
  refused); the indexer moves it as it prunes what was replaced more than
  KGSTREAM_HISTORY_DAYS ago.

New tables and a column with a constant default: no rewrite, no long lock.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS born_at timestamptz NOT NULL"
        " DEFAULT '-infinity'"
    )
    op.execute(
        "CREATE TABLE IF NOT EXISTS chunk_history ("
        " id bigint PRIMARY KEY,"
        " doc_id text NOT NULL,"
        " ord int NOT NULL,"
        " text text NOT NULL,"
        " embedding vector NOT NULL,"
        " tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,"
        " valid_from timestamptz NOT NULL,"
        " valid_to timestamptz NOT NULL)"
    )
    op.execute("CREATE INDEX IF NOT EXISTS chunk_history_doc ON chunk_history (doc_id)")
    op.execute("CREATE INDEX IF NOT EXISTS chunk_history_to ON chunk_history (valid_to)")
    op.execute("CREATE INDEX IF NOT EXISTS chunk_history_tsv ON chunk_history USING gin (tsv)")
    op.execute(
        "CREATE TABLE IF NOT EXISTS document_versions ("
        " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " doc_id text NOT NULL,"
        " tenant text,"
        " title text NOT NULL,"
        " version bigint,"
        " metadata jsonb NOT NULL,"
        " acl text[],"
        " valid_from timestamptz NOT NULL,"
        " valid_to timestamptz NOT NULL)"
    )
    op.execute(
        "CREATE INDEX IF NOT EXISTS document_versions_doc ON document_versions (doc_id, valid_to)"
    )
    op.execute("CREATE INDEX IF NOT EXISTS document_versions_to ON document_versions (valid_to)")
    op.execute(
        "CREATE TABLE IF NOT EXISTS history_horizon ("
        " one boolean PRIMARY KEY DEFAULT true CHECK (one),"
        " kept_since timestamptz)"
    )
    # Kept from now on (KGSTREAM_HISTORY_DAYS defaults to 7), or from the beginning for a
    # database with no document yet; an indexer set to keep nothing clears it when it starts
    # (services/indexer/graph_store/history.py).
    op.execute(
        "INSERT INTO history_horizon (one, kept_since) VALUES (true, CASE WHEN EXISTS"
        " (SELECT 1 FROM documents) THEN now() ELSE '-infinity' END) ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS history_horizon")
    op.execute("DROP TABLE IF EXISTS document_versions")
    op.execute("DROP TABLE IF EXISTS chunk_history")
    op.execute("ALTER TABLE chunks DROP COLUMN IF EXISTS born_at")
