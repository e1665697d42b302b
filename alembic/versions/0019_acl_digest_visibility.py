"""The visibility index keys an ACL by its digest, so a document shared with any number of
groups can be stored.

0013 indexed live documents by (tenant, acl) for the query API's whole-corpus check, and a
btree index row holds at most 2,704 bytes: a document shared with about 150 groups could not be
written (SQLSTATE 54000), and since the indexer then retried it without end, it stopped every
partition (issue 30). The check only needs to visit each distinct ACL of a tenant once, in some
order, and read it: the index now holds ``kgstream_acl_digest(acl)``, the SHA-256 of an
injective encoding of the array (each group as its byte length, a colon and its bytes), 32
bytes whatever the ACL, and the walk reads the ACL from the row it lands on. Distinct ACLs have
distinct digests (SHA-256 collisions are out of reach), so no ACL is skipped; an empty ACL has
the digest of the empty string, as before it is an ACL that shares no group.

The function is IMMUTABLE: for text[] its value depends on the bytes only (it is written with
convert_to and string_agg, which PostgreSQL marks STABLE because of other types). The new
index is built CONCURRENTLY outside the migration's transaction, the old one then dropped the
same way; every step can run again after a failure.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

DIGEST_FUNCTION = """
CREATE OR REPLACE FUNCTION kgstream_acl_digest(acl text[]) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT sha256(coalesce(string_agg(
    octet_length(g)::text || ':' || encode(convert_to(g, 'UTF8'), 'hex'), ',' ORDER BY n), '')
    ::bytea)
  FROM unnest(acl) WITH ORDINALITY AS u(g, n)
$$
"""


def upgrade() -> None:
    op.execute(DIGEST_FUNCTION)
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS documents_visibility_digest")
        op.execute(
            "CREATE INDEX CONCURRENTLY documents_visibility_digest"
            " ON documents (tenant, kgstream_acl_digest(acl)) WHERE NOT deleted"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS documents_visibility")


def downgrade() -> None:
    # Documents with an ACL over the old index's limit make this fail (54000): delete or
    # narrow them first.
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS documents_visibility")
        op.execute(
            "CREATE INDEX CONCURRENTLY documents_visibility"
            " ON documents (tenant, acl) WHERE NOT deleted"
        )
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS documents_visibility_digest")
    op.execute("DROP FUNCTION IF EXISTS kgstream_acl_digest(text[])")
