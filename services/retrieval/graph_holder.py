"""The graph a query process holds in memory (graph_memory.py) and keeps current: built in one
bulk read when the process starts, then refreshed from ``graph_changes`` every
KGSTREAM_QUERY_GRAPH_REFRESH_S, on a loop and a connection of its own (services/core/deadline.py
``BackgroundLoop``), so neither the build nor a refresh waits behind queries or holds one up.

A query takes ``current()`` once, before its read transaction begins, and walks that state to
its end: one consistent graph per query, never newer than what its transaction reads (the
holder reads the primary, and the API holds a graph only when it reads the primary too:
services/retrieval/compose.py). Until the first build ends, or while refreshes fail, queries
walk the database as before (``current()`` is None, or the last good state, whose age
``report()`` shows)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any

from services.core.db.engine import DbTimeouts, make_engine
from services.core.deadline import BackgroundLoop
from services.retrieval import graph_memory
from services.retrieval.graph_memory import MemoryGraph

log = logging.getLogger(__name__)
# The bulk read's bound: a few seconds a million entities (docs/BENCHMARKS.md), ten minutes
# leaves room for a loaded server without letting a stuck read hold the connection forever.
HOLDER_STATEMENT_S = 600.0
# The wait after a refresh, as a multiple of its own time, when that is longer than the
# configured interval: refreshes then take at most 1 / (1 + 2) of a core.
REFRESH_SHARE = 2.0


class GraphHolder:
    """One process's held graph; ``start`` once, ``close`` at the end."""

    def __init__(self, database_url: str, refresh_s: float, timeouts: DbTimeouts) -> None:
        self._url, self._refresh_s, self._timeouts = database_url, refresh_s, timeouts
        self._loop = BackgroundLoop("kgstream-graph")
        self._state: MemoryGraph | None = None
        self._at = 0.0  # monotonic time of the last good build or refresh
        self._running: Future[None] | None = None
        self._lock: asyncio.Lock | None = None  # on the holder's loop
        self._engine: Any = None
        self.error = ""  # the last failed build or refresh, until one succeeds
        self.build_s: float | None = None

    def current(self) -> MemoryGraph | None:
        """The latest state (None until the first build ends)."""
        return self._state

    def age_s(self) -> float | None:
        """Seconds since the last good build or refresh ended (None before the first)."""
        return None if self._state is None else time.monotonic() - self._at

    def start(self) -> None:
        """Build, then refresh every ``refresh_s`` in the background (idempotent)."""
        if self._running is None:
            self._running = self._loop.submit(self._run())

    async def caught_up(self) -> MemoryGraph:
        """Refresh now (build if nothing is held) and return the state: for a caller that must
        see what the database holds at this moment (the eval, after its ingest)."""
        return await self._loop.run(self._step())

    def close(self) -> None:
        """Stop refreshing and close the connection (bounded; blocking)."""
        self._loop.stop(self._dispose())

    def report(self) -> dict[str, Any]:
        """For status: whether a graph is held, its watermark, size and age."""
        state = self._state
        return {
            "held": state is not None,
            "watermark": None if state is None else state.watermark,
            "megabytes": None if state is None else round(state.nbytes / 1e6, 1),
            "age_s": None if state is None else round(self.age_s() or 0.0, 3),
            "build_s": self.build_s,
            "error": self.error,
        }

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._step()
            except Exception as exc:  # noqa: BLE001 - queries walk the last state or the database
                error = f"{type(exc).__name__}: {exc}"[:300]
                if error != self.error:
                    log.warning("the held graph could not be refreshed: %s", error)
                self.error = error
            # A refresh that takes changes copies the arrays (a few hundred ms at a million
            # entities: docs/BENCHMARKS.md): waiting REFRESH_SHARE times as long keeps it to
            # a bounded share of a core, however busy the ingest.
            took = time.monotonic() - started
            await asyncio.sleep(max(self._refresh_s, took * REFRESH_SHARE))

    async def _step(self) -> MemoryGraph:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._engine is None:
                self._engine = make_engine(
                    # two: the exact snapshot's lock holder and its reader
                    self._url,
                    pool_size=2,
                    max_overflow=0,
                    timeouts=self._timeouts,
                )
            held = self._state
            started = time.monotonic()
            if held is None:
                state = await graph_memory.build(self._engine)
                self.build_s = round(time.monotonic() - started, 3)
                log.info(
                    "graph held in memory: %d passage edges, %d relationships, %.0f MB, %.2f s",
                    state.edges.entities.size,
                    state.relationships.ids.size,
                    state.nbytes / 1e6,
                    self.build_s,
                )
            else:
                state = await graph_memory.refresh(self._engine, held)
            self._state, self._at, self.error = state, time.monotonic(), ""
            return state

    async def _dispose(self) -> None:
        if self._running is not None:
            self._running.cancel()
        if self._engine is not None:
            await self._engine.dispose()


def report_of(graph: GraphHolder | None) -> dict[str, Any] | None:
    """``graph_memory`` of /readyz and status: the held graph's report, null when the process
    walks the database."""
    return graph.report() if graph is not None else None


@asynccontextmanager
async def holding(graph: GraphHolder | None) -> AsyncIterator[None]:
    """The held graph built and refreshed for the block (the API's lifespan), then closed."""
    if graph is None:
        yield
        return
    graph.start()
    try:
        yield
    finally:
        await asyncio.to_thread(graph.close)
