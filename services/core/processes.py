"""The ``processes`` table: every kgstream process registers at start, heartbeats every
HEARTBEAT_S seconds and deletes its row on an orderly stop; a row whose heartbeat is older than
FRESH_S belongs to a process that died (it is ignored, and cleared by later registrations)."""

from __future__ import annotations

import os
import socket
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

HEARTBEAT_S = 10.0
FRESH_S = 3 * HEARTBEAT_S
FORGET_AFTER_S = 3600.0

_REGISTER = text(
    "INSERT INTO processes (name, pid, host, metrics_url) VALUES (:n, :p, :h, :u) RETURNING id"
)
# The same host and pid is an earlier life of this process (a restarted container): gone.
_FORGET = text(
    "DELETE FROM processes WHERE (host = :h AND pid = :p)"
    " OR heartbeat_at < now() - make_interval(secs => :old)"
)
_BEAT = text("UPDATE processes SET heartbeat_at = now() WHERE id = :i")
_FRESH = text(
    "SELECT name, pid, host, metrics_url FROM processes"
    " WHERE heartbeat_at >= now() - make_interval(secs => :fresh) ORDER BY name, started_at, id"
)


def host_name() -> str:
    """This machine's name, as the processes table records it."""
    return socket.gethostname()


async def register(engine: AsyncEngine, name: str, metrics_url: str | None) -> int:
    """A row for this process; its id."""
    host, pid = host_name(), os.getpid()
    async with engine.begin() as conn:
        await conn.execute(_FORGET, {"h": host, "p": pid, "old": FORGET_AFTER_S})
        row_id = await conn.scalar(_REGISTER, {"n": name, "p": pid, "h": host, "u": metrics_url})
    return int(row_id)


async def heartbeat(engine: AsyncEngine, row_id: int) -> bool:
    """Mark the row alive; False when it is gone (then register again)."""
    async with engine.begin() as conn:
        result = await conn.execute(_BEAT, {"i": row_id})
    return bool(result.rowcount)


async def deregister(engine: AsyncEngine, row_id: int) -> None:
    """Delete the row (orderly stop)."""
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM processes WHERE id = :i"), {"i": row_id})


async def live_processes(conn: AsyncConnection) -> list[dict[str, Any]]:
    """Processes with a fresh heartbeat: name, pid, host, metrics_url."""
    rows = (await conn.execute(_FRESH, {"fresh": FRESH_S})).all()
    return [
        {"name": r.name, "pid": int(r.pid), "host": r.host, "metrics_url": r.metrics_url}
        for r in rows
    ]
