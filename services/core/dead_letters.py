"""Reading and replaying dead letters (`kgstream dlq list|replay`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kafka import KafkaProducer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.producer import send_all


@dataclass(frozen=True)
class DeadLetter:
    """One row of dead_letters."""

    id: int
    event_id: str | None
    doc_id: str | None
    topic: str
    partition: int
    offset: int
    key: str | None
    reason: str
    detail: str
    created_at: datetime
    replayed_at: datetime | None
    raw: bytes

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, with the payload as text where it decodes."""
        out = {k: v for k, v in self.__dict__.items() if k != "raw"}
        out["created_at"] = self.created_at.isoformat()
        out["replayed_at"] = self.replayed_at.isoformat() if self.replayed_at else None
        out["raw"] = self.raw.decode("utf-8", "replace")[:2000]
        return out


async def list_dead_letters(
    engine: AsyncEngine,
    *,
    include_replayed: bool = False,
    ids: Sequence[int] = (),
    limit: int = 100,
) -> list[DeadLetter]:
    """Newest first; replayed ones only when asked."""
    sql = (
        'SELECT id, event_id, doc_id, topic, partition, "offset", key, reason, detail,'
        " created_at, replayed_at, raw FROM dead_letters WHERE (:all OR replayed_at IS NULL)"
        " AND (cardinality(CAST(:ids AS bigint[])) = 0 OR id = ANY(:ids))"
        " ORDER BY id DESC LIMIT :limit"
    )
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(sql), {"all": include_replayed, "ids": list(ids), "limit": limit}
        )
        return [
            DeadLetter(**{**r._asdict(), "raw": bytes(r.raw), "offset": r.offset})
            for r in rows.all()
        ]


async def mark_replayed(engine: AsyncEngine, ids: Sequence[int]) -> None:
    """Record that these letters went back to the source topic."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE dead_letters SET replayed_at = now() WHERE id = ANY(:ids)"),
            {"ids": list(ids)},
        )


def republish(producer: KafkaProducer, topic: str, letters: Sequence[DeadLetter]) -> int:
    """Send each raw payload again with its original key; waits for the broker's acks."""
    return send_all(
        producer,
        topic,
        [(d.key.encode("utf-8") if d.key is not None else None, d.raw) for d in letters],
    )
