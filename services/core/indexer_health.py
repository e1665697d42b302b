"""Is the indexer keeping up? Progress per partition (indexer_progress, written by the
indexer after every batch and while it retries) against the topic's end offsets.

A partition is stalled when a transient failure has been retried for ``stall_after_s`` or
longer, or when records wait (lag > 0) and its offset has not moved for that long. Idle is not
stalled: no lag, no retry. End offsets come from the broker; on the embedded tansu they are
approximate (docs/architecture.md, "The embedded broker (tansu)": its end offsets can lag the
true end), so lag there is a lower bound."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger(__name__)

_PROGRESS = text(
    "SELECT consumer_group, topic, partition, next_offset, handled_total,"
    " extract(epoch FROM now() - updated_at) AS idle_s,"
    " extract(epoch FROM now() - retrying_since) AS retrying_for_s, last_error"
    " FROM indexer_progress ORDER BY consumer_group, topic, partition"
)


@dataclass(frozen=True)
class PartitionProgress:
    """One row of indexer_progress, with ages in seconds by the database clock."""

    consumer_group: str
    topic: str
    partition: int
    next_offset: int
    handled_total: int
    idle_s: float
    retrying_for_s: float | None
    last_error: str | None


def is_stalled(p: PartitionProgress, end_offset: int | None, stall_after_s: float) -> bool:
    """Retrying for too long, or records waiting while the offset stands still."""
    if p.retrying_for_s is not None and p.retrying_for_s >= stall_after_s:
        return True
    return end_offset is not None and end_offset > p.next_offset and p.idle_s >= stall_after_s


async def read_progress(conn: AsyncConnection) -> list[PartitionProgress]:
    """Every partition any consumer group has reported on."""
    rows = (await conn.execute(_PROGRESS)).all()
    return [
        PartitionProgress(
            consumer_group=str(r.consumer_group),
            topic=str(r.topic),
            partition=int(r.partition),
            next_offset=int(r.next_offset),
            handled_total=int(r.handled_total),
            idle_s=round(float(r.idle_s), 1),
            retrying_for_s=None if r.retrying_for_s is None else round(float(r.retrying_for_s), 1),
            last_error=r.last_error,
        )
        for r in rows
    ]


def _consumer(bootstrap: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap.split(","),
        request_timeout_ms=3000,
        bootstrap_timeout_ms=3000,  # kafka-python 3 (api_version_auto_timeout_ms is gone)
        enable_auto_commit=False,  # no group: says so, rather than a warning per call
    )


def _ask(consumer: KafkaConsumer, wanted: list[TopicPartition]) -> dict[tuple[str, int], int]:
    found = consumer.end_offsets(wanted)
    return {(tp.topic, tp.partition): int(o) for tp, o in found.items()}


def _wanted(partitions: Iterable[tuple[str, int]]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(set(partitions))]


def end_offsets(
    bootstrap: str, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> end offset from the broker; empty when it cannot be asked. One
    connection per call: for one-shot callers (``kgstream status``); samplers keep an
    :class:`OffsetReader`."""
    wanted = _wanted(partitions)
    if not wanted:
        return {}
    try:
        consumer = _consumer(bootstrap)
    except Exception as exc:  # noqa: BLE001 - status reports what it can
        log.info("no end offsets from %s: %s", bootstrap, exc)
        return {}
    try:
        return _ask(consumer, wanted)
    except Exception as exc:  # noqa: BLE001 - status reports what it can
        log.info("no end offsets from %s: %s", bootstrap, exc)
        return {}
    finally:
        consumer.close()


class OffsetReader:
    """End offsets for a process that asks every few seconds (the indexer's lag gauge, the
    dashboard sampler): one broker connection kept between calls instead of a new client (and
    its metadata bootstrap) per call. A failed call drops the connection and the next call
    makes a new one; ``read`` is blocking (call it in a thread) and safe from several threads."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._consumer: KafkaConsumer | None = None
        self._lock = threading.Lock()

    def read(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> end offset; empty when the broker cannot be asked now."""
        wanted = _wanted(partitions)
        if not wanted:
            return {}
        with self._lock:
            try:
                if self._consumer is None:
                    self._consumer = _consumer(self.bootstrap)
                return _ask(self._consumer, wanted)
            except Exception as exc:  # noqa: BLE001 - lag is reported as unknown meanwhile
                log.info("no end offsets from %s: %s", self.bootstrap, exc)
                self._drop()
                return {}

    def first_offset(self, topic: str, partition: int, start: int, timeout_s: float) -> int | None:
        """The offset of the first data record at or after ``start`` (transaction markers are
        not records), or None when none arrives within ``timeout_s`` or the broker cannot be
        asked. Blocking; the connection's assignment is left empty."""
        tp = TopicPartition(topic, partition)
        with self._lock:
            try:
                if self._consumer is None:
                    self._consumer = _consumer(self.bootstrap)
                consumer = self._consumer
                consumer.assign([tp])
                try:
                    consumer.seek(tp, start)
                    deadline = time.monotonic() + timeout_s
                    while time.monotonic() < deadline:
                        found = consumer.poll(timeout_ms=250, max_records=1).get(tp)
                        if found:
                            return int(found[0].offset)
                    return None
                finally:
                    consumer.assign([])
            except Exception as exc:  # noqa: BLE001 - the caller asks again later
                log.info("no record from %s/%d at %d: %s", topic, partition, start, exc)
                self._drop()
                return None

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with suppress(Exception):
                consumer.close()


def health(
    progress: Iterable[PartitionProgress],
    ends: dict[tuple[str, int], int],
    stall_after_s: float,
) -> dict[str, Any]:
    """The status document: per partition with lag and stalled, and stalled overall."""
    parts = []
    for p in progress:
        end = ends.get((p.topic, p.partition))
        stalled = is_stalled(p, end, stall_after_s)
        lag = None if end is None else max(0, end - p.next_offset)
        parts.append({**asdict(p), "end_offset": end, "lag": lag, "stalled": stalled})
    return {
        "stalled": any(p["stalled"] for p in parts),
        "stall_after_s": stall_after_s,
        "lag_source": "broker end offsets" if ends else "unavailable",
        "partitions": parts,
    }
