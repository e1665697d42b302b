"""Erasures: a delete's node changes, kept apart from the change log.

A community whose member a delete changed or removed after its snapshot was read is withheld
from every caller until a newer snapshot (docs/security.md, "Erasure"). The withheld set was
found by scanning every graph_changes row past the snapshot's watermark and looking up each
node row's event in processed_events: after a bulk load that is millions of rows on every
global query and /v1/communities request (issue 18, erasure cost). The delete now also writes
its node changes here, in its own transaction, under their graph_changes ids: the set is a
primary-key range scan over the deletes since the snapshot, whatever else changed.

Rows are never updated or removed, so (count, newest id) past a watermark changes whenever a
delete commits, which is what the query API's cache is keyed on (services/core/erasure.py).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE erasures ("
        " change_id bigint PRIMARY KEY,"  # the graph_changes id: compared with watermarks
        " entity_id bigint NOT NULL)"
    )
    # Deletes already applied; only those past the published watermark can matter, but a
    # building snapshot's watermark is not known yet, so every one is copied.
    op.execute(
        "INSERT INTO erasures (change_id, entity_id)"
        " SELECT g.id, g.ref_id FROM graph_changes g JOIN processed_events p"
        " ON p.event_id = g.event_id AND p.outcome = 'deleted' WHERE g.kind = 'node'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE erasures")
