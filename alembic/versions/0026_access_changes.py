"""graph_changes logs access changes (issue 32, step 4).

A query process holds the walked graph in memory with each passage's access class (its
document's tenant and ACL: services/retrieval/graph_memory.py) and keeps it current from
graph_changes. An upsert with unchanged content may still change a document's ACL, which
changes no node and no edge: it now logs one ``access`` row per chunk of the document
(ref_id: the chunk), so the held graphs re-read those chunks' classes. The change ratio and
the communities count nodes and edges only (services/core/change_state.py).

A NOT VALID constraint first, then validated: the table is append-only and large, and
validation takes no lock that blocks the indexer's inserts.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE graph_changes DROP CONSTRAINT IF EXISTS graph_changes_kind_check")
    op.execute(
        "ALTER TABLE graph_changes ADD CONSTRAINT graph_changes_kind_check"
        " CHECK (kind IN ('node', 'edge', 'access')) NOT VALID"
    )
    op.execute("ALTER TABLE graph_changes VALIDATE CONSTRAINT graph_changes_kind_check")


def downgrade() -> None:
    op.execute("DELETE FROM graph_changes WHERE kind = 'access'")
    op.execute("ALTER TABLE graph_changes DROP CONSTRAINT IF EXISTS graph_changes_kind_check")
    op.execute(
        "ALTER TABLE graph_changes ADD CONSTRAINT graph_changes_kind_check"
        " CHECK (kind IN ('node', 'edge'))"
    )
