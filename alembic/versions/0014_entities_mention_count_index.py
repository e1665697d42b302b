"""Entities' mention counts by id, in an index of their own: local mode's bridge step.

Local mode's neighbourhood (services/retrieval/neighbourhood.py) takes the entities of the
first step's passages rarest first: it reads the mention count of every candidate entity,
tens of thousands of them for a question near a well-connected entity of a 100k-entity graph.
Read from the table, that was a scan of every entity row (about 2 KB each with the name's
vector: 25,000 pages at 105k entities); read from this index (id, mention_count), it is an
index-only scan of a few hundred pages (3.3 MB at 105k entities). Issue 20.

The cost is on the write side: an update of an entity's mention count now updates this index
too (it can no longer be a heap-only update), and the index is built without CONCURRENTLY
(migrations run in a transaction), holding writes to entities for its build (seconds at 1M
entities).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX entities_mention_count ON entities (id) INCLUDE (mention_count)")


def downgrade() -> None:
    op.execute("DROP INDEX entities_mention_count")
