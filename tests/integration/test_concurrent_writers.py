"""Two writers at once over documents that share entities (Germany, Paris, Microsoft, ...):
every event lands once with the outcome a single writer gives it, no transaction deadlocks
(writers lock shared entity and relationship rows in id order, at the end of the event), and
the graph equals the one a single writer builds from the same events.

Each writer is an in-process indexer with its own connection pool, as two indexer processes
on two partitions are: a document's events go to one writer, in order (the topic is keyed by
doc_id). The corpus is test_graph_properties' hand-written, order-independent one."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from tests.integration.test_graph_properties import Planner, Step
from tests.support.graph import canonical_graph, create_database, drop_database, graph_diff
from tests.support.property_corpus import CORPUS, DOC_IDS, Env

pytestmark = pytest.mark.integration

ROUNDS = 3  # the writers race again on graphs built by earlier rounds (different timings)


def _plan() -> Planner:
    """Every document in every variant (new versions replace chunks, so entities and edges
    shared with other documents lose and gain evidence), two of them deleted at the end."""
    planner = Planner()
    for doc_id in DOC_IDS:
        for variant in range(len(CORPUS[doc_id][1])):
            planner.add(Step("upsert", doc_id, variant, True, 1, 0, False))
    for doc_id in ("doc-microsoft", "doc-seattle"):
        planner.add(Step("delete", doc_id, 0, True, 1, 0, False))
    return planner


async def _deadlocks(url: str) -> int:
    """The database's deadlock count once no other client is connected to it. A backend
    flushes its statistics as it exits, before it leaves pg_stat_activity (PostgreSQL 15+:
    pgstat's before_shmem_exit hook runs before the backend status' on_shmem_exit one)."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while True:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'"
            )
            row = await cur.fetchone()
            if row is None or row[0] == 0:
                break
            assert time.monotonic() < deadline, "the writers' connections never closed"
            await asyncio.sleep(0.05)
        cur = await conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_concurrent_writers_build_the_serial_graph(env: Env) -> None:
    planner = _plan()
    streams: list[list[int]] = [[], []]
    for i, ev in enumerate(planner.sent):
        streams[DOC_IDS.index(ev["doc_id"]) % 2].append(i)
    serial = create_database(env.server_url)
    try:
        assert await env.build(serial, planner.sent) == planner.expected
        want = canonical_graph(serial)
    finally:
        drop_database(serial)
    for _ in range(ROUNDS):
        url = create_database(env.server_url)
        try:
            before = await _deadlocks(url)
            outcomes = await asyncio.gather(
                *(env.build(url, [planner.sent[i] for i in s], batch_size=2) for s in streams)
            )
            for stream, got in zip(streams, outcomes, strict=True):
                assert got == [planner.expected[i] for i in stream]
            assert await _deadlocks(url) == before  # env.build closed the writers' engines
            graph = canonical_graph(url)
            assert graph == want, graph_diff(graph, want)
        finally:
            drop_database(url)
