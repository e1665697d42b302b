"""Weak relationships, marked: ``relationships.weak`` is true for a co-occurrence that rests on
one piece of evidence (issue 21, deliverable 2; docs/curation.md, "Pruning").

The mark is a generated column of the row's own type and evidence count, which the graph
store rebuilds from the remaining evidence at every insert, update and delete. So a weak edge
becomes strong the moment a second piece of evidence arrives and weak again when a delete
takes it away: exact by construction, with nothing to run and nothing deleted. Local mode
leaves weak edges out of its walk when KGSTREAM_QUERY_LOCAL_HIDE_WEAK_EDGES is on; path mode,
entity neighbours and the communities keep every edge.

Adding a stored generated column rewrites the table (minutes at 1M entities' relationships,
holding writes to it): run the migration job before rolling out the new image.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE relationships ADD COLUMN weak boolean NOT NULL"
        " GENERATED ALWAYS AS (type = 'co_occurs' AND evidence_count <= 1) STORED"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE relationships DROP COLUMN weak")
