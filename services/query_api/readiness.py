"""The query API's readiness (/readyz), kept cheap and true under load and outages (issue 18,
findings 4, 10 and 13): it reads the database on a connection of its own (not the query
pool, which a query flood holds), on an event loop of its own (not the one the flood
saturates), one check at a time, and answers within ``readiness_budget_s``: 503 naming what did
not answer beyond it. The indexer's state uses the stall rule of `kgstream status` (retrying
too long, or records waiting at the broker while the offset stands still), with end offsets
from the broker asked on that loop too and bounded by the same budget. Read replicas (issue 20)
are reported as their monitor last measured them (replica_monitor.py: its own loop, each check
within the same budget), so a hung replica costs /readyz nothing; 503 also when no replica is
usable and KGSTREAM_READ_FALLBACK=unavailable (no query could be answered)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from services.core.db.engine import DbTimeouts, make_engine
from services.core.deadline import BackgroundLoop, DeadlineExceeded, LoopStopped, SingleFlight
from services.core.indexer_health import OffsetReader, health, read_progress
from services.core.settings import Settings
from services.retrieval.replicas import ReadRouter
from services.retrieval.snapshot import read_snapshot

ENDS_MAX_AGE_S = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class ReadyState:
    """What one check read: the published snapshot and the indexer's health document."""

    snapshot_id: int | None
    indexer: dict[str, Any]


class Readiness:
    """Answers /readyz; ``close`` at shutdown."""

    def __init__(
        self,
        settings: Settings,
        database_url: str,
        bootstrap: str,
        reads: ReadRouter | None = None,
    ) -> None:
        budget = settings.readiness_budget_s
        self._reads = reads  # the replicas' lag as last checked: no replica I/O here
        self._stall_after_s = settings.indexer_stall_after_s
        # Its own connection, whose statements the server also cuts at the budget.
        self._engine = make_engine(
            database_url,
            pool_size=1,
            max_overflow=1,  # room for a new check while a cancelled one lets go of its own
            timeouts=DbTimeouts(connect_s=settings.db_connect_timeout_s, statement_s=budget),
        )
        self._offsets = OffsetReader(bootstrap)
        self._asking: asyncio.Future[dict[tuple[str, int], int]] | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self._ends_at = 0.0
        self._broker_answers = False  # whether the last question got end offsets
        self._broker_budget_s = budget / 2
        self._loop = BackgroundLoop("kgstream-readiness")
        give_up = float(settings.db_connect_timeout_s)
        # One check at a time for both ports: it lives on the readiness loop, where the API's
        # port asks too (answer), so its pool of 1 + 1 connections is never shared by two.
        self._check = SingleFlight(self._read, budget, give_up, "the database")

    @property
    def database(self) -> str:
        """The database URL with the password masked."""
        return self._engine.url.render_as_string(hide_password=True)

    async def answer(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): 200 when the database answered within the budget, with the
        indexer's state (ok | stalled | unknown) and the published snapshot; else 503."""
        try:
            return await self._loop.run(self.answer_here())
        except LoopStopped as exc:
            return 503, {"status": "unavailable", "detail": str(exc)}

    async def answer_here(self) -> tuple[int, dict[str, Any]]:
        """``answer`` for a caller running on the readiness thread's loop (``on_loop``)."""
        return await self._answer()

    def on_loop(self, work: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``work`` on the readiness thread's loop."""
        return self._loop.submit(work)

    async def _answer(self) -> tuple[int, dict[str, Any]]:
        replicas = self._reads.report() if self._reads is not None else []
        try:
            state = await self._check()
        except DeadlineExceeded as exc:
            return 503, {"status": "unavailable", "detail": str(exc), "replicas": replicas}
        except Exception as exc:  # noqa: BLE001 - readiness reports any failure
            return 503, {"status": "unavailable", "detail": str(exc)[:300], "replicas": replicas}
        unserved = self._reads.serviceable() if self._reads is not None else ""
        if unserved:
            return 503, {"status": "unavailable", "detail": unserved, "replicas": replicas}
        doc = state.indexer
        stalled = sorted(
            f"{p['topic']}/{p['partition']}" for p in doc["partitions"] if p["stalled"]
        )
        indexer = "unknown" if not doc["partitions"] else "stalled" if stalled else "ok"
        return 200, {
            "status": "ready",
            "database": self.database,
            "indexer": indexer,
            "stalled_partitions": stalled,
            "lag_source": doc["lag_source"],
            "snapshot": state.snapshot_id,
            "replicas": replicas,
        }

    def close(self) -> None:
        """Dispose of the connection and stop the loop for good (bounded: a hung server is
        left); later probes answer 503 without opening anything."""
        self._loop.stop(self._engine.dispose())
        self._offsets.close()

    async def _read(self) -> ReadyState:
        async with read_snapshot(self._engine) as (conn, snapshot_id):
            progress = await read_progress(conn)
        ends = await self._end_offsets({(p.topic, p.partition) for p in progress})
        return ReadyState(snapshot_id, health(progress, ends, self._stall_after_s))

    async def _end_offsets(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        # One question to the broker at a time, awaited for at most half the budget, and not
        # at all while the broker is not answering; a late answer is kept for the next check.
        # End offsets older than ENDS_MAX_AGE_S are not used: without them the stall rule
        # counts only retrying partitions, and lag_source says so.
        if wanted and (self._asking is None or self._asking.done()):
            self._asking = asyncio.ensure_future(asyncio.to_thread(self._offsets.read, wanted))
            self._asking.add_done_callback(self._keep_ends)
        if self._asking is not None and self._broker_answers:
            await asyncio.wait({self._asking}, timeout=self._broker_budget_s)
        fresh = time.monotonic() - self._ends_at <= ENDS_MAX_AGE_S
        return self._ends if fresh else {}

    def _keep_ends(self, asked: asyncio.Future[dict[tuple[str, int], int]]) -> None:
        self._broker_answers = not asked.cancelled() and asked.exception() is None
        if not self._broker_answers or not asked.result():
            self._broker_answers = False
            return  # the broker did not answer: OffsetReader logged why
        self._ends, self._ends_at = asked.result(), time.monotonic()
