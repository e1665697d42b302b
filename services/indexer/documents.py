"""Rows that track events and documents: processed_events (dedupe), documents (versions and
tombstones) and token_usage. All run inside the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.clocks import bounded_time
from services.core.contracts import DocumentEvent
from services.indexer.ordering import StoredDoc
from services.indexer.write_plan import TokenTotal


async def existing_chunk_hashes(conn: AsyncConnection, doc_id: str) -> dict[str, int]:
    """diff hash -> chunk id for the document's stored chunks."""
    rows = await conn.execute(
        text("SELECT content_hash, id FROM chunks WHERE doc_id = :d"), {"d": doc_id}
    )
    return {str(h): int(i) for h, i in rows.all()}


async def already_processed(conn: AsyncConnection, event_id: str) -> bool:
    """Has this event id been handled before (in any outcome)?"""
    found = await conn.scalar(
        text("SELECT 1 FROM processed_events WHERE event_id = :e"), {"e": event_id}
    )
    return found is not None


async def mark_processed(
    conn: AsyncConnection, event: DocumentEvent, outcome: str, published_at: float | None = None
) -> bool:
    """Claim the event id; False when another transaction already did (a duplicate). The
    event's ``occurred_at`` and its record's timestamp (``published_at``, seconds since the
    epoch) are kept for freshness (services/core/freshness.py)."""
    inserted = await conn.scalar(
        text(
            "INSERT INTO processed_events (event_id, doc_id, outcome, occurred_at, published_at)"
            " VALUES (:e, :d, :o, :at, to_timestamp(:pub))"
            " ON CONFLICT (event_id) DO NOTHING RETURNING 1"
        ),
        {
            "e": event.event_id,
            "d": event.doc_id,
            "o": outcome,
            "at": event.occurred_at,
            "pub": published_at,
        },
    )
    return inserted is not None


async def set_outcome(conn: AsyncConnection, event_id: str, outcome: str) -> None:
    """Record how a claimed event ended, and when: ``processed_at`` moves to now (the wall
    clock, not the transaction's start), the last statement before the commit."""
    await conn.execute(
        text(
            "UPDATE processed_events SET outcome = :o, processed_at = clock_timestamp()"
            " WHERE event_id = :e"
        ),
        {"o": outcome, "e": event_id},
    )


async def stored_doc(
    conn: AsyncConnection, doc_id: str, *, lock: bool, max_skew_s: float
) -> StoredDoc | None:
    """The documents row (a tombstone for deleted documents), optionally locked. Its time is
    bounded against when the row was written (``bounded_time``): rows stored before events
    were bounded may hold any occurred_at, and must not stay ahead of every later event."""
    sql = (
        "SELECT version, content_hash, occurred_at, updated_at, deleted, tenant, acl"
        " FROM documents WHERE doc_id = :d"
    )
    row = (await conn.execute(text(sql + (" FOR UPDATE" if lock else "")), {"d": doc_id})).first()
    if row is None:
        return None
    at = bounded_time(row.occurred_at, row.updated_at, timedelta(seconds=max_skew_s))
    acl = None if row.acl is None else tuple(row.acl)
    return StoredDoc(row.version, row.content_hash, at, row.deleted, row.tenant, acl)


