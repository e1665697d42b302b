"""Where the query API's reads go (issue 20, deliverable 3; docs/deployment.md, "Read
replicas"): to a streaming replica of KGSTREAM_DATABASE_READ_URL when one is usable, else to
the primary or nowhere (KGSTREAM_READ_FALLBACK). Every read is one READ ONLY REPEATABLE READ
transaction whose first statement reads the published snapshot, as on the primary
(snapshot.py), so a query sees one database state whichever server it reads.

A replica is usable when its last lag check (ReplicaMonitor, on a thread and connections of its
own) succeeded, is recent, and found it at most KGSTREAM_READ_MAX_LAG_S behind; usable
replicas take reads in turn. One that fails to connect or loses its connection is left out for
KGSTREAM_READ_REPLICA_RETRY_S and comes back after its next good check. A read that asks for
``min_snapshot`` or ``after_event`` (``Wanted``) polls its target's state until it has them, up
to KGSTREAM_READ_WAIT_MAX_S; then the primary is asked once (fallback ``primary``) or the read
is refused with NotCaughtUp (409). Writes, API keys, ingest and status never come here: they
use the primary's engine."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.db.engine import DbTimeouts, make_engine
from services.core.errors import KgstreamError, TransientError
from services.core.replication import describe_error
from services.core.settings import Settings
from services.retrieval.read_observer import NO_READ_OBSERVER, ReadObserver
from services.retrieval.replica_monitor import ReadPolicy, Replica, ReplicaMonitor
from services.retrieval.schemas import QueryRequest

PRIMARY = "primary"
# While a read waits for min_snapshot / after_event it asks its target again this often: a
# healthy standby replays within milliseconds, and one ask is a one-row index read, so a wait
# adds at most 50 ms to the moment the state arrives for 20 small reads a second.
POLL_S = 0.05
# The read's first statement: the published snapshot, and whether the asked event was applied.
_STATE = text(
    "SELECT (SELECT id FROM snapshots WHERE status = 'published'),"
    " EXISTS (SELECT 1 FROM processed_events WHERE event_id = :e)"
)


class NoReadTarget(TransientError):
    """No replica is usable and KGSTREAM_READ_FALLBACK=unavailable: the API answers 503."""


class NotCaughtUp(KgstreamError):
    """The read's database did not show what the query asked to see within the wait bound:
    the API answers 409 with ``waited_for``, ``waited_s`` and the snapshot it saw."""

    def __init__(self, want: Wanted, waited_s: float, seen: ReadState, target: str) -> None:
        self.waited_for = want.to_dict()
        self.waited_s = round(waited_s, 3)
        self.seen_snapshot = seen.snapshot_id
        self.target = target
        super().__init__(
            f"waited {waited_s:.2f} s (KGSTREAM_READ_WAIT_MAX_S) for {want.describe()} on "
            f"{target}; it shows snapshot {seen.snapshot_id}"
            + ("" if want.after_event is None or seen.has_event else " without that event")
        )


@dataclass(frozen=True)
class Wanted:
    """What a read must see: at least this published snapshot, and this applied event."""

    min_snapshot: int | None = None
    after_event: str | None = None

    @classmethod
    def of(cls, req: QueryRequest) -> Wanted:
        """What a query request asks to see."""
        return cls(req.min_snapshot, req.after_event)

    def __bool__(self) -> bool:
        return self.min_snapshot is not None or self.after_event is not None

    def met_by(self, seen: ReadState) -> bool:
        """Whether a read that saw ``seen`` shows what is wanted."""
        if self.min_snapshot is not None and (seen.snapshot_id or 0) < self.min_snapshot:
            return False
        return self.after_event is None or seen.has_event

    def describe(self) -> str:
        """For people: 'snapshot >= 7 and event 'e-1''."""
        parts = []
        if self.min_snapshot is not None:
            parts.append(f"snapshot >= {self.min_snapshot}")
        if self.after_event is not None:
            parts.append(f"event {self.after_event!r} applied")
        return " and ".join(parts) or "nothing"

    def to_dict(self) -> dict[str, Any]:
        """The problem document's ``waited_for``."""
        return {"min_snapshot": self.min_snapshot, "after_event": self.after_event}


@dataclass(frozen=True)
class ReadState:
    """What a read's first statement saw."""

    snapshot_id: int | None
    has_event: bool


