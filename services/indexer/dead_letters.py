"""Dead-lettering: the raw record, its reason and its source coordinates go to the
dead_letters table and the dead-letter topic, and the stream moves on."""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime

from sqlalchemy import text

from services.core.contracts import DocumentEvent
from services.core.errors import PermanentError
from services.indexer.deps import IndexerDeps, RawRecord
from services.indexer.documents import mark_processed

log = logging.getLogger(__name__)


async def dead_letter(
    deps: IndexerDeps, record: RawRecord, exc: PermanentError, event: DocumentEvent | None
) -> None:
    """Keep the record with its reason; idempotent per (topic, partition, offset)."""
    raw = record.value or b""
    key = record.key.decode("utf-8", "replace") if record.key is not None else None
    event_id = event.event_id if event else None
    doc_id = event.doc_id if event else key
    async with deps.engine.begin() as conn:
        await conn.execute(
            text(
                'INSERT INTO dead_letters (event_id, doc_id, topic, partition, "offset", key, raw,'
                " reason, detail) VALUES (:e, :d, :t, :p, :o, :k, :r, :why, :detail)"
                ' ON CONFLICT (topic, partition, "offset") DO NOTHING'
            ),
            {
                "e": event_id,
                "d": doc_id,
                "t": record.topic,
                "p": record.partition,
                "o": record.offset,
                "k": key,
                "r": raw,
                "why": exc.reason,
                "detail": exc.detail[:4000],
            },
        )
        if event is not None:
            await mark_processed(conn, event, "dead_lettered")
    payload = {
        "schema_version": 1,
        "reason": exc.reason,
        "detail": exc.detail[:4000],
        "event_id": event_id,
        "doc_id": doc_id,
        "source": {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": key,
        },
        "raw_base64": base64.b64encode(raw).decode("ascii"),
        "failed_at": datetime.now(UTC).isoformat(),
    }
    await deps.publish_dead_letter(record.key, json.dumps(payload).encode("utf-8"))
    log.warning("dead-lettered %s/%s@%s: %s", record.topic, record.partition, record.offset, exc)
