"""Replay lag of streaming replicas, for `kgstream status`, the query API's choice of replica
and /readyz (docs/deployment.md, "Read replicas").

A replica's lag in bytes is the primary's WAL flush position (``pg_current_wal_flush_lsn()``:
all a standby can have been sent) minus the replica's replay position
(``pg_last_wal_replay_lsn()``), 0 when the replica has replayed it all. Its lag in seconds is 0
when the bytes are 0, else an upper bound of how long ago the primary was where the replica is:
the age of the last transaction the replica replayed (now() on the replica minus
``pg_last_xact_replay_timestamp()``), or, tighter, the time since an earlier reading of the
primary's position that the replica has reached (the query API's monitor keeps those readings;
without them an idle primary's first write makes the idle time look like lag until the replica
replays it). Unknown (None) when neither bound exists: a replica that has replayed no
transaction since it started and is behind. One exception counts as caught up (0 s, the bytes
still shown): the replica has received all the primary flushed, and all it has not replayed is
one record ending exactly at a WAL page boundary. PostgreSQL replays such a record only once the
next page arrives, so on an idle primary the replica waits there until the next write (every
kgstream process heartbeats every 10 s); measured as lag it would grow with the idle time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.db.engine import DbTimeouts, make_engine

T = TypeVar("T")

_PRIMARY = text("SELECT pg_current_wal_flush_lsn()::text")
# pg_is_wal_replay_paused() raises outside recovery: the CASE keeps it from being called there.
_REPLICA = text(
    "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,"
    " extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8,"
    " CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() END,"
    " pg_last_wal_receive_lsn()::text, current_setting('wal_block_size')::int"
)


@dataclass(frozen=True)
class ReplicaPosition:
    """What a replica says of itself."""

    in_recovery: bool
    replay_lsn: int | None  # None: nothing replayed yet (or not a standby)
    replay_age_s: float | None  # since the last replayed transaction's commit on the primary
    paused: bool
    receive_lsn: int | None = None  # None: not streaming
    page: int = 8192  # wal_block_size

    def held_at_page_end(self, primary_lsn: int | None) -> bool:
        """Whether all it has not replayed is one record ending at a WAL page boundary, with
        everything the primary flushed received: PostgreSQL replays such a record only when
        the next page arrives, so on an idle primary it waits there for the next write."""
        if self.paused or self.receive_lsn is None or self.replay_lsn is None:
            return False
        received_all = primary_lsn is None or self.receive_lsn >= primary_lsn
        short = 0 < self.receive_lsn - self.replay_lsn < self.page
        return received_all and short and self.receive_lsn % self.page == 0


@dataclass(frozen=True)
class ReplicaLag:
    """One replica's lag as measured, or why it could not be."""

    name: str
    database: str  # the URL, password masked
    in_recovery: bool | None = None
    paused: bool | None = None
    lag_bytes: int | None = None
    lag_s: float | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of status and /readyz."""
        return {
            "name": self.name,
            "database": self.database,
            "in_recovery": self.in_recovery,
            "replay_paused": self.paused,
            "lag_bytes": self.lag_bytes,
            "lag_s": None if self.lag_s is None else round(self.lag_s, 3),
            "error": self.error,
        }


def parse_lsn(value: str) -> int:
    """A WAL position ``'16/B374D848'`` as a byte offset."""
    high, _, low = value.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


async def primary_position(conn: AsyncConnection) -> int:
    """The primary's WAL flush position."""
    return parse_lsn(str(await conn.scalar(_PRIMARY)))


async def replica_position(conn: AsyncConnection) -> ReplicaPosition:
    """The replica's replay position and the age of what it last replayed."""
    row = (await conn.execute(_REPLICA)).one()
    return ReplicaPosition(
        in_recovery=bool(row[0]),
        replay_lsn=None if row[1] is None else parse_lsn(str(row[1])),
        replay_age_s=None if row[2] is None else max(0.0, float(row[2])),
        paused=bool(row[3]),
        receive_lsn=None if row[4] is None else parse_lsn(str(row[4])),
        page=int(row[5]),
    )