@dataclass
class ReadRouter:
    """Picks each read's database; ``start`` the monitor (replicas only), ``close`` at the
    end."""

    primary: AsyncEngine
    replicas: Sequence[Replica] = ()
    policy: ReadPolicy = field(default_factory=ReadPolicy)
    monitor: ReplicaMonitor | None = None
    observer: ReadObserver = NO_READ_OBSERVER  # metrics (services/retrieval/read_observer.py)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        primary: AsyncEngine,
        *,
        replicas: bool = True,
        observer: ReadObserver = NO_READ_OBSERVER,
    ) -> ReadRouter:
        """The primary plus a pool per KGSTREAM_DATABASE_READ_URL (unless ``replicas`` is
        false: the CLI and the eval read the primary only), and their lag monitor."""
        policy = ReadPolicy.from_settings(settings)
        urls = settings.database_read_urls if replicas else []
        timeouts = DbTimeouts.from_settings(settings)
        found = [
            Replica(f"replica-{i}", url, make_engine(url, timeouts=timeouts))
            for i, url in enumerate(urls, 1)
        ]
        return cls.of(primary, found, policy, observer)

    @classmethod
    def of(
        cls,
        primary: AsyncEngine,
        replicas: Sequence[Replica],
        policy: ReadPolicy,
        observer: ReadObserver = NO_READ_OBSERVER,
    ) -> ReadRouter:
        """A router over ``replicas`` with their monitor (none without replicas)."""
        monitor = None
        if replicas:
            primary_url = primary.url.render_as_string(hide_password=False)
            monitor = ReplicaMonitor(primary_url, replicas, policy, observer)
        return cls(primary, replicas, policy, monitor, observer)

    def start(self) -> None:
        """Start measuring the replicas' lag (none are read from before the first check)."""
        if self.monitor is not None:
            self.monitor.start()

    async def close(self) -> None:
        """Stop the monitor and close the replicas' pools (not the primary's: not ours)."""
        if self.monitor is not None:
            await asyncio.to_thread(self.monitor.stop)
        for replica in self.replicas:
            await replica.engine.dispose()

    def report(self) -> list[dict[str, Any]]:
        """Every replica's lag and state (status, /readyz)."""
        now = time.monotonic()
        return [r.report(now, self.policy) for r in self.replicas]

    def serviceable(self) -> str:
        """Why no read can be served now ("" when one can): no usable replica and no fallback."""
        if not self.replicas or self.policy.fallback == "primary":
            return ""
        now = time.monotonic()
        if any(r.usable(now, self.policy) for r in self.replicas):
            return ""
        return "no replica is usable and KGSTREAM_READ_FALLBACK=unavailable"

    @asynccontextmanager
    async def snapshot(
        self, want: Wanted | None = None
    ) -> AsyncIterator[tuple[AsyncConnection, int | None]]:
        """(connection, published snapshot id or None) inside the read's transaction, on the
        target this module's docstring describes."""
        want = want or Wanted()
        conn, replica, seen = await self._open(want)
        self.observer.read(PRIMARY if replica is None else replica.name)
        try:
            yield conn, seen.snapshot_id
        except DBAPIError as exc:
            if replica is not None and exc.connection_invalidated:
                replica.take_out(describe_error(exc), self.policy.retry_s)
            raise
        finally:
            await conn.close()

    async def _open(self, want: Wanted) -> tuple[AsyncConnection, Replica | None, ReadState]:
        started = time.monotonic()
        deadline = started + (self.policy.wait_max_s if want else 0.0)
        tried: set[str] = set()
        while (replica := self._pick(tried)) is not None:
            tried.add(replica.name)
            try:
                opened = await self._wait_on(replica.engine, want, deadline, replica.name)
            except (DBAPIError, OSError) as exc:
                replica.take_out(describe_error(exc), self.policy.retry_s)
                continue
            conn, seen = opened
            if want.met_by(seen):
                self._observe_wait(want, started, "met")
                return conn, replica, seen
            await conn.close()
            if self.policy.fallback != "primary":
                self._observe_wait(want, started, "refused")
                raise NotCaughtUp(want, time.monotonic() - started, seen, replica.name)
            self.observer.fallback("not_caught_up")
            deadline = 0.0  # the primary is asked once: the wait is spent
            break
        else:
            if self.replicas:
                if self.policy.fallback != "primary":
                    raise NoReadTarget(self._why_none())
                self.observer.fallback("no_usable_replica")
        conn, seen = await self._wait_on(self.primary, want, deadline, PRIMARY)
        if not want.met_by(seen):
            await conn.close()
            self._observe_wait(want, started, "refused")
            raise NotCaughtUp(want, time.monotonic() - started, seen, PRIMARY)
        self._observe_wait(want, started, "met")
        return conn, None, seen

    def _observe_wait(self, want: Wanted, started: float, outcome: str) -> None:
        if want:
            self.observer.waited(outcome, time.monotonic() - started)

    def _pick(self, tried: set[str]) -> Replica | None:
        """The next usable replica in turn that this read has not tried."""
        now = time.monotonic()
        usable = [r for r in self.replicas if r.name not in tried and r.usable(now, self.policy)]
        return usable[next(self._turn) % len(usable)] if usable else None

    def _why_none(self) -> str:
        now = time.monotonic()
        reasons = []
        for r in self.replicas:
            doc = r.report(now, self.policy)
            why = doc["error"] or f"{doc['lag_s']} s behind"
            reasons.append(f"{r.name}: {why}")
        listed = "; ".join(reasons)
        return f"no replica is usable ({listed}); KGSTREAM_READ_FALLBACK=unavailable"

    async def _wait_on(
        self, engine: AsyncEngine, want: Wanted, deadline: float, target: str
    ) -> tuple[AsyncConnection, ReadState]:
        """A connection inside a read transaction that shows ``want``, or the last one tried
        at ``deadline`` (the caller checks). While it waits, ``target`` counts in
        kgstream_query_read_waiting."""
        conn = await engine.connect()
        waited = False
        try:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            while True:
                await conn.begin()
                await conn.execute(text("SET TRANSACTION READ ONLY"))
                row = (await conn.execute(_STATE, {"e": want.after_event})).one()
                seen = ReadState(None if row[0] is None else int(row[0]), bool(row[1]))
                left = deadline - time.monotonic()
                if want.met_by(seen) or left <= 0:
                    return conn, seen
                await conn.rollback()  # a new transaction sees what was replayed meanwhile
                if not waited:
                    waited = True
                    self.observer.waiting(target, 1)
                await asyncio.sleep(min(POLL_S, left))
        except BaseException:
            await conn.close()
            raise
        finally:
            if waited:
                self.observer.waiting(target, -1)


@asynccontextmanager
async def measuring(reads: ReadRouter | None) -> AsyncIterator[None]:
    """The router's replica monitor running for the block (the API's lifespan), then closed."""
    if reads is None:
        yield
        return
    reads.start()
    try:
        yield
    finally:
        await reads.close()