async def write_document(
    conn: AsyncConnection, event: DocumentEvent, doc_hash: str | None, *, deleted: bool
) -> None:
    """Insert or update the documents row; a delete keeps tenant, title and metadata as a
    tombstone, without the provided facts (the tenant still owns the id: it may create it
    again, other tenants' keys may not). A delete of an id never stored leaves a tombstone
    with the event's tenant. A tombstone keeps the greatest version and time it has seen (a
    delete without a version keeps the stored one; the time never moves back, nor ahead of
    now), so no upsert published before the delete can come back, by version or by time."""
    await conn.execute(
        text(
            "INSERT INTO documents (doc_id, tenant, title, version, content_hash, metadata, acl,"
            " occurred_at, deleted, last_event_id, facts) VALUES (:d, :tn, :t, :v, :h,"
            " CAST(:m AS jsonb), :acl, :at, :del, :e, CAST(:f AS jsonb))"
            " ON CONFLICT (doc_id) DO UPDATE SET"
            " tenant = CASE WHEN EXCLUDED.deleted THEN documents.tenant ELSE EXCLUDED.tenant END,"
            " title = CASE WHEN EXCLUDED.deleted THEN documents.title ELSE EXCLUDED.title END,"
            " version = CASE WHEN EXCLUDED.deleted"
            "  THEN COALESCE(EXCLUDED.version, documents.version) ELSE EXCLUDED.version END,"
            " content_hash = EXCLUDED.content_hash,"
            " metadata = CASE WHEN EXCLUDED.deleted THEN documents.metadata"
            "  ELSE EXCLUDED.metadata END,"
            " acl = EXCLUDED.acl, occurred_at = CASE WHEN EXCLUDED.deleted THEN"
            "  GREATEST(EXCLUDED.occurred_at, LEAST(documents.occurred_at, now()))"
            "  ELSE EXCLUDED.occurred_at END,"
            " deleted = EXCLUDED.deleted,"
            " last_event_id = EXCLUDED.last_event_id, facts = EXCLUDED.facts, updated_at = now()"
        ),
        {
            "d": event.doc_id,
            "tn": event.tenant,
            "t": event.title,
            "v": event.version,
            "h": doc_hash,
            "m": json.dumps(event.metadata),
            "acl": event.acl,
            "at": event.occurred_at,
            "del": deleted,
            "e": event.event_id,
            "f": event.facts(),
        },
    )


# The live row of :d whose tenant, ACL or metadata (``changed_attributes``) differ: the row
# update_attributes changes, and the one kept for as_of before it does (graph_store/history.py).
ATTRIBUTES_CHANGE = (
    "d.doc_id = :d AND NOT d.deleted AND (d.tenant, d.acl, d.metadata)"
    " IS DISTINCT FROM (CAST(:tn AS text), CAST(:acl AS text[]), CAST(:m AS jsonb))"
)


async def update_attributes(conn: AsyncConnection, event: DocumentEvent) -> bool:
    """An upsert with unchanged content may still change who can see the document (tenant,
    acl) or its metadata: apply those, and its version and time so an older replay cannot
    undo them. True when something changed."""
    changed = await conn.scalar(
        text(
            "UPDATE documents d SET tenant = :tn, acl = CAST(:acl AS text[]),"  # noqa: S608 - constants
            " metadata = CAST(:m AS jsonb), version = COALESCE(:v, d.version), occurred_at = :at,"
            f" last_event_id = :e, updated_at = now() WHERE {ATTRIBUTES_CHANGE} RETURNING 1"
        ),
        {
            "d": event.doc_id,
            **changed_attributes(event),
            "v": event.version,
            "at": event.occurred_at,
            "e": event.event_id,
        },
    )
    return changed is not None


def changed_attributes(event: DocumentEvent) -> dict[str, object]:
    """What ``update_attributes`` compares and sets: tenant, ACL and metadata (JSON text)."""
    return {"tn": event.tenant, "acl": event.acl, "m": json.dumps(event.metadata)}


async def record_token_usage(
    conn: AsyncConnection, doc_id: str, tokens: Sequence[TokenTotal]
) -> None:
    """One row per document and model, in the event's transaction: a redelivered event that
    turns out a duplicate records nothing, so tokens are counted once per applied version."""
    if not tokens:
        return
    await conn.execute(
        _TOKEN_USAGE,
        [{"d": doc_id, "m": t.model, "p": t.prompt, "c": t.completion} for t in tokens],
    )


_TOKEN_USAGE = text(
    "INSERT INTO token_usage (doc_id, purpose, model, prompt_tokens, completion_tokens)"
    " VALUES (:d, 'extraction', :m, :p, :c)"
)
