"""One recompute at a time across replicas: a session-level PostgreSQL advisory lock held on a
dedicated connection for the whole recompute. If the process dies the connection closes and
the lock goes with it; nothing is left to clean up."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg

# Any constant bigint shared by all replicas; this one spells "kgcomm" in ASCII.
RECOMPUTE_LOCK_KEY = 0x6B67636F6D6D


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://) as psycopg itself accepts it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextlib.asynccontextmanager
async def recompute_lock(database_url: str, key: int = RECOMPUTE_LOCK_KEY) -> AsyncIterator[bool]:
    """Yields True while this process holds the lock, False (at once) when another does."""
    conn = await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True)
    try:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        row = await cur.fetchone()
        held = bool(row and row[0])
        try:
            yield held
        finally:
            if held and not conn.closed:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    finally:
        await conn.close()
