"""The graph as comparable data (no ids), fresh databases from the test template, and a
direct, in-process build of a corpus through ``handle_record``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from itertools import count
from typing import Any

import psycopg
from sqlalchemy import create_engine, text

from services.core.chunking import Chunker
from services.core.db.engine import make_engine
from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.core.infra.postgres import DB_NAME
from services.core.settings import Settings
from services.indexer.handlers import (
    IndexerDeps,
    Outcome,
    RawRecord,
    handle_batch,
    handle_record,
)

TEMPLATE_DB = "kgstream_template"  # the migrated template tests/conftest.py builds

Row = tuple[Any, ...]
Graph = dict[str, list[Row]]

# co_occurs is undirected: the writer stores each pair once, ordered by entity id, and ids
# depend on arrival order, so the canonical form orders the pair by name instead.
_ENDPOINTS = (
    "CASE WHEN r.type = 'co_occurs' THEN least(s.name, t.name) ELSE s.name END,"
    " CASE WHEN r.type = 'co_occurs' THEN greatest(s.name, t.name) ELSE t.name END"
)
# One query per table; every row is named by content (names, hashes, texts), never by id, so
# two databases built in different orders compare equal when they hold the same graph.
_CANONICAL: dict[str, str] = {
    "documents": "SELECT doc_id, content_hash, facts::text FROM documents WHERE NOT deleted",
    "chunks": "SELECT doc_id, ord, content_hash, text FROM chunks",
    "entities": "SELECT name, type, description, mention_count FROM entities",
    "mentions": (
        "SELECT m.doc_id, c.content_hash, e.name, m.surface, m.type, m.start_char, m.end_char,"
        " m.sentence, m.origin FROM mentions m JOIN entities e ON e.id = m.entity_id"
        " JOIN chunks c ON c.id = m.chunk_id"
    ),
    "aliases": (
        "SELECT e.name, a.alias, a.alias_key FROM aliases a JOIN entities e ON e.id = a.entity_id"
    ),
    "relationships": (
        f"SELECT {_ENDPOINTS}, r.type, round(r.weight::numeric, 6), r.evidence_count,"  # noqa: S608 - _ENDPOINTS is a constant
        " r.description, r.weak FROM relationships r JOIN entities s ON s.id = r.source_id"
        " JOIN entities t ON t.id = r.target_id"
    ),
    "evidence": (
        f"SELECT {_ENDPOINTS}, r.type, v.doc_id, c.content_hash,"  # noqa: S608 - _ENDPOINTS is a constant
        " round(v.strength::numeric, 6), v.sentence, v.origin FROM relationship_evidence v"
        " JOIN relationships r ON r.id = v.relationship_id"
        " JOIN entities s ON s.id = r.source_id JOIN entities t ON t.id = r.target_id"
        " JOIN chunks c ON c.id = v.chunk_id"
    ),
    "fact_times": (
        "SELECT f.doc_id, c.content_hash, f.sentence, f.valid_from, f.valid_to, f.expression"
        " FROM fact_times f JOIN chunks c ON c.id = f.chunk_id"
    ),
}


# One tenant's part of the graph (documents of ``:t``; NULL is the untenanted scope): its
# documents, chunks, mentions and evidence, and every entity, alias and relationship they
# refer to, whole (counts, descriptions and aliases from every document that supports them).
# Read through documents, not through any tenant column of the shared rows, so it says what a
# tenant's documents resolved to whatever the schema thinks an entity belongs to.
_OWN_DOC = "d.tenant IS NOT DISTINCT FROM CAST(:t AS text) AND NOT d.deleted"
_NAMED = (
    "EXISTS (SELECT 1 FROM mentions tm JOIN documents d ON d.doc_id = tm.doc_id"  # noqa: S608 - constants
    f" WHERE tm.entity_id = {{e}} AND {_OWN_DOC})"
)
_SUPPORTED = (
    "EXISTS (SELECT 1 FROM relationship_evidence tv JOIN documents d ON d.doc_id = tv.doc_id"  # noqa: S608 - constants
    f" WHERE tv.relationship_id = r.id AND {_OWN_DOC})"
)
_OWN = f"EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = {{doc}} AND {_OWN_DOC})"  # noqa: S608 - constants
_TENANT: dict[str, str] = {
    "documents": _CANONICAL["documents"] + " AND tenant IS NOT DISTINCT FROM CAST(:t AS text)",
    "chunks": _CANONICAL["chunks"] + " WHERE " + _OWN.format(doc="chunks.doc_id"),
    "entities": _CANONICAL["entities"] + " e WHERE " + _NAMED.format(e="e.id"),
    "mentions": _CANONICAL["mentions"] + " WHERE " + _OWN.format(doc="m.doc_id"),
    "aliases": _CANONICAL["aliases"] + " WHERE " + _NAMED.format(e="e.id"),
    "relationships": _CANONICAL["relationships"] + " WHERE " + _SUPPORTED,
    "evidence": _CANONICAL["evidence"] + " WHERE " + _OWN.format(doc="v.doc_id"),
    "fact_times": _CANONICAL["fact_times"] + " WHERE " + _OWN.format(doc="f.doc_id"),
}


def canonical_graph(url: str) -> Graph:
    """Every table of the graph as a sorted list of rows (a multiset), ids left out."""
    return _read_graph(url, _CANONICAL, {})


def tenant_graph(url: str, tenant: str | None) -> Graph:
    """``canonical_graph`` of one tenant's part of the graph (``_TENANT``): two databases that
    gave a tenant the same graph compare equal, whatever else they hold."""
    return _read_graph(url, _TENANT, {"t": tenant})


def _read_graph(url: str, queries: dict[str, str], params: dict[str, Any]) -> Graph:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                name: sorted(
                    (
                        tuple(_plain(v) for v in row)
                        for row in conn.execute(text(sql), params).all()
                    ),
                    key=repr,
                )
                for name, sql in queries.items()
            }
    finally:
        engine.dispose()


def graph_diff(a: Graph, b: Graph, limit: int = 8) -> str:
    """A short, readable account of what differs (for assertion messages)."""
    lines = []
    for table in _CANONICAL:
        only_a = _multiset_minus(a[table], b[table])
        only_b = _multiset_minus(b[table], a[table])
        for label, rows in (("only left", only_a), ("only right", only_b)):
            lines += [f"{table} {label}: {r!r}" for r in rows[:limit]]
            if len(rows) > limit:
                lines.append(f"{table} {label}: ... {len(rows) - limit} more")
    return "\n".join(lines) or "(no difference)"


def scalar(url: str, sql: str, **params: Any) -> Any:
    """One value from a one-off synchronous query."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(text(sql), params)
    finally:
        engine.dispose()


