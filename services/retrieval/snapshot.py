"""One read-only REPEATABLE READ transaction per request, and the published snapshot it reads:
every statement of a query sees the same database state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@asynccontextmanager
async def read_snapshot(engine: AsyncEngine) -> AsyncIterator[tuple[AsyncConnection, int | None]]:
    """(connection, id of the published community snapshot or None) inside the transaction."""
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="REPEATABLE READ")
        async with conn.begin():
            await conn.execute(text("SET TRANSACTION READ ONLY"))
            snapshot_id = await conn.scalar(
                text("SELECT id FROM snapshots WHERE status = 'published'")
            )
            yield conn, (None if snapshot_id is None else int(snapshot_id))