def lag_of(
    name: str,
    database: str,
    position: ReplicaPosition,
    primary_lsn: int | None,
    reached_s: float | None = None,
) -> ReplicaLag:
    """The lag by the rule of this module's docstring (``reached_s``: seconds since a reading
    of the primary's position at or before the replica's replay position, if known). A server
    not in recovery is no standby: it is as new as itself (lag 0) and says so."""
    if not position.in_recovery:
        return ReplicaLag(name, database, False, False, 0, 0.0)
    if position.replay_lsn is None:
        return ReplicaLag(name, database, True, position.paused, error="nothing replayed yet")
    lag_bytes = None if primary_lsn is None else max(0, primary_lsn - position.replay_lsn)
    bounds = [b for b in (position.replay_age_s, reached_s) if b is not None]
    caught_up = lag_bytes == 0 or position.held_at_page_end(primary_lsn)
    lag_s = 0.0 if caught_up else min(bounds, default=None)
    return ReplicaLag(name, database, True, position.paused, lag_bytes, lag_s)


async def measure(
    primary: AsyncEngine | None,
    replicas: Sequence[tuple[str, AsyncEngine]],
    bound_s: float,
) -> list[ReplicaLag]:
    """Every replica's lag, read concurrently (the primary first: a replica read after it can
    only be further along, never show lag it does not have). Each read is answered within
    ``bound_s``: a replica that does not answer is reported with an error and its read is left
    to end on its own (cancelling a read of a hung server itself waits: core/deadline.py)."""
    primary_lsn = None
    if primary is not None:
        try:
            primary_lsn = await within(_read_primary(primary), bound_s)
        except Exception:  # noqa: BLE001 - the replicas' seconds of lag are still worth reporting
            primary_lsn = None

    async def one(name: str, engine: AsyncEngine) -> ReplicaLag:
        database = engine.url.render_as_string(hide_password=True)
        try:
            position = await within(_read_replica(engine), bound_s)
        except TimeoutError:
            return ReplicaLag(name, database, error=f"no answer within {bound_s:g} s")
        except Exception as exc:  # noqa: BLE001 - reported, not raised: status shows every replica
            return ReplicaLag(name, database, error=describe_error(exc))
        return lag_of(name, database, position, primary_lsn)

    return list(await asyncio.gather(*(one(name, engine) for name, engine in replicas)))


async def within(work: Coroutine[Any, Any, T], bound_s: float) -> T:
    """``work``'s result, or TimeoutError after ``bound_s`` with the work left running."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=bound_s)
    if not done:
        task.add_done_callback(_consume)
        raise TimeoutError(f"no answer within {bound_s:g} s")
    return task.result()


async def _read_primary(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return await primary_position(conn)


async def _read_replica(engine: AsyncEngine) -> ReplicaPosition:
    async with engine.connect() as conn:
        return await replica_position(conn)


def _consume(task: asyncio.Future[Any]) -> None:
    # An abandoned read's failure was reported as no answer: read it so asyncio stays quiet.
    if not task.cancelled():
        task.exception()


def describe_error(exc: BaseException) -> str:
    """The first line of an error, with its type, short enough for a status line."""
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:300]


async def replica_status(
    primary: AsyncEngine,
    urls: Sequence[str],
    timeouts: DbTimeouts,
    bound_s: float,
    max_lag_s: float,
) -> list[dict[str, Any]]:
    """`kgstream status`'s ``replicas``: each replica of KGSTREAM_DATABASE_READ_URL measured now
    on a connection of its own (``measure``), and whether the query API would read from it
    (answering, at most ``max_lag_s`` behind)."""
    engines = [
        (f"replica-{i}", make_engine(url, pool_size=1, max_overflow=0, timeouts=timeouts))
        for i, url in enumerate(urls, 1)
    ]
    try:
        lags = await measure(primary, engines, bound_s)
    finally:
        for _, engine in engines:
            await engine.dispose()
    docs = []
    for lag in lags:
        doc = lag.to_dict()
        doc["usable"] = not lag.error and lag.lag_s is not None and lag.lag_s <= max_lag_s
        docs.append(doc)
    return docs
