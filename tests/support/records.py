"""Raw records for handler tests, and reads of what the handlers left behind (database rows and
the dead-letter topic)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import text

from services.indexer.handlers import IndexerDeps, RawRecord

_offsets = itertools.count()


def document_event(**overrides: Any) -> dict[str, Any]:
    """A valid upsert (Marie Curie), with ``overrides`` applied."""
    base: dict[str, Any] = {
        "event_id": "e1",
        "type": "upsert",
        "doc_id": "doc-curie",
        "title": "Marie Curie",
        "text": "Marie Curie was a physicist. Marie Curie worked in Paris with Pierre Curie. "
        "Marie Curie met Albert Einstein in Brussels.",
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    base.update(overrides)
    return base


def record(
    obj: dict[str, Any] | bytes,
    topic: str = "docs",
    *,
    key: bytes | None = b"k",
    offset: int | None = None,
) -> RawRecord:
    """A record as the agent hands it over; a fresh offset unless one is given."""
    value = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    at = next(_offsets) if offset is None else offset
    return RawRecord(topic=topic, partition=0, offset=at, key=key, value=value)


async def rows(deps: IndexerDeps, sql: str, **params: Any) -> list[Any]:
    """All rows of a query on the handlers' database."""
    async with deps.engine.connect() as conn:
        return list((await conn.execute(text(sql), params)).all())


def dlq_messages(bootstrap: str, topic: str) -> list[bytes]:
    """Every record value on partition 0 of the dead-letter topic."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        return [bytes(m.value) for m in consumer]
    finally:
        consumer.close()


def event_ids_on(bootstrap: str, topic: str) -> list[str]:
    """Event ids of every record on the topic's partitions, sorted."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        return sorted(json.loads(m.value)["event_id"] for m in consumer)
    finally:
        consumer.close()
