"""Which log the indexer reads, and what a broker that lost it took along (issue 30).

A broker on memory storage (the embedded one) forgets every record, topic and committed offset
when it restarts; `kgstream up` then creates the topics again. A consumer that keeps its old
position would then skip the new log's first records whenever the publishers had refilled it
past that position before its next fetch (the chaos test's stall after a broker restart): the
offsets mean nothing across logs. Kafka names each topic with an id (KIP-516) that a recreated
topic does not share, so the indexer remembers, per consumer group, the id of the documents
topic it reads (``topic_identities``), and the greatest end offset it has seen per partition
(``indexer_progress.seen_end_offset``):

- while it runs, ``TopicWatch`` reads the id with the lag refresh; a new id ends the process
  for a restart (a consumer cannot be trusted to notice on its own);
- when it starts, ``reconcile`` compares the id: a new one means the old log is gone. The
  records the broker had acknowledged and the group had not applied (from its next offset up
  to the greatest end offset seen, per partition) are recorded in ``broker_losses`` and logged
  as an error, with their offsets; then the group's own record of where each partition is
  (``indexer_progress.next_offset``) is set to 0, and the events the query API accepted (202) that
  the indexer has not handled are published again (services/core/accepted_events.py). Only
  events published straight to Kafka stay lost: their publishers must send them again;
- whenever partitions are assigned, ``resume_at`` gives each one the smaller of the broker's
  committed offset and that record, and the indexer seeks there: a broker's committed offset
  may belong to the old log (the old process committed in the new one before it noticed),
  and the broker refuses a commit from outside the group while a dead member lingers in it,
  so the rewind lives in the database. Reading again from a lower offset is always safe
  (events already handled are skipped by id); only a higher one could lose events.

What is counted is a lower bound: records acknowledged after the last end offset was seen
(seconds before the broker stopped) are lost too, and cannot be known."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core import accepted_events

log = logging.getLogger(__name__)
TIMEOUT_MS = 3000


@dataclass(frozen=True)
class Described:
    """What the broker says of a topic: its id and its partitions."""

    topic_id: str
    partitions: tuple[int, ...]


def _admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=bootstrap.split(","),
        client_id="kgstream-topic-identity",
        request_timeout_ms=TIMEOUT_MS,
        bootstrap_timeout_ms=TIMEOUT_MS,
    )


def _describe(admin: KafkaAdminClient, topic: str) -> Described | None:
    found: list[dict[str, Any]] = admin.describe_topics([topic])
    for item in found:
        topic_id = item.get("topic_id")
        if item.get("error_code") == 0 and topic_id and set(str(topic_id)) - {"0", "-"}:
            parts = tuple(sorted(int(p["partition_index"]) for p in item.get("partitions") or ()))
            return Described(str(topic_id), parts)
    return None


def describe_topic(bootstrap: str, topic: str) -> Described | None:
    """The topic's id and partitions as the broker reports them; None when it cannot say (no
    such topic, a broker without topic ids, no answer). Blocking."""
    try:
        admin = _admin(bootstrap)
    except Exception as exc:  # noqa: BLE001 - unknown is an answer here
        log.info("no topic id for %s: %s", topic, exc)
        return None
    try:
        return _describe(admin, topic)
    except Exception as exc:  # noqa: BLE001 - unknown is an answer here
        log.info("no topic id for %s: %s", topic, exc)
        return None
    finally:
        admin.close()


@dataclass(frozen=True)
class Loss:
    """Records a replaced log took along: per partition, [first, end) offsets never applied."""

    topic: str
    old_topic_id: str
    new_topic_id: str
    ranges: dict[int, tuple[int, int]]
    republished: int = 0  # accepted events (HTTP, MCP) published again

    @property
    def records(self) -> int:
        return sum(end - first for first, end in self.ranges.values())

    def describe(self) -> str:
        spans = ", ".join(
            f"partition {p}: offsets {a}..{b - 1}" for p, (a, b) in self.ranges.items()
        )
        return (
            f"the broker replaced topic {self.topic} (id {self.old_topic_id} -> "
            f"{self.new_topic_id}): at least {self.records} records it had acknowledged were "
            f"never applied ({spans or 'none'}); {self.republished} events accepted over "
            "HTTP or MCP were published again, the others (published straight to Kafka) are "
            "lost: publish them again from their source"
        )


_STORED = text(
    "SELECT topic_id FROM topic_identities WHERE consumer_group = :g AND topic = :t FOR UPDATE"
)
_REMEMBER = text(
    "INSERT INTO topic_identities (consumer_group, topic, topic_id) VALUES (:g, :t, :i)"
    " ON CONFLICT (consumer_group, topic) DO UPDATE SET topic_id = EXCLUDED.topic_id,"
    " seen_at = now()"
)
_UNAPPLIED = text(
    "SELECT partition, next_offset, seen_end_offset FROM indexer_progress"
    " WHERE consumer_group = :g AND topic = :t AND seen_end_offset > next_offset"
    " ORDER BY partition"
)
_RECORD_LOSS = text(
    "INSERT INTO broker_losses (consumer_group, topic, old_topic_id, new_topic_id, records,"
    " ranges, republished) VALUES (:g, :t, :old, :new, :n, CAST(:ranges AS jsonb), :r)"
)
Republish = Callable[[list[tuple[bytes, bytes]]], int]
"""Sends (key, value) records to the documents topic and waits for the acks (blocking)."""
_REWIND = text(
    "INSERT INTO indexer_progress (consumer_group, topic, partition, next_offset)"
    " SELECT :g, :t, p, 0 FROM unnest(CAST(:ps AS int[])) AS u(p)"
    " ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET next_offset = 0,"
    " seen_end_offset = 0, retrying_since = NULL, updated_at = now()"
)
_DROP_GONE = text(
    "DELETE FROM indexer_progress WHERE consumer_group = :g AND topic = :t"
    " AND partition <> ALL(CAST(:ps AS int[]))"
)
_NEXT_OFFSETS = text(
    "SELECT partition, next_offset FROM indexer_progress"
    " WHERE consumer_group = :g AND topic = :t AND partition = ANY(CAST(:ps AS int[]))"
)
_SEEN_ENDS = text(
    "UPDATE indexer_progress SET seen_end_offset = GREATEST(seen_end_offset, u.e)"
    " FROM unnest(CAST(:ps AS int[]), CAST(:es AS bigint[])) AS u(p, e)"
    " WHERE consumer_group = :g AND topic = :t AND partition = u.p"
)


async def reconcile(
    engine: AsyncEngine,
    group: str,
    topic: str,
    described: Described | None,
    *,
    republish: Republish,
) -> Loss | None:
    """At the indexer's start, before it consumes: remember the topic's current id; if
    another was remembered, record what was lost, set the group's record of every partition
    to offset 0 (``resume_at``) and ``republish`` the accepted events not handled yet.
    Returns the loss, if any."""
    if described is None:
        return None
    topic_id = described.topic_id
    async with engine.begin() as conn:
        old = await conn.scalar(_STORED, {"g": group, "t": topic})
        await conn.execute(_REMEMBER, {"g": group, "t": topic, "i": topic_id})
        if old is None or old == topic_id:
            return None
        # The accepted events are sent before this transaction commits: a crash before the
        # commit leaves the old id remembered, and the next start does all of it again (a
        # second copy of an event is skipped by its id).
        waiting = await accepted_events.pending(conn)
        sent = await asyncio.to_thread(republish, waiting) if waiting else 0
        loss = await _record_loss(conn, group, topic, (str(old), topic_id), sent)
        partitions = list(described.partitions)
        await conn.execute(_DROP_GONE, {"g": group, "t": topic, "ps": partitions})
        await conn.execute(_REWIND, {"g": group, "t": topic, "ps": partitions})
    log.error("%s; group %s reads the new log from its start (partitions %s)",
              loss.describe(), group, partitions)  # fmt: skip
    return loss


async def _record_loss(
    conn: AsyncConnection, group: str, topic: str, ids: tuple[str, str], republished: int
) -> Loss:
    rows = (await conn.execute(_UNAPPLIED, {"g": group, "t": topic})).all()
    ranges = {int(r.partition): (int(r.next_offset), int(r.seen_end_offset)) for r in rows}
    loss = Loss(topic, ids[0], ids[1], ranges, republished)
    await conn.execute(
        _RECORD_LOSS,
        {
            "g": group,
            "t": topic,
            "old": ids[0],
            "new": ids[1],
            "n": loss.records,
            "ranges": json.dumps({str(p): list(span) for p, span in ranges.items()}),
            "r": republished,
        },
    )
    return loss


async def resume_at(
    conn: AsyncConnection, group: str, topic: str, committed: dict[int, int | None]
) -> dict[int, int]:
    """Partitions (of those assigned, with the broker's committed offsets) that must be read
    from lower than the broker says: partition -> the group's own record, where that is
    lower. A partition the broker has nothing committed for starts at its beginning anyway."""
    parts = sorted(committed)
    rows = (await conn.execute(_NEXT_OFFSETS, {"g": group, "t": topic, "ps": parts})).all()
    mine = {int(r.partition): int(r.next_offset) for r in rows}
    return {
        p: mine[p] for p, at in committed.items() if at is not None and p in mine and mine[p] < at
    }


async def remember_ends(
    conn: AsyncConnection, group: str, topic: str, ends: dict[int, int]
) -> None:
    """Keep the greatest end offset seen per partition (what a lost log is counted against)."""
    if ends:
        parts = sorted(ends)
        await conn.execute(
            _SEEN_ENDS,
            {"g": group, "t": topic, "ps": parts, "es": [ends[p] for p in parts]},
        )


class TopicWatch:
    """The id this process started with, compared with the broker's on each refresh (one
    admin connection kept between reads, dropped after a failure)."""

    def __init__(self, bootstrap: str, topic: str, started_with: str | None) -> None:
        self.bootstrap, self.topic, self.started_with = bootstrap, topic, started_with
        self._client: KafkaAdminClient | None = None

    def close(self) -> None:
        """Close the admin connection, if any."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _current(self) -> str | None:
        try:
            if self._client is None:
                self._client = _admin(self.bootstrap)
            described = _describe(self._client, self.topic)
        except Exception as exc:  # noqa: BLE001 - unknown now: asked again next round
            log.info("no topic id for %s: %s", self.topic, exc)
            self.close()
            return None
        return None if described is None else described.topic_id

    def replaced(self) -> str | None:
        """A reason to restart when the broker now reports another id for the topic (None:
        the same, or unknown now). Blocking."""
        now = self._current()
        if now is None or self.started_with is None or now == self.started_with:
            return None
        return (
            f"the broker replaced topic {self.topic} (id {self.started_with} -> {now}): "
            "the consumer's positions belong to the old log"
        )


WATCH_INTERVAL_S = 2.0
"""How often the running indexer reads the topic's id and end offsets: records acknowledged in
the last interval before a broker dies are lost uncounted."""


async def run_watch(
    engine: AsyncEngine,
    watch: TopicWatch,
    group: str,
    ends: Callable[[], Awaitable[dict[int, int]]],
    on_replaced: Callable[[str], None],
    *,
    interval_s: float = WATCH_INTERVAL_S,
) -> None:
    """Until cancelled: end offsets remembered (``ends``: the documents partitions this
    process owns), and ``on_replaced`` called with the reason once the topic has a new id."""
    while True:
        try:
            reason = await asyncio.to_thread(watch.replaced)
            if reason is not None:
                on_replaced(reason)
                return
            seen = await ends()
            if seen:
                async with engine.begin() as conn:
                    await remember_ends(conn, group, watch.topic, seen)
        except Exception as exc:  # noqa: BLE001 - observational: the next round tries again
            log.info("topic watch: %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(interval_s)