def rows_of(url: str, sql: str, **params: Any) -> list[Any]:
    """All rows of a one-off synchronous query."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    finally:
        engine.dispose()


def surface_entity(url: str, doc_id: str, surface: str) -> str:
    """The name of the entity a document's mention by ``surface`` resolved to."""
    return str(
        scalar(
            url,
            "SELECT e.name FROM mentions m JOIN entities e ON e.id = m.entity_id"
            " WHERE m.doc_id = :d AND m.surface = :s",
            d=doc_id,
            s=surface,
        )
    )


def processed_count(url: str) -> int:
    """Rows in processed_events."""
    return int(scalar(url, "SELECT count(*) FROM processed_events") or 0)


def wait_processed(url: str, n: int, timeout: float = 180, poll: float = 0.3) -> int:
    """Poll processed_events until it has at least ``n`` rows or ``timeout`` passes; the last
    count seen is returned, so the caller asserts on it."""
    engine = create_engine(url)
    deadline = time.monotonic() + timeout
    done = 0
    try:
        while True:
            with engine.connect() as conn:
                done = int(conn.scalar(text("SELECT count(*) FROM processed_events")) or 0)
            if done >= n or time.monotonic() > deadline:
                return done
            time.sleep(poll)
    finally:
        engine.dispose()


