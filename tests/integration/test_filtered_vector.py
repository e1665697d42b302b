"""Vector search under a query's scope (services/query_api/vector.py): a scope of few chunks is
ranked exactly (the same chunks, in the same order, as a brute-force ranking of the chunks in
scope), a wider one goes through the HNSW index and still returns chunks in scope only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.core.access import Caller
from services.core.db.engine import make_engine, vector_literal
from services.core.embedding import OnnxMiniLmEmbedder
from services.query_api import vector
from services.query_api.filters import Filters, scoped
from services.query_api.vector import vector_search
from tests.support.query_fixtures import clone_database

pytestmark = pytest.mark.integration

SCOPE = Filters.model_validate({"metadata": {"desk": "north"}})


@pytest.fixture
async def engine(community_db: str) -> AsyncIterator[AsyncEngine]:
    url = clone_database(community_db, community_db.rsplit("/", 1)[1])
    made = make_engine(url)
    async with made.begin() as conn:  # every third document on the north desk
        await conn.execute(
            text(
                'UPDATE documents d SET metadata = d.metadata || \'{"desk": "north"}\''
                " FROM (SELECT doc_id, row_number() OVER (ORDER BY doc_id) AS i FROM documents)"
                " n WHERE n.doc_id = d.doc_id AND n.i % 3 = 0"
            )
        )
    yield made
    await made.dispose()


async def _brute_force(engine: AsyncEngine, query: list[float], k: int) -> list[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT c.id FROM chunks c JOIN documents d USING (doc_id)"
                ' WHERE d.metadata @> \'{"desk": "north"}\''
                " ORDER BY (c.embedding <=> CAST(:q AS vector)) + 0, c.id LIMIT :k"
            ),
            {"q": vector_literal(query), "k": k},
        )
        return [int(r[0]) for r in rows.all()]


@pytest.mark.parametrize("caller", [Caller.operator(), Caller()], ids=["operator", "anyone"])
async def test_a_narrow_scope_is_ranked_exactly(
    engine: AsyncEngine, embedder: OnnxMiniLmEmbedder, caller: Caller
) -> None:
    query = list(embedder.embed(["Who directed the film shot in Leland?"])[0])
    async with engine.begin() as conn:
        found = await vector_search(conn, query, 8, caller=scoped(caller, SCOPE))
    assert [h.chunk_id for h in found] == await _brute_force(engine, query, 8)


async def test_a_wide_scope_goes_through_the_index_and_stays_in_scope(
    engine: AsyncEngine, embedder: OnnxMiniLmEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vector, "EXACT_SCAN_MAX_CHUNKS", 0)  # every scope is "wide"
    query = list(embedder.embed(["Who directed the film shot in Leland?"])[0])
    async with engine.begin() as conn:
        found = await vector_search(conn, query, 8, caller=scoped(Caller.operator(), SCOPE))
        north = {
            str(r[0])
            for r in await conn.execute(
                text('SELECT doc_id FROM documents WHERE metadata @> \'{"desk": "north"}\'')
            )
        }
    assert found
    assert {h.doc_id for h in found} <= north
