"""Reading and replaying dead letters (`kgstream dlq list|replay`).

A replay is atomic per letter: a letter is marked replayed only once the broker has
acknowledged it, so a second replay sends nothing the first one delivered, and a refused letter
(too large for the producer, say) stays unreplayed with its reason while the others go. One run
sends each letter at most once, and only letters there were when it started: a replayed record
that fails again is a new letter, left for the next run."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kafka import KafkaProducer
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.producer import send_each

REPLAY_PAGE = 20
"""Letters read, sent and marked together: values can be megabytes each, and this is also the
most a crash between the broker's acks and the mark makes the next replay send again."""

_NEWEST = text(
    'SELECT id, event_id, doc_id, topic, partition, "offset", record_timestamp, key, reason,'
    " detail, created_at, replayed_at, raw, headers FROM dead_letters"
    " WHERE (:all OR replayed_at IS NULL)"
    " AND (cardinality(CAST(:ids AS bigint[])) = 0 OR id = ANY(:ids))"
    " ORDER BY id DESC LIMIT :limit"
)
_UNREPLAYED_AFTER = text(
    'SELECT id, event_id, doc_id, topic, partition, "offset", record_timestamp, key, reason,'
    " detail, created_at, replayed_at, raw, headers FROM dead_letters"
    " WHERE replayed_at IS NULL AND id > :after AND id <= :last"
    " AND (cardinality(CAST(:ids AS bigint[])) = 0 OR id = ANY(:ids))"
    " ORDER BY id LIMIT :limit"
)


@dataclass(frozen=True)
class DeadLetter:
    """One row of dead_letters."""

    id: int
    event_id: str | None
    doc_id: str | None
    topic: str
    partition: int
    offset: int
    record_timestamp: datetime | None  # the source record's broker timestamp (None: unknown)
    key: str | None
    reason: str
    detail: str
    created_at: datetime
    replayed_at: datetime | None
    raw: bytes
    # The record's headers, in order: [{"key", "value_base64"}] (migration 0017).
    headers: list[dict[str, str | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, with the payload as text where it decodes."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("raw", "headers")}
        out["created_at"] = self.created_at.isoformat()
        out["record_timestamp"] = _iso(self.record_timestamp)
        out["replayed_at"] = _iso(self.replayed_at)
        out["raw"] = self.raw.decode("utf-8", "replace")[:2000]
        out["headers"] = [
            [key, value.decode("utf-8", "replace")] for key, value in self.kafka_headers()
        ]
        return out

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """The headers as a producer sends them (a null value as empty bytes)."""
        return [(str(h["key"]), base64.b64decode(h["value_base64"] or "")) for h in self.headers]


async def list_dead_letters(
    engine: AsyncEngine,
    *,
    include_replayed: bool = False,
    ids: Sequence[int] = (),
    limit: int = 100,
) -> list[DeadLetter]:
    """Newest first; replayed ones only when asked."""
    params = {"all": include_replayed, "ids": list(ids), "limit": limit}
    return await _read(engine, _NEWEST, params)


@dataclass(frozen=True)
class Replayed:
    """How one letter's replay ended: ``error`` is None when the broker acknowledged it and it
    is marked replayed, else why it was not sent (it stays unreplayed). ``not_replayable``: it
    was not sent because its reason is in NOT_REPLAYABLE, and never will be."""

    letter_id: int
    error: str | None = None
    not_replayable: bool = False


NOT_REPLAYABLE = {
    "undecodable_batch": "an unreadable record batch is not an event: publish its documents "
    "again from their source",
}
"""Reasons whose raw bytes are not one record (replaying them would only dead-letter them
again), with what the operator is told instead."""


async def replay_dead_letters(
    engine: AsyncEngine,
    producer: KafkaProducer,
    topic: str,
    *,
    ids: Sequence[int] = (),
    timeout_s: float = 30.0,
    page: int = REPLAY_PAGE,
) -> AsyncIterator[Replayed]:
    """Send the unreplayed letters (all, or only ``ids``), oldest first, to ``topic`` with
    their original keys, and yield each outcome. Each letter's event id is given back first, so
    the indexer applies the replayed event instead of skipping it as one it has seen; then the
    letter is sent (its value with its headers: a CloudEvent in binary mode is both), and
    marked replayed only once the broker has acknowledged it. A crash between the ack and the
    mark leaves the letter unreplayed: the next replay sends it again, and the indexer skips
    that second copy by its event id.

    A run sends each letter at most once: it reads the letters in id order with a cursor that
    only moves forward, up to the newest id there was when it started. A replayed record that
    the indexer dead-letters again while the run goes on is a new letter with a later id, so it
    waits for the next run (without that bound one run sent its own failures again and again:
    issue 30, finding 5)."""
    last = await _newest_id(engine)
    after = 0
    while page_letters := await _unreplayed_after(engine, after, last, ids, page):
        after = page_letters[-1].id
        letters = [d for d in page_letters if d.reason not in NOT_REPLAYABLE]
        for letter in page_letters:
            if letter.reason in NOT_REPLAYABLE:
                yield Replayed(letter.id, NOT_REPLAYABLE[letter.reason], not_replayable=True)
        if not letters:
            continue
        await _release_event_ids(engine, [d.event_id for d in letters if d.event_id])
        records = [
            (d.key.encode("utf-8") if d.key is not None else None, d.raw, d.kafka_headers())
            for d in letters
        ]
        errors = await asyncio.to_thread(send_each, producer, topic, records, timeout_s)
        acked = [d.id for d, e in zip(letters, errors, strict=True) if e is None]
        await _mark_replayed(engine, acked)
        for letter, error in zip(letters, errors, strict=True):
            reason = None if error is None else f"{type(error).__name__}: {error}"
            yield Replayed(letter.id, reason)


async def _newest_id(engine: AsyncEngine) -> int:
    # Ids come from a sequence: every letter made after this read (those this run's own sends
    # cause included) has a larger id, and is left for the next run.
    async with engine.connect() as conn:
        newest = await conn.scalar(text("SELECT coalesce(max(id), 0) FROM dead_letters"))
        return int(newest)


async def _unreplayed_after(
    engine: AsyncEngine, after: int, last: int, ids: Sequence[int], limit: int
) -> list[DeadLetter]:
    params = {"after": after, "last": last, "ids": list(ids), "limit": limit}
    return await _read(engine, _UNREPLAYED_AFTER, params)


async def _read(
    engine: AsyncEngine, sql: TextClause, params: dict[str, object]
) -> list[DeadLetter]:
    async with engine.connect() as conn:
        rows = await conn.execute(sql, params)
        return [
            DeadLetter(**{**r._asdict(), "raw": bytes(r.raw), "offset": r.offset})
            for r in rows.all()
        ]


async def _release_event_ids(engine: AsyncEngine, event_ids: Sequence[str]) -> None:
    # Dead-lettering claimed the id (processed_events, outcome dead_lettered) so that a
    # redelivery of the bad record is not processed again; a replay is meant to be processed.
    # Before the send, or the indexer could read the replayed record while the claim stands.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "DELETE FROM processed_events"
                " WHERE outcome = 'dead_lettered' AND event_id = ANY(:ids)"
            ),
            {"ids": list(event_ids)},
        )


async def _mark_replayed(engine: AsyncEngine, ids: Sequence[int]) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE dead_letters SET replayed_at = now() WHERE id = ANY(:ids)"),
            {"ids": list(ids)},
        )


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None