def create_database(database_url: str) -> str:
    """A fresh clone of the migrated template on the same server as ``database_url``."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    base = database_url.rsplit("/", 1)[0]
    dsn = base.replace("postgresql+psycopg://", "postgresql://") + "/" + TEMPLATE_DB
    admin = dsn.rsplit("/", 1)[0] + "/" + DB_NAME  # the server's maintenance database
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE_DB}')
    return f"{base}/{name}"


def drop_database(database_url: str) -> None:
    """Drop a database made by ``create_database`` (connections are closed first)."""
    base, name = database_url.rsplit("/", 1)
    admin = base.replace("postgresql+psycopg://", "postgresql://") + "/" + DB_NAME
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _no_dead_letters(key: bytes | None, value: bytes) -> None:
    raise AssertionError(f"unexpected dead letter: {value[:300]!r}")


@asynccontextmanager
async def indexer_deps(
    url: str,
    *,
    embedder: Embedder,
    extractor: Extractor,
    executor: Executor,
    settings: Settings | None = None,
    chunker: Chunker | None = None,
) -> AsyncIterator[IndexerDeps]:
    """Handler dependencies on ``url``; a dead letter fails the test."""
    settings = settings or Settings()
    engine = make_engine(url)
    try:
        yield IndexerDeps.from_settings(
            settings,
            engine=engine,
            embedder=embedder,
            extractor=extractor,
            executor=executor,
            publish_dead_letter=_no_dead_letters,
            chunker=chunker,
        )
    finally:
        await engine.dispose()


_offsets = count()


def to_record(event: dict[str, Any] | str | bytes) -> RawRecord:
    """A record as the topic would deliver it (key = doc_id), at a unique offset."""
    if isinstance(event, dict):
        value = json.dumps(event).encode()
    else:
        value = event.encode() if isinstance(event, str) else event
    key = str(json.loads(value).get("doc_id", "")).encode()
    return RawRecord(topic="direct", partition=0, offset=next(_offsets), key=key, value=value)


async def apply_events(
    deps: IndexerDeps, events: Iterable[dict[str, Any] | str | bytes], batch_size: int = 1
) -> list[Outcome]:
    """The events in order, as one partition delivers them: one at a time through
    ``handle_record``, or in batches of ``batch_size`` through ``handle_batch`` (the worker's
    path)."""
    records = [to_record(e) for e in events]
    outcomes: list[Outcome] = []
    for i in range(0, len(records), batch_size):
        if batch_size == 1:
            outcomes.append(await handle_record(deps, records[i]))
        else:
            outcomes += await handle_batch(deps, records[i : i + batch_size])
    return outcomes


def clean_build(
    url: str,
    lines: Sequence[str],
    *,
    embedder: Embedder,
    extractor: Extractor,
    executor: Executor,
    settings: Settings | None = None,
) -> Graph:
    """The graph of ``lines`` applied in order, one at a time, by an in-process indexer on
    ``url`` (synchronous: runs its own event loop, so sync tests can call it)."""

    async def build() -> None:
        async with indexer_deps(
            url, embedder=embedder, extractor=extractor, executor=executor, settings=settings
        ) as deps:
            await apply_events(deps, lines)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(build())
    finally:
        loop.close()
    return canonical_graph(url)


_clean_graphs: dict[tuple[str, tuple[str, ...], int, int], Graph] = {}


def clean_graph(
    database_url: str,
    lines: Sequence[str],
    *,
    embedder: Embedder,
    extractor: Extractor,
    executor: Executor,
    settings: Settings,
) -> Graph:
    """The graph a clean, single-process run builds from ``lines`` (in a database of its own
    on the same server), computed once per session for the same input and chunking."""
    key = (
        database_url.rsplit("/", 1)[0],
        tuple(lines),
        settings.chunk_tokens,
        settings.chunk_overlap,
    )
    if key not in _clean_graphs:
        url = create_database(database_url)
        try:
            _clean_graphs[key] = clean_build(
                url,
                lines,
                embedder=embedder,
                extractor=extractor,
                executor=executor,
                settings=settings,
            )
        finally:
            drop_database(url)
    return _clean_graphs[key]


def _plain(value: Any) -> Any:
    # numeric -> str keeps exact rounded values comparable and printable
    return str(value) if type(value).__name__ == "Decimal" else value


def _multiset_minus(a: list[Row], b: list[Row]) -> list[Row]:
    remaining = list(b)
    out = []
    for row in a:
        if row in remaining:
            remaining.remove(row)
        else:
            out.append(row)
    return out
