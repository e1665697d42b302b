"""Entity-name trigram indexes without GIN's pending list (fastupdate off).

Entity resolution searches ``entities_name_trgm`` for every name it does not know by key,
while the same indexer inserts entities all the time. With fastupdate on, new entries wait in
the index's unsorted pending list until a vacuum or the list's size limit, and every search
scans that list linearly: on the 994-document set the candidate query was 77% of the
indexer's statement time (16 ms per document; docs/BENCHMARKS.md, issue 10 deliverable 8).
Off, each insert updates the index at once and searches stay index-bound.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_INDEXES = ("entities_name_trgm", "aliases_trgm")


def upgrade() -> None:
    for index in _INDEXES:
        op.execute(f"ALTER INDEX {index} SET (fastupdate = off)")
        # Entries already waiting move into the index now, not at the next vacuum.
        op.execute(f"SELECT gin_clean_pending_list('{index}'::regclass)")


def downgrade() -> None:
    for index in _INDEXES:
        op.execute(f"ALTER INDEX {index} RESET (fastupdate)")
