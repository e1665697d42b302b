"""API keys for the query API (issue 8): only a hash of each secret is stored; a key carries
its public lookup id so that verifying it is one indexed lookup plus a constant-time compare.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# secret_hash is SHA-256 of the key's 256-bit random secret. A slow password hash (bcrypt,
# argon2) defends low-entropy human passwords against guessing; a 2^256 search space needs no
# stretching, and a fast hash keeps verification cheap on every request.
SCHEMA = """
CREATE TABLE api_keys (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name         text NOT NULL DEFAULT '',
    lookup_id    text NOT NULL UNIQUE,
    secret_hash  bytea NOT NULL,
    scopes       text[] NOT NULL,
    tenant       text,
    groups       text[] NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz,
    CONSTRAINT api_keys_scopes_known
        CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['query', 'ingest', 'admin'])
)
"""


def upgrade() -> None:
    op.execute(SCHEMA)


def downgrade() -> None:
    op.execute("DROP TABLE api_keys")
