"""graph_changes logs access changes (issue 32, step 4).

A query process holds the walked graph in memory with each passage's access class (its
document's tenant and ACL: services/retrieval/graph_memory.py) and keeps it current from
graph_changes. An upsert that changes a live document's tenant or ACL may change no node and no
edge (same content, or chunks kept): it now also logs one ``access`` row per chunk of the
document (ref_id: the chunk), so the held graphs re-read those chunks' classes. The change
ratio and the communities count nodes and edges only (services/core/change_state.py).

The new check is added NOT VALID and left so: every row already stored is a node or an edge,
new rows are checked, and validating would scan the whole append-only table under the lock
the constraint change takes (migrations run in one transaction each), holding up the indexer.

Upgrade order: this migration, then the indexers (their access rows need the new check), then
the query APIs. A query API that started before the new indexers may have missed an ACL-only
change: restart it once they run (docs/operations.md, "Upgrades").

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


def downgrade() -> None:
    op.execute("DELETE FROM graph_changes WHERE kind = 'access'")
    op.execute("ALTER TABLE graph_changes DROP CONSTRAINT IF EXISTS graph_changes_kind_check")
    op.execute(
        "ALTER TABLE graph_changes ADD CONSTRAINT graph_changes_kind_check"
        " CHECK (kind IN ('node', 'edge'))"
    )
