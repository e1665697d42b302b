"""Reads of the graph as one exact state, and packed bulk reads (the communities' recompute,
services/communities/loader.py, and the query process's in-memory graph,
services/retrieval/graph_memory.py).

Exact watermark: graph_changes ids come from a sequence, so a writer still in flight can hold
a smaller id than one already committed. ``graph_snapshot`` briefly takes SHARE on
graph_changes (waits for in-flight writers, blocks new ones), exports that snapshot to the
reading connection, and lets go at once: every id at or below the watermark is then in what
it reads, every later change is above it. Writers are held for milliseconds, not for the whole
load.

Packed reads: the server packs rows into a few bytea values of fixed-width binary records that
become numpy arrays with one ``frombuffer`` (no ORM objects, no per-row Python: a binary COPY
arrives as one message per row, and reading 1M of those through the async driver cost ~2 s at
1M edges)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.errors import TransientError

_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")


@contextlib.asynccontextmanager
async def graph_snapshot(
    engine: AsyncEngine, lock_timeout_s: float = 10.0
) -> AsyncIterator[tuple[AsyncConnection, int]]:
    """A REPEATABLE READ, read-only connection and the exact graph_changes watermark of the
    data it sees."""
    async with engine.connect() as holder, engine.connect() as reader:
        await holder.execution_options(isolation_level="REPEATABLE READ")
        await reader.execution_options(isolation_level="REPEATABLE READ")
        async with holder.begin():
            await holder.execute(
                text("SELECT set_config('lock_timeout', :ms, true)"),
                {"ms": f"{int(lock_timeout_s * 1000)}ms"},
            )
            try:
                await holder.execute(text("LOCK TABLE graph_changes IN SHARE MODE"))
            except Exception as exc:
                raise TransientError(f"could not freeze graph_changes: {exc}") from exc
            snapshot = str(await holder.scalar(text("SELECT pg_export_snapshot()")))
            if not _SNAPSHOT_ID.match(snapshot):
                raise ValueError(f"unexpected snapshot id {snapshot!r}")
            await reader.begin()
            # SET TRANSACTION SNAPSHOT takes a literal, not a parameter; the id is checked above.
            await reader.execute(text(f"SET TRANSACTION SNAPSHOT '{snapshot}'"))
            await reader.execute(text("SET TRANSACTION READ ONLY"))
        watermark = int(
            await reader.scalar(text("SELECT coalesce(max(id), 0) FROM graph_changes")) or 0
        )
        try:
            yield reader, watermark
        finally:
            await reader.rollback()


async def fetch_packed(
    conn: AsyncConnection, sql: str, row: np.dtype, params: tuple[Any, ...] = ()
) -> npt.NDArray[np.void]:
    """Run ``sql``, whose rows are (record count, bytea of that many ``row`` records), and
    return all records. A record with a NULL field would vanish from the aggregate: the
    counts catch it."""
    driver = await psycopg_connection(conn)
    async with driver.cursor(binary=True) as cur:
        await cur.execute(sql, params)
        groups = await cur.fetchall()
    data = b"".join(bytes(packed) for _, packed in groups if packed is not None)
    if len(data) != sum(int(count) for count, _ in groups) * row.itemsize:
        raise ValueError("packed rows have a NULL field or an unexpected layout")
    return np.frombuffer(data, dtype=row)


async def psycopg_connection(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under a SQLAlchemy one (for COPY), in the same transaction."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise TypeError("the engine must use psycopg 3 (postgresql+psycopg://)")
    return driver
