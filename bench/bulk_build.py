"""Bulk builder for the scale benchmark (issue 20, deliverable 2): the graph the indexer would
build from bench/synth_corpus.py's documents (same seed, same corpus), written with COPY
instead of ingested through the models, so a 1M-entity database builds in minutes.

    .venv/bin/python bench/bulk_build.py --documents 38000 --home /var/tmp/kg-bulk-38k
        [--seed 7] [--database-url URL] [--out build.json]

Without ``--database-url``: an embedded PostgreSQL in ``--home`` (created, migrated, left
stopped with its data when done). The database must be migrated (it is, here) and its graph
empty. Rows come from bench/bulk_rows.py (what is the indexer's code and what is simplified is
said there; the embeddings are a seeded random projection, so retrieval quality on such a
database means nothing). Phases, each timed:
1. ``drop``: the graph tables' secondary indexes and their primary key, unique and foreign key
   constraints are dropped (their definitions kept from the catalogue);
2. ``stream``: the corpus is generated and every event's rows streamed with binary COPY, one
   connection per table (documents, processed_events, chunks, mentions, aliases,
   relationship_evidence, graph_changes); ``final``: entities and relationships, whose
   aggregates are known after the last event;
3. ``keys`` and ``indexes``: primary keys, unique constraints and indexes rebuilt from their
   definitions, ``INDEX_WORKERS`` at a time, with ``maintenance_work_mem`` as below; then the
   foreign keys (``foreign_keys``), validated; the identity sequences moved past the ids used;
4. ``analyze``: ANALYZE of the graph tables.
Prints (and with ``--out`` writes) JSON: rows per table, seconds per phase, the builder's peak
RSS and PostgreSQL's peak PSS (all its processes) over the build.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _scale_harness import MemorySampler  # noqa: E402
from bulk_rows import DocumentRows, GraphRows, HashedEmbedder  # noqa: E402
from synth_corpus import Corpus  # noqa: E402

from services.core.chunking import Chunker  # noqa: E402
from services.core.db import migrations  # noqa: E402
from services.core.infra.postgres import EmbeddedPostgres  # noqa: E402
from services.core.settings import Settings  # noqa: E402

# The tables the indexer writes; the builder owns them for the duration of the build.
GRAPH_TABLES = (
    "documents",
    "processed_events",
    "chunks",
    "entities",
    "aliases",
    "mentions",
    "relationships",
    "relationship_evidence",
    "graph_changes",
)
# COPY column lists and binary types, in the order bulk_rows gives the values.
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "documents": (
        ("doc_id", "text"), ("tenant", "text"), ("title", "text"), ("version", "int8"),
        ("content_hash", "text"), ("metadata", "jsonb"), ("acl", "text[]"),
        ("occurred_at", "timestamptz"), ("deleted", "bool"), ("last_event_id", "text"),
        ("created_at", "timestamptz"), ("updated_at", "timestamptz"),
    ),
    "processed_events": (
        ("event_id", "text"), ("doc_id", "text"), ("outcome", "text"),
        ("processed_at", "timestamptz"), ("occurred_at", "timestamptz"),
        ("published_at", "timestamptz"),
    ),
    "chunks": (
        ("id", "int8"), ("doc_id", "text"), ("ord", "int4"), ("content_hash", "text"),
        ("text", "text"), ("token_count", "int4"), ("start_char", "int4"), ("end_char", "int4"),
        ("embedding", "vector"),
    ),
    "mentions": (
        ("id", "int8"), ("entity_id", "int8"), ("chunk_id", "int8"), ("doc_id", "text"),
        ("surface", "text"), ("type", "text"), ("start_char", "int4"), ("end_char", "int4"),
        ("sentence", "text"),
    ),
    "aliases": (("entity_id", "int8"), ("alias", "text"), ("alias_key", "text")),
    "relationship_evidence": (
        ("id", "int8"), ("relationship_id", "int8"), ("chunk_id", "int8"), ("doc_id", "text"),
        ("strength", "float8"), ("sentence", "text"),
    ),
    "graph_changes": (
        ("id", "int8"), ("kind", "text"), ("ref_id", "int8"), ("op", "text"),
        ("doc_id", "text"), ("event_id", "text"), ("changed_at", "timestamptz"),
    ),
    "entities": (
        ("id", "int8"), ("key", "text"), ("name", "text"), ("type", "text"),
        ("description", "text"), ("mention_count", "int4"), ("embedding", "vector"),
        ("created_at", "timestamptz"), ("updated_at", "timestamptz"), ("type_group", "text"),
        ("tenant", "text"),
    ),
    "relationships": (
        ("id", "int8"), ("source_id", "int8"), ("target_id", "int8"), ("type", "text"),
        ("weight", "float8"), ("evidence_count", "int4"), ("description", "text"),
    ),
}  # fmt: skip
STREAMED = ("documents", "processed_events", "chunks", "mentions", "aliases",
            "relationship_evidence", "graph_changes")  # fmt: skip
IDENTITY_TABLES = ("chunks", "entities", "mentions", "relationships", "relationship_evidence",
                   "graph_changes")  # fmt: skip
# Two cores: two index builds at a time keep both busy (each build is one backend; the HNSW
# build also takes parallel workers of its own, which PostgreSQL caps by what is free).
INDEX_WORKERS = 2
# HNSW builds fast only while the graph fits in maintenance memory (pgvector warns when it
# does not): ~2 KB per 384-d vector with m = 16, so 2 GB holds a million chunks. The other
# builds sort in it; two builds at a time stay within 4 GB of a 24 GB machine.
MAINTENANCE_WORK_MEM = "2GB"
PROGRESS_EVERY = 20_000  # documents between progress lines on stderr
URL_ENV = "KGSTREAM_BULK_BENCH_URL"  # --from-env: the database URL (kept off command lines)


@dataclass
class Schema:
    """The graph tables' constraints and indexes, as the catalogue defines them."""

    keys: list[tuple[str, str, str]] = field(default_factory=list)  # table, name, definition
    foreign: list[tuple[str, str, str]] = field(default_factory=list)
    indexes: list[tuple[str, str]] = field(default_factory=list)  # name, CREATE INDEX ...


