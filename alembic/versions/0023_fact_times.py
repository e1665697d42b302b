"""Time-scoped facts (issue 31, step 2): ``fact_times``, when the facts of a sentence held.

One row per time a sentence of a chunk states (services/core/time_spans.py): the days
``[valid_from, valid_to)`` it covers, NULL for an open side, with the words that state it. The
facts it scopes are the ones that sentence states: the mentions whose ``sentence`` it is (an
entity's attributes: born, founded, owned) and the relationship evidence whose ``sentence`` it
is, in the same chunk. Rows are written with the chunk's mentions and evidence, cleared with them
(a document resolved again) and cascade with the chunk (a new version, a delete), so they follow
their documents through updates, deletes, curations and rebuilds like every other fact.

``holds`` (a daterange, generated) carries a GiST index: "which facts held during [a, b]" is
``holds && daterange(a, b, '[]')`` and "at t" is ``holds @> t``; the fact's side is reached by
``(chunk_id, sentence)`` through the chunk indexes of mentions and evidence. A query's
``filters.held`` asks whether a document states a fact that held in a window
(``fact_times_doc``).

Documents indexed before this revision have no rows until they are indexed again (a rebuild
from the topic, docs/operations.md). A new, empty table: no rewrite, no lock on the others.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE IF NOT EXISTS fact_times ("
        " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " chunk_id bigint NOT NULL REFERENCES chunks ON DELETE CASCADE,"
        " doc_id text NOT NULL,"
        " sentence text NOT NULL,"
        " valid_from date,"
        " valid_to date,"
        " expression text NOT NULL,"
        " holds daterange GENERATED ALWAYS AS (daterange(valid_from, valid_to, '[)')) STORED,"
        " CHECK (valid_from IS NULL OR valid_to IS NULL OR valid_from < valid_to))"
    )
    op.execute("CREATE INDEX IF NOT EXISTS fact_times_chunk ON fact_times (chunk_id)")
    op.execute("CREATE INDEX IF NOT EXISTS fact_times_doc ON fact_times (doc_id)")
    op.execute("CREATE INDEX IF NOT EXISTS fact_times_holds ON fact_times USING gist (holds)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS fact_times")
