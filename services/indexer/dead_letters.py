"""Dead-lettering: the raw record (its value and headers), its reason and its source
coordinates go to the dead_letters table and the dead-letter topic, and the stream moves on.

Dead-lettering must not fail where the record itself failed: strings bound for text columns
lose their NUL characters (PostgreSQL text cannot hold them; the raw bytes keep the original),
the topic gets at most DLQ_RAW_INLINE_BYTES of the value (the table keeps all of it), and every
write is retried while its failure is transient.

A dead letter is one record: its source coordinates, its broker timestamp and the SHA-256 of
its value (alembic 0011). A record redelivered after a crash carries all three unchanged, finds
its row and is not published to the topic a second time; a new record at an offset that a
restarted broker or a re-created topic hands out again differs in its bytes or its timestamp
and gets a row and a publish of its own."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import text

from services.core.contracts import DocumentEvent
from services.core.errors import PermanentError
from services.core.failures import is_transient
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.documents import mark_processed

log = logging.getLogger(__name__)
T = TypeVar("T")

# base64 grows 4/3: 512 KiB of value is ~700 KB of dead letter, inside Kafka's default 1 MiB.
DLQ_RAW_INLINE_BYTES = 512 * 1024
DETAIL_CHARS = 4000
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0

_STORE = text(
    'INSERT INTO dead_letters (event_id, doc_id, topic, partition, "offset", record_timestamp,'
    " key, raw, reason, detail, headers)"
    " VALUES (:e, :d, :t, :p, :o, to_timestamp(:ts), :k, :r, :why, :detail,"
    " CAST(:headers AS jsonb))"
    " ON CONFLICT ON CONSTRAINT dead_letters_record DO UPDATE SET topic = EXCLUDED.topic"
    " RETURNING id, published_at IS NOT NULL AS published"
)


def storable(value: str | None, limit: int = 2000) -> str | None:
    """A string PostgreSQL text accepts: NUL spelled out, lone surrogates replaced, bounded."""
    if value is None:
        return None
    clean = value.replace("\x00", "\\u0000").encode("utf-8", "replace").decode("utf-8")
    return clean[:limit]


def stored_headers(record: RawRecord) -> list[dict[str, str | None]]:
    """The record's headers as kept by dead_letters.headers and the dead letter's
    ``source.headers``: in order, each value base64 (null for a null value)."""
    return [
        {
            "key": storable(key, DETAIL_CHARS) or "",
            "value_base64": None if value is None else base64.b64encode(value).decode("ascii"),
        }
        for key, value in record.headers
    ]


def key_text(record: RawRecord) -> str | None:
    """The record's key as text (undecodable bytes replaced), None for a keyless record."""
    return record.key.decode("utf-8", "replace") if record.key is not None else None


async def dead_letter(
    deps: IndexerDeps, record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> None:
    """Keep the record with its reason; idempotent per record (coordinates, timestamp and
    bytes). Returns only when the row is stored (retrying transient failures for as long as
    they last)."""
    row_id, published = await _retrying(
        "store the dead letter", _store, deps, record, exc, event, persist=True
    )
    deps.observer.dead_letter(exc.reason)
    log.warning(
        "dead-lettered %s/%s@%s: %s", record.topic, record.partition, record.offset, exc.reason
    )
    if published:
        return  # a redelivery: the topic has it already
    try:
        await _retrying("publish the dead letter", _publish, deps, record, exc, event)
    except Exception as failure:  # noqa: BLE001 - the row holds everything; do not stall
        log.error(  # noqa: TRY400 - the cause is in the message; no traceback wanted
            "dead letter %d stored but not published to the topic: %s: %s",
            row_id,
            type(failure).__name__,
            failure,
        )
        return
    await _retrying("mark the dead letter published", _mark_published, deps, row_id)


async def _store(
    deps: IndexerDeps, record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> tuple[int, bool]:
    raw = record.value or b""
    key = key_text(record)
    async with deps.engine.begin() as conn:
        row = (
            await conn.execute(
                _STORE,
                {
                    "e": storable(event.event_id if event else None),
                    "d": storable(event.doc_id if event else key),
                    "t": record.topic,
                    "p": record.partition,
                    "o": record.offset,
                    "ts": record.timestamp,
                    "k": storable(key),
                    "r": raw,
                    "why": exc.reason,
                    "detail": storable(exc.detail, DETAIL_CHARS),
                    "headers": json.dumps(stored_headers(record)),
                },
            )
        ).one()
        if event is not None and storable(event.event_id) == event.event_id:
            await mark_processed(conn, event, "dead_lettered", record.timestamp)
    return int(row.id), bool(row.published)


def dead_letter_payload(
    record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> dict[str, Any]:
    """The dead letter v1 record (schemas/dead_letter.v1.json) for the topic."""
    raw = record.value or b""
    key = key_text(record)
    return {
        "schema_version": 1,
        "reason": exc.reason,
        "detail": exc.detail[:DETAIL_CHARS],
        "event_id": event.event_id if event else None,
        "doc_id": event.doc_id if event else key,
        "source": {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": key,
            "timestamp": _iso(record.timestamp),
            "headers": stored_headers(record),
        },
        "raw_base64": base64.b64encode(raw[:DLQ_RAW_INLINE_BYTES]).decode("ascii"),
        "raw_bytes": len(raw),
        "raw_sha256": hashlib.sha256(raw).hexdigest(),
        "raw_truncated": len(raw) > DLQ_RAW_INLINE_BYTES,
        "failed_at": datetime.now(UTC).isoformat(),
    }


def _iso(seconds: float | None) -> str | None:
    return datetime.fromtimestamp(seconds, UTC).isoformat() if seconds is not None else None


async def _publish(
    deps: IndexerDeps, record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> None:
    payload = dead_letter_payload(record, exc, event)
    await deps.publish_dead_letter(record.key, json.dumps(payload).encode("utf-8"))


async def _mark_published(deps: IndexerDeps, row_id: int) -> None:
    async with deps.engine.begin() as conn:
        await conn.execute(
            text("UPDATE dead_letters SET published_at = now() WHERE id = :i"), {"i": row_id}
        )


async def _retrying(
    what: str, step: Callable[..., Awaitable[T]], *args: Any, persist: bool = False
) -> T:
    """Run ``step`` until it succeeds; transient failures wait and retry, others raise, or
    with ``persist`` are retried too: a record that cannot be kept must stall the partition
    loudly rather than be lost."""
    delay = FIRST_BACKOFF_S
    while True:
        try:
            return await step(*args)
        except Exception as exc:
            transient = is_transient(exc)
            if not (transient or persist):
                raise
            log.log(
                logging.WARNING if transient else logging.ERROR,
                "could not %s, retry in %.1fs: %s: %s",
                what,
                delay,
                type(exc).__name__,
                exc,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