def plain(url: str) -> str:
    """A libpq URL from the project's SQLAlchemy one."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def read_schema(conn: psycopg.Connection[Any]) -> Schema:
    """Every primary key, unique and foreign key constraint on (or pointing at) the graph
    tables, and every index of theirs no constraint owns."""
    tables = list(GRAPH_TABLES)
    schema = Schema()
    rows = conn.execute(
        "SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)"
        " FROM pg_constraint c WHERE c.contype IN ('p', 'u', 'f') AND"
        " (c.conrelid::regclass::text = ANY(%s) OR c.confrelid::regclass::text = ANY(%s))"
        " ORDER BY c.conrelid::regclass::text, c.conname",
        (tables, tables),
    ).fetchall()
    for table, name, kind, definition in rows:
        (schema.foreign if kind == "f" else schema.keys).append((table, name, definition))
    schema.indexes = [
        (str(name), str(definition))
        for name, definition in conn.execute(
            "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " WHERE i.indrelid::regclass::text = ANY(%s) AND NOT EXISTS"
            " (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
            " ORDER BY 1",
            (tables,),
        ).fetchall()
    ]
    return schema


def drop_schema(conn: psycopg.Connection[Any], schema: Schema) -> None:
    """Foreign keys first (they need the keys), then keys, then the other indexes."""
    for table, name, _ in [*schema.foreign, *schema.keys]:
        conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for name, _ in schema.indexes:
        conn.execute(f"DROP INDEX {name}")


def restore_schema(url: str, schema: Schema, timings: dict[str, float]) -> None:
    """Keys and indexes, INDEX_WORKERS at a time (the HNSW build first: the longest); then the
    foreign keys, validated."""

    def run(statement: str) -> float:
        t0 = time.perf_counter()
        with psycopg.connect(plain(url), autocommit=True) as conn:
            conn.execute(f"SET maintenance_work_mem = '{MAINTENANCE_WORK_MEM}'")
            conn.execute(statement)
        return time.perf_counter() - t0

    keys = [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for t, n, d in schema.keys]
    indexes = sorted((d for _, d in schema.indexes), key=lambda d: "hnsw" not in d)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=INDEX_WORKERS) as pool:
        each = dict(zip([*indexes, *keys], pool.map(run, [*indexes, *keys]), strict=True))
    timings["indexes_and_keys_s"] = time.perf_counter() - t0
    timings.update({f"index.{_label(s)}_s": v for s, v in each.items()})
    t0 = time.perf_counter()
    foreign = [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for t, n, d in schema.foreign]
    with ThreadPoolExecutor(max_workers=INDEX_WORKERS) as pool:
        list(pool.map(run, foreign))
    timings["foreign_keys_s"] = time.perf_counter() - t0


def _label(statement: str) -> str:
    words = statement.replace('"', "").split()
    if words[0] == "ALTER":
        return words[5]  # ALTER TABLE t ADD CONSTRAINT name ...
    return words[2] if words[1] == "INDEX" else words[3]  # CREATE [UNIQUE] INDEX name


def _check_empty(conn: psycopg.Connection[Any]) -> None:
    for table in GRAPH_TABLES:
        if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone() != (True,):  # noqa: S608 - constant names
            continue
        raise SystemExit(f"{table} is not empty: the builder writes into an empty graph only")


@contextlib.contextmanager
def copies(url: str, tables: tuple[str, ...]) -> Iterator[dict[str, Callable[[Any], None]]]:
    """One connection and one open binary COPY per table; yields table -> write_row."""
    with contextlib.ExitStack() as stack:
        writers: dict[str, Callable[[Any], None]] = {}
        for table in tables:
            conn = stack.enter_context(psycopg.connect(plain(url)))
            register_vector(conn)
            conn.execute("SET synchronous_commit = off")
            names = ", ".join(name for name, _ in COLUMNS[table])
            cur = stack.enter_context(conn.cursor())
            copy = stack.enter_context(
                cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)")
            )
            copy.set_types([kind for _, kind in COLUMNS[table]])
            writers[table] = copy.write_row
        yield writers
    # leaving the stack ends every COPY and commits every connection


def stream_document(write: dict[str, Callable[[Any], None]], rows: DocumentRows) -> None:
    """One event's rows into the open COPYs."""
    document = list(rows.document)
    document[5] = Jsonb(document[5])
    write["documents"](document)
    write["processed_events"](rows.processed)
    for table, many in (
        ("chunks", rows.chunks),
        ("mentions", rows.mentions),
        ("aliases", rows.aliases),
        ("relationship_evidence", rows.evidence),
        ("graph_changes", rows.changes),
    ):
        put = write[table]
        for row in many:
            put(row)


