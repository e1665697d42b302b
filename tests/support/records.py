"""Raw records for handler tests, and reads of what the handlers left behind (database rows and
the dead-letter topic)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import text

from services.indexer.handlers import IndexerDeps, RawRecord

_offsets = itertools.count()
READ_DEADLINE_S = 60.0  # reading a topic to its end; generous for a loaded machine


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


def records_on(bootstrap: str, topic: str, partitions: list[int] | None = None) -> list[Any]:
    """Every record on the topic's ``partitions`` (default: all), partition by partition in
    offset order. Reads to the end, not until the topic goes quiet: a slow broker makes it
    wait (up to READ_DEADLINE_S), never return too few. The end is the broker's end offset
    and the high watermark of a fetch made after the call: tansu's end offsets are only a
    lower bound (the last batch's first offset + 1, docs/architecture.md)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        numbers = consumer.partitions_for_topic(topic) if partitions is None else partitions
        parts = [TopicPartition(topic, p) for p in sorted(numbers)]
        if not parts:
            return []
        deadline = time.monotonic() + READ_DEADLINE_S
        consumer.assign(parts)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(parts, timeout_ms=int(READ_DEADLINE_S * 1000))
        got: dict[Any, list[Any]] = {tp: [] for tp in parts}

        def at_end(tp: Any, left_ms: int) -> bool:
            at, high = consumer.position(tp, left_ms), consumer.highwater(tp)  # None: not known yet
            return at is not None and high is not None and at >= max(ends[tp], high)

        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if all(at_end(tp, left_ms) for tp in parts):
                return [r for tp in parts for r in got[tp]]
            if left_ms == 0:
                raise TimeoutError(f"{topic}: not read to its end {ends} in {READ_DEADLINE_S} s")
            for tp, batch in consumer.poll(timeout_ms=min(left_ms, 1000)).items():
                got[tp].extend(batch)
    finally:
        consumer.close()


def dlq_messages(bootstrap: str, topic: str) -> list[bytes]:
    """Every record value on partition 0 of the dead-letter topic."""
    return [bytes(m.value) for m in records_on(bootstrap, topic, [0])]


def event_ids_on(bootstrap: str, topic: str) -> list[str]:
    """Event ids of every record on the topic's partitions, sorted."""
    return sorted(json.loads(m.value)["event_id"] for m in records_on(bootstrap, topic))
