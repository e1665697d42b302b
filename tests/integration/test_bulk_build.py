"""The bulk builder (bench/bulk_build.py) into the embedded PostgreSQL: a few hundred
synthetic documents load with COPY, every constraint and index comes back as the migrations
define it, the communities recompute on the result, and every query mode answers from it as
the operator and as an anonymous caller."""

from __future__ import annotations

import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

from services.communities.app import build_deps
from services.communities.recompute import recompute
from services.core.access import Caller
from services.core.db.engine import make_engine
from services.core.embedding import OnnxMiniLmEmbedder
from services.core.extraction import SpacyExtractor
from services.core.settings import Settings
from services.retrieval.schemas import QueryRequest
from services.retrieval.service import build_query_service

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run
from bulk_build import build, plain, read_schema
from bulk_rows import HashedEmbedder
from synth_corpus import Corpus, questions

DOCUMENTS = 300


async def test_a_bulk_build_is_queryable_in_every_mode(
    database_url: str,
    embedder: OnnxMiniLmEmbedder,
    extractor: SpacyExtractor,
    cpu_pool: ThreadPoolExecutor,
) -> None:
    settings = Settings(database_url=database_url, community_reports="extractive")
    with psycopg.connect(plain(database_url)) as conn:
        before = read_schema(conn)
    report = build(database_url, DOCUMENTS, 7, settings)
    rows = report["rows"]
    assert rows["documents"] == rows["processed_events"] == DOCUMENTS
    assert rows["mentions"] > rows["entities"] > DOCUMENTS
    with psycopg.connect(plain(database_url)) as conn:
        assert read_schema(conn) == before  # keys, foreign keys and indexes as migrated
        stray = conn.execute(
            "SELECT count(*) FROM mentions m JOIN chunks c ON c.id = m.chunk_id WHERE"
            " m.start_char >= 0 AND substr(c.text, m.start_char + 1, m.end_char - m.start_char)"
            " <> m.surface"
        ).fetchone()
        assert stray == (0,)
        # the indexer can go on from here: identities continue after the builder's ids
        conn.execute("INSERT INTO graph_changes (kind, ref_id, op) VALUES ('node', 1, 'change')")

    deps = dataclasses.replace(
        build_deps(settings, database_url), embedder=HashedEmbedder(settings.embedding_dim, 7)
    )
    try:
        published = (await recompute(deps, "requested")).snapshot
    finally:
        await deps.engine.dispose()
    assert published.communities > 0

    events = list(Corpus(DOCUMENTS, 7).events())
    asked = questions(events, 1, 7)[0]
    engine = make_engine(database_url)
    service = build_query_service(settings, engine, embedder, extractor, cpu_pool)
    try:
        for caller in (Caller.operator(), Caller()):
            for mode in ("vector", "local", "global"):
                req = QueryRequest(question=asked["question"], mode=mode, k=10)
                response = await service.query(req, caller)
                assert response.mode_used == mode, (mode, caller)
                assert response.contexts, (mode, caller)
    finally:
        await engine.dispose()
