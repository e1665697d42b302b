"""Live documents by (tenant, acl): the whole-corpus check of the query API.

A caller without an admin key had every read filtered row by row through ``documents``
(services/retrieval/visibility.py), 5-25x the operator's cost even when every document is
visible to it (a corpus without tenants or ACLs read by an anonymous caller: issue 20). The
query API now asks first, in the request's transaction, whether the caller sees every live
document, and then reads as the operator does. The question needs the distinct tenants of
live documents and the distinct ACLs within the caller's tenant, which this index answers with
one probe per distinct value (a skip scan in SQL), however many documents there are.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX documents_visibility ON documents (tenant, acl) WHERE NOT deleted")


def downgrade() -> None:
    op.execute("DROP INDEX documents_visibility")
