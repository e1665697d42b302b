"""Events the query API accepted (202), kept in PostgreSQL until the indexer has them (issue 30).

The embedded broker keeps records in memory only: events answered 202 over HTTP or MCP and not
yet applied when it died were lost, though the caller had been told they were accepted. The
query API now writes each accepted event here (its wire form, keyed by event id) once the
broker has acknowledged it; the indexer deletes the ones it has handled (applied, skipped or
dead-lettered: all are in ``processed_events``) every ``SWEEP_INTERVAL_S``, so the
table holds about a minute of ingest plus the backlog. When the indexer finds the documents
topic replaced (services/indexer/topic_identity.py), it publishes the ones still here again, in
the order they were accepted; the ones the old log delivered are skipped by event id.

A failed write here does not undo the 202: the broker has the events, which is the durability
ingest had before; it is logged and counted (``kgstream_ingest_outbox_failures_total``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.contracts import encode_event

SWEEP_INTERVAL_S = 60.0
RETENTION = "7 days"
"""Rows older than this go whatever their state: a 202 promises delivery to the topic, not a
week of replays after it."""

_KEEP = text(
    "INSERT INTO accepted_events (event_id, doc_id, value)"
    " SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:docs AS text[]), CAST(:vals AS bytea[]))"
    " ON CONFLICT (event_id) DO NOTHING"
)
_SWEEP = text(
    "DELETE FROM accepted_events a WHERE a.accepted_at < now() - CAST(:keep AS interval)"
    " OR EXISTS (SELECT 1 FROM processed_events p WHERE p.event_id = a.event_id)"
)
_PENDING = text(
    "SELECT a.doc_id, a.value FROM accepted_events a"
    " WHERE NOT EXISTS (SELECT 1 FROM processed_events p WHERE p.event_id = a.event_id)"
    " ORDER BY a.accepted_at, a.event_id"
)


async def keep(conn: AsyncConnection, events: Sequence[dict[str, Any]]) -> None:
    """Remember events the broker acknowledged (a repeated event id is kept once)."""
    if events:
        await conn.execute(
            _KEEP,
            {
                "ids": [str(e["event_id"]) for e in events],
                "docs": [str(e["doc_id"]) for e in events],
                "vals": [encode_event(e) for e in events],
            },
        )


async def sweep(conn: AsyncConnection) -> int:
    """Forget what the indexer has handled, and what is older than ``RETENTION``."""
    result = await conn.execute(_SWEEP, {"keep": RETENTION})
    return int(result.rowcount or 0)


async def pending(conn: AsyncConnection) -> list[tuple[bytes, bytes]]:
    """(key, value) records of the accepted events not handled yet, in acceptance order."""
    rows = (await conn.execute(_PENDING)).all()
    return [(str(r.doc_id).encode("utf-8"), bytes(r.value)) for r in rows]
