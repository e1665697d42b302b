"""The core of the data model (docs/architecture.md, "Data model").

The vector width comes from the migration's `embedding_dim` attribute (the setting
KGSTREAM_EMBEDDING_DIM) and is recorded in kg_meta, so a process started with another width
fails fast with a clear message instead of deep inside a query.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import os

from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _dim() -> int:
    raw = context.config.attributes.get("embedding_dim") or os.environ.get(
        "KGSTREAM_EMBEDDING_DIM", "384"
    )
    return int(raw)


SCHEMA = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;

CREATE TABLE kg_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE documents (
    doc_id        text PRIMARY KEY,
    tenant        text,
    title         text NOT NULL DEFAULT '',
    version       bigint,
    content_hash  text,
    metadata      jsonb NOT NULL DEFAULT '{{}}',
    acl           text[],
    occurred_at   timestamptz NOT NULL,
    deleted       boolean NOT NULL DEFAULT false,
    last_event_id text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chunks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    doc_id       text NOT NULL REFERENCES documents ON DELETE CASCADE,
    ord          integer NOT NULL,
    content_hash text NOT NULL,
    text         text NOT NULL,
    token_count  integer NOT NULL,
    start_char   integer NOT NULL,
    end_char     integer NOT NULL,
    embedding    vector({dim}) NOT NULL,
    tsv          tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    UNIQUE (doc_id, content_hash)
);
CREATE INDEX chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops);
CREATE INDEX chunks_tsv ON chunks USING gin (tsv);

CREATE TABLE entities (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key           text NOT NULL UNIQUE,
    name          text NOT NULL,
    type          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    mention_count integer NOT NULL DEFAULT 0,
    embedding     vector({dim}),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX entities_name_trgm ON entities USING gin (name gin_trgm_ops);
CREATE INDEX entities_embedding_hnsw ON entities USING hnsw (embedding vector_cosine_ops);

CREATE TABLE aliases (
    entity_id bigint NOT NULL REFERENCES entities ON DELETE CASCADE,
    alias     text NOT NULL,
    alias_key text NOT NULL,
    PRIMARY KEY (entity_id, alias)
);
CREATE INDEX aliases_key ON aliases (alias_key);
CREATE INDEX aliases_trgm ON aliases USING gin (alias gin_trgm_ops);

-- Provenance: an entity exists while some chunk mentions it (reference counting, no guesses).
CREATE TABLE mentions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_id  bigint NOT NULL REFERENCES entities,
    chunk_id   bigint NOT NULL REFERENCES chunks ON DELETE CASCADE,
    doc_id     text NOT NULL,
    surface    text NOT NULL,
    type       text NOT NULL,
    start_char integer NOT NULL,
    end_char   integer NOT NULL,
    sentence   text NOT NULL,
    UNIQUE (chunk_id, entity_id, start_char)
);
CREATE INDEX mentions_entity ON mentions (entity_id);

-- Adjacency rows: one per (source, target, type); weight = sum of evidence strengths.
CREATE TABLE relationships (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_id      bigint NOT NULL REFERENCES entities,
    target_id      bigint NOT NULL REFERENCES entities,
    type           text NOT NULL,
    weight         double precision NOT NULL DEFAULT 0,
    evidence_count integer NOT NULL DEFAULT 0,
    description    text NOT NULL DEFAULT '',
    UNIQUE (source_id, target_id, type)
);
CREATE INDEX relationships_target ON relationships (target_id);

CREATE TABLE relationship_evidence (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    relationship_id bigint NOT NULL REFERENCES relationships ON DELETE CASCADE,
    chunk_id        bigint NOT NULL REFERENCES chunks ON DELETE CASCADE,
    doc_id          text NOT NULL,
    strength        double precision NOT NULL,
    sentence        text NOT NULL,
    UNIQUE (relationship_id, chunk_id)
);
CREATE INDEX evidence_chunk ON relationship_evidence (chunk_id);

-- Append-only change log; the change ratio counts distinct (kind, ref_id) past a watermark.
CREATE TABLE graph_changes (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('node', 'edge')),
    ref_id     bigint NOT NULL,
    op         text NOT NULL CHECK (op IN ('add', 'remove', 'change')),
    doc_id     text,
    event_id   text,
    changed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE snapshots (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status            text NOT NULL
                      CHECK (status IN ('building', 'published', 'retired', 'failed')),
    watermark         bigint NOT NULL,
    nodes             integer NOT NULL DEFAULT 0,
    edges             integer NOT NULL DEFAULT 0,
    communities       integer NOT NULL DEFAULT 0,
    levels            integer NOT NULL DEFAULT 0,
    reports_reused    integer NOT NULL DEFAULT 0,
    reports_generated integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz
);
CREATE UNIQUE INDEX snapshots_one_published ON snapshots ((true)) WHERE status = 'published';

CREATE TABLE communities (
    snapshot_id bigint NOT NULL REFERENCES snapshots ON DELETE CASCADE,
    id          bigint NOT NULL,
    level       integer NOT NULL,
    parent_id   bigint,
    size        integer NOT NULL,
    fingerprint text NOT NULL,
    title       text NOT NULL DEFAULT '',
    summary     text NOT NULL DEFAULT '',
    report      jsonb NOT NULL DEFAULT '{{}}',
    rating      double precision,
    embedding   vector({dim}),
    PRIMARY KEY (snapshot_id, id)
);

-- No FK to entities: a published snapshot stays immutable while the live graph moves on.
CREATE TABLE community_members (
    snapshot_id  bigint NOT NULL,
    community_id bigint NOT NULL,
    entity_id    bigint NOT NULL,
    PRIMARY KEY (snapshot_id, community_id, entity_id),
    FOREIGN KEY (snapshot_id, community_id) REFERENCES communities ON DELETE CASCADE
);

CREATE TABLE snapshot_entities (
    snapshot_id   bigint NOT NULL REFERENCES snapshots ON DELETE CASCADE,
    entity_id     bigint NOT NULL,
    pagerank      double precision NOT NULL,
    community_ids bigint[] NOT NULL,
    PRIMARY KEY (snapshot_id, entity_id)
);

CREATE TABLE processed_events (
    event_id     text PRIMARY KEY,
    doc_id       text NOT NULL,
    outcome      text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    text,
    doc_id      text,
    topic       text NOT NULL,
    partition   integer NOT NULL,
    "offset"    bigint NOT NULL,
    key         text,
    raw         bytea NOT NULL,
    reason      text NOT NULL,
    detail      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    replayed_at timestamptz,
    UNIQUE (topic, partition, "offset")
);

CREATE TABLE token_usage (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    doc_id            text,
    purpose           text NOT NULL,
    model             text NOT NULL,
    prompt_tokens     integer NOT NULL,
    completion_tokens integer NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);
"""

TABLES = [
    "token_usage",
    "dead_letters",
    "processed_events",
    "snapshot_entities",
    "community_members",
    "communities",
    "snapshots",
    "graph_changes",
    "relationship_evidence",
    "relationships",
    "mentions",
    "aliases",
    "entities",
    "chunks",
    "documents",
    "kg_meta",
]


def upgrade() -> None:
    dim = _dim()
    for statement in SCHEMA.format(dim=dim).split(";\n"):
        if statement.strip():
            op.execute(statement)
    op.execute(f"INSERT INTO kg_meta (key, value) VALUES ('embedding_dim', '{dim}')")  # noqa: S608 - dim is an int from settings


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
