"""Drop the per-row foreign keys of a snapshot's rows (communities → snapshots,
community_members → communities, snapshot_entities → snapshots).

Writing a snapshot at 1M edges spent 4-5 s of its 7 s write checking the foreign key of
~840k community_members rows one by one (issue 10). The rows are now consistent by
construction and checked by the writer as a whole (services/communities/writer.py: every
membership's community is written in the same transaction, the 'building' snapshot row is
locked while its rows are written); pruning deletes a dropped snapshot's rows explicitly
(services/communities/snapshots.py) instead of relying on ON DELETE CASCADE.

Downgrade first removes rows that would violate the restored keys.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE community_members"
        " DROP CONSTRAINT IF EXISTS community_members_snapshot_id_community_id_fkey"
    )
    op.execute(
        "ALTER TABLE snapshot_entities DROP CONSTRAINT IF EXISTS snapshot_entities_snapshot_id_fkey"
    )
    op.execute("ALTER TABLE communities DROP CONSTRAINT IF EXISTS communities_snapshot_id_fkey")


def downgrade() -> None:
    op.execute(
        "DELETE FROM communities c"
        " WHERE NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.id = c.snapshot_id)"
    )
    op.execute(
        "DELETE FROM snapshot_entities e"
        " WHERE NOT EXISTS (SELECT 1 FROM snapshots s WHERE s.id = e.snapshot_id)"
    )
    op.execute(
        "DELETE FROM community_members m WHERE NOT EXISTS (SELECT 1 FROM communities c"
        " WHERE c.snapshot_id = m.snapshot_id AND c.id = m.community_id)"
    )
    op.execute(
        "ALTER TABLE communities ADD CONSTRAINT communities_snapshot_id_fkey"
        " FOREIGN KEY (snapshot_id) REFERENCES snapshots ON DELETE CASCADE"
    )
    op.execute(
        "ALTER TABLE snapshot_entities ADD CONSTRAINT snapshot_entities_snapshot_id_fkey"
        " FOREIGN KEY (snapshot_id) REFERENCES snapshots ON DELETE CASCADE"
    )
    op.execute(
        "ALTER TABLE community_members"
        " ADD CONSTRAINT community_members_snapshot_id_community_id_fkey"
        " FOREIGN KEY (snapshot_id, community_id) REFERENCES communities ON DELETE CASCADE"
    )