def finish_sequences(conn: psycopg.Connection[Any]) -> None:
    """Identity sequences past the ids the build gave, so the indexer can go on from here."""
    for table in IDENTITY_TABLES:
        conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"  # noqa: S608 - constants
            f" coalesce((SELECT max(id) FROM {table}), 1),"
            f" (SELECT max(id) FROM {table}) IS NOT NULL)"
        )


def build(url: str, documents: int, seed: int, settings: Settings) -> dict[str, Any]:
    """Build the graph of ``documents`` synthetic documents into the migrated, empty database
    at ``url``; returns rows per table, seconds per phase and the builder's memory."""
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    with psycopg.connect(plain(url), autocommit=True) as conn:
        _check_empty(conn)
        schema = read_schema(conn)
        drop_schema(conn, schema)
    timings["drop_s"] = time.perf_counter() - t_all
    t0 = time.perf_counter()
    corpus = Corpus(documents, seed)
    kinds = {e.name: e.kind for e in corpus.entities}
    timings["universe_s"] = time.perf_counter() - t0
    now = datetime.now(UTC)
    rows = GraphRows(
        kinds,
        HashedEmbedder(settings.embedding_dim, seed),
        Chunker(settings.chunk_tokens, settings.chunk_overlap),
        now,
    )
    t0 = time.perf_counter()
    n = 0
    with copies(url, STREAMED) as write:
        for event in corpus.events():
            stream_document(write, rows.add(event))
            n += 1
            if n % PROGRESS_EVERY == 0:
                rate = n / (time.perf_counter() - t0)
                print(f"  {n}/{documents} documents, {rate:.0f}/s", file=sys.stderr, flush=True)
    timings["stream_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with copies(url, ("entities", "relationships")) as write:
        for entity in rows.entities():
            write["entities"](entity)
        for rel in rows.relationships():
            write["relationships"](rel)
    timings["final_s"] = time.perf_counter() - t0
    restore_schema(url, schema, timings)
    t0 = time.perf_counter()
    with psycopg.connect(plain(url), autocommit=True) as conn:
        finish_sequences(conn)
        conn.execute("ANALYZE " + ", ".join(GRAPH_TABLES))
        counts = {
            t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]  # noqa: S608 - constants
            for t in GRAPH_TABLES
        }
    timings["analyze_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_all
    return {
        "documents": documents,
        "seed": seed,
        "embedding_dim": settings.embedding_dim,
        "rows": counts,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "builder_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--home", type=Path, help="embedded PostgreSQL home (kept)")
    parser.add_argument("--database-url", help="an empty database instead (migrated here)")
    parser.add_argument("--from-env", action="store_true", help=f"the database URL from {URL_ENV}")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.from_env:
        args.database_url = os.environ.get(URL_ENV) or parser.error(f"{URL_ENV} is not set")
    if (args.home is None) == (args.database_url is None):
        parser.error("give exactly one of --home, --database-url and --from-env")
    if args.documents < 1:
        parser.error("--documents must be >= 1")
    settings = Settings()
    pg = EmbeddedPostgres(args.home) if args.home is not None else None
    url = pg.start() if pg is not None else args.database_url
    try:
        migrations.upgrade(url, settings.embedding_dim)
        postmaster = pg.pid() if pg is not None else None
        with MemorySampler(0, postmaster, None) as memory:
            report = build(url, args.documents, args.seed, settings)
        report["postgres_pss_mib"] = memory.summary().get("postgres_pss_mib", {})
    finally:
        if pg is not None:
            pg.stop()
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
