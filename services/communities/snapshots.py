"""The snapshot lifecycle: a 'building' row, an atomic publish (the old 'published' becomes
'retired' in the same transaction, so a reader sees the old snapshot or the new one, never
both or neither), retention of the last N, and the `kgstream.snapshots` announcement."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.contracts import schema_errors
from services.core.producer import discard

Announcer = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Published:
    """The published snapshot row."""

    id: int
    published_at: datetime
    watermark: int
    nodes: int
    edges: int
    communities: int
    levels: int
    reports_reused: int
    reports_generated: int

    def event(self) -> dict[str, Any]:
        """The snapshot published v1 event (schemas/snapshot_published.v1.json)."""
        event = {
            "schema_version": 1,
            "snapshot_id": self.id,
            "published_at": self.published_at.isoformat(),
            "watermark": self.watermark,
            "nodes": self.nodes,
            "edges": self.edges,
            "communities": self.communities,
            "levels": self.levels,
            "reports_reused": self.reports_reused,
            "reports_generated": self.reports_generated,
        }
        problems = schema_errors(event, "snapshot_published.v1")
        if problems:
            raise ValueError("snapshot event violates its contract: " + "; ".join(problems))
        return event


@dataclass(frozen=True)
class PublishedState:
    """The published snapshot as the metrics show it: id, when, communities per level."""

    id: int
    published_at: datetime
    by_level: dict[int, int]


async def published_state(engine: AsyncEngine) -> PublishedState | None:
    """The published snapshot, or None before the first one."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT id, published_at FROM snapshots WHERE status = 'published'")
            )
        ).first()
        if row is None:
            return None
        levels = await conn.execute(
            text("SELECT level, count(*) AS n FROM communities WHERE snapshot_id = :s GROUP BY 1"),
            {"s": row.id},
        )
        return PublishedState(
            int(row.id), row.published_at, {int(r.level): int(r.n) for r in levels}
        )


async def begin(engine: AsyncEngine, watermark: int, nodes: int, edges: int) -> int:
    """A new 'building' snapshot. Called under the recompute lock, so any other 'building'
    row was left by a worker that died: it is marked failed."""
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE snapshots SET status = 'failed' WHERE status = 'building'"))
        snapshot_id = await conn.scalar(
            text(
                "INSERT INTO snapshots (status, watermark, nodes, edges)"
                " VALUES ('building', :w, :n, :e) RETURNING id"
            ),
            {"w": watermark, "n": nodes, "e": edges},
        )
    return int(snapshot_id)


@dataclass(frozen=True)
class Counts:
    """What a built snapshot holds."""

    watermark: int
    nodes: int
    edges: int
    communities: int
    levels: int
    reused: int
    generated: int


async def publish(engine: AsyncEngine, snapshot_id: int, counts: Counts) -> Published:
    """Record the counts and make ``snapshot_id`` the published snapshot, in one transaction."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE snapshots SET status = 'retired' WHERE status = 'published'")
        )
        row = (
            await conn.execute(
                text(
                    "UPDATE snapshots SET status = 'published', published_at = now(),"
                    " watermark = :watermark, nodes = :nodes, edges = :edges,"
                    " communities = :communities, levels = :levels,"
                    " reports_reused = :reused, reports_generated = :generated"
                    " WHERE id = :id AND status = 'building'"
                    " RETURNING id, published_at, watermark, nodes, edges, communities, levels,"
                    " reports_reused, reports_generated"
                ),
                {"id": snapshot_id, **dataclasses.asdict(counts)},
            )
        ).one_or_none()
        if row is None:
            raise RuntimeError(f"snapshot {snapshot_id} is no longer 'building'; not published")
    return Published(**row._asdict())


async def fail(engine: AsyncEngine, snapshot_id: int) -> None:
    """Mark a snapshot whose build went wrong; its rows go with the next pruning."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE snapshots SET status = 'failed' WHERE id = :id AND status = 'building'"),
            {"id": snapshot_id},
        )


# A snapshot's rows, deleted with it (no foreign keys since migration 0009: the writer keeps
# them consistent, see services/communities/writer.py).
SNAPSHOT_TABLES = ("community_members", "snapshot_entities", "communities")


async def prune(engine: AsyncEngine, keep: int) -> int:
    """Keep the newest ``keep`` published/retired snapshots; drop older ones and failed ones
    with their rows. Readers still inside an older snapshot keep seeing it (MVCC), so this is
    safe live. Rows of a snapshot that is being written cannot be orphaned: the writer holds
    its 'building' row locked, and a 'building' row is never pruned."""
    async with engine.begin() as conn:
        result = await conn.execute(
            text(
                "DELETE FROM snapshots WHERE status IN ('retired', 'failed') AND id NOT IN"
                " (SELECT id FROM snapshots WHERE status IN ('published', 'retired')"
                "  ORDER BY id DESC LIMIT :keep) RETURNING id"
            ),
            {"keep": keep},
        )
        ids = [int(i) for i in result.scalars()]
        if ids:
            for table in SNAPSHOT_TABLES:
                await conn.execute(
                    text(f"DELETE FROM {table} WHERE snapshot_id = ANY(:ids)"),  # noqa: S608 - table names are constants
                    {"ids": ids},
                )
    return len(ids)


class KafkaAnnouncer:
    """Announces on ``topic`` with a kafka-python producer from ``make_producer`` (waits for
    the broker's ack). A failed send drops the producer and the next announcement makes a new
    one: a restarted broker has forgotten it (issue 30)."""

    def __init__(
        self, make_producer: Callable[[], Any], topic: str, timeout_s: float = 30.0
    ) -> None:
        self.make_producer, self.topic, self.timeout_s = make_producer, topic, timeout_s
        self._producer: Any = None

    async def __call__(self, event: dict[str, Any]) -> None:
        value = json.dumps(event, separators=(",", ":")).encode("utf-8")
        if self._producer is None:
            self._producer = await asyncio.to_thread(self.make_producer)
        producer = self._producer
        try:
            future = producer.send(self.topic, key=str(event["snapshot_id"]).encode(), value=value)
            await asyncio.to_thread(future.get, self.timeout_s)
        except Exception:
            self._producer = None
            discard(producer, self.timeout_s)
            raise

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the producer, if one was made."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=timeout_s)


def kafka_announcer(
    make_producer: Callable[[], Any], topic: str, timeout_s: float = 30.0
) -> KafkaAnnouncer:
    """A ``KafkaAnnouncer``."""
    return KafkaAnnouncer(make_producer, topic, timeout_s)
