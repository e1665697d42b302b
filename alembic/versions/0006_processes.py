"""Running kgstream processes (issue 9): each one registers at start (name, pid, host, where its
metrics are), heartbeats, and deletes its row on an orderly stop, so `kgstream status` lists
every live process and its metrics address wherever it runs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE processes (
            id           bigserial PRIMARY KEY,
            name         text NOT NULL,
            pid          integer NOT NULL,
            host         text NOT NULL,
            metrics_url  text,
            started_at   timestamptz NOT NULL DEFAULT now(),
            heartbeat_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX processes_heartbeat ON processes (heartbeat_at)")


def downgrade() -> None:
    op.execute("DROP TABLE processes")
