"""`kgstream recompute`: a request is a timestamp in kg_meta (by the database clock); the
communities worker treats it as pending until a snapshot created at or after it is published,
so repeated requests collapse into one and a request made mid-build gets a fresh build."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.change_state import REQUEST_KEY


@dataclass(frozen=True)
class Answer:
    """The snapshot that answered a request (status 'published'/'retired', or 'failed')."""

    snapshot_id: int
    status: str


async def request_recompute(engine: AsyncEngine) -> datetime:
    """Record a request; returns its time."""
    async with engine.begin() as conn:
        at = await conn.scalar(
            text(
                "INSERT INTO kg_meta (key, value) VALUES (:k, now()::text)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
                " RETURNING value::timestamptz"
            ),
            {"k": REQUEST_KEY},
        )
    if not isinstance(at, datetime):
        raise TypeError("kg_meta did not return a timestamp")
    return at


async def wait_for_answer(
    engine: AsyncEngine, requested_at: datetime, timeout_s: float, poll_s: float = 0.5
) -> Answer | None:
    """The first snapshot built after the request that was published or failed; None on
    timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT id, status FROM snapshots WHERE created_at >= :t"
                        " AND status IN ('published', 'retired', 'failed') ORDER BY id LIMIT 1"
                    ),
                    {"t": requested_at},
                )
            ).first()
        if row is not None:
            return Answer(int(row.id), str(row.status))
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(poll_s)
