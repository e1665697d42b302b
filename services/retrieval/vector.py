"""Vector retrieval: top-k chunks by cosine distance over the HNSW index, optionally fused
with BM25 (hybrid, reciprocal rank fusion)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.db.engine import vector_literal
from services.retrieval.lexical import SCORE, CorpusStats, bm25_search, rrf
from services.retrieval.visibility import DOC_VISIBLE, VISIBLE_DOC_IDS, Filtered

_NEAREST = (
    "SELECT c.id, c.doc_id, d.title, c.text, 1 - (c.embedding <=> CAST(:q AS vector)) AS s"
    " FROM chunks c JOIN documents d USING (doc_id)"
)
ITERATIVE_SCAN = "SET LOCAL hnsw.iterative_scan = strict_order"
_BY_DISTANCE = " ORDER BY c.embedding <=> CAST(:q AS vector) LIMIT :k"
NEAREST_SQL = _NEAREST + _BY_DISTANCE
NEAREST_VISIBLE_SQL = _NEAREST + " WHERE " + DOC_VISIBLE + _BY_DISTANCE
_VECTOR = Filtered.of(NEAREST_SQL, NEAREST_VISIBLE_SQL)
_SIMILARITIES = "SELECT id, 1 - (embedding <=> CAST(:q AS vector)) FROM chunks WHERE id = ANY(:ids)"
_SIMILAR = Filtered.of(_SIMILARITIES, _SIMILARITIES + " AND doc_id IN (" + VISIBLE_DOC_IDS + ")")
CHUNKS_SQL = (
    "SELECT c.id, c.doc_id, d.title, c.text FROM chunks c JOIN documents d USING (doc_id)"
    " WHERE c.id = ANY(:ids)"
)
CHUNKS_VISIBLE_SQL = CHUNKS_SQL + " AND " + DOC_VISIBLE
_LOAD = Filtered.of(CHUNKS_SQL, CHUNKS_VISIBLE_SQL)


@dataclass(frozen=True)
class PassageReads:
    """The passage reads of vector mode in one form: the current documents (``CURRENT``), or
    as they were at a past time (services/retrieval/as_of.py), with what that form binds."""

    nearest: Filtered
    bm25: Filtered
    load: Filtered
    values: Mapping[str, object] = field(default_factory=dict)
    # The HNSW scan drops rows that fail a filter besides visibility (a past state's): keep
    # scanning until k pass, for every caller.
    filtered: bool = False


CURRENT = PassageReads(_VECTOR, SCORE, _LOAD)


@dataclass(frozen=True)
class ScoredChunk:
    """A chunk with a retrieval score (cosine similarity for vector search)."""

    chunk_id: int
    doc_id: str
    title: str
    text: str
    score: float


async def vector_search(
    conn: AsyncConnection,
    query_embedding: Sequence[float],
    k: int,
    *,
    caller: Caller,
    reads: PassageReads = CURRENT,
) -> list[ScoredChunk]:
    """The k chunks nearest the query embedding (live documents the caller can see)."""
    await conn.execute(text("SET LOCAL hnsw.ef_search = 100"))
    if reads.filtered or not caller.unfiltered:
        await _scan_until_k(conn)
    values = {**reads.values, "q": vector_literal(query_embedding), "k": k}
    rows = await conn.execute(*reads.nearest.bind(caller, values))
    return [ScoredChunk(r[0], r[1], r[2], r[3], float(r[4])) for r in rows.all()]


async def _scan_until_k(conn: AsyncConnection) -> None:
    """The visibility filter drops index candidates: on pgvector 0.8+ keep scanning the graph
    until k rows pass it. Older versions reject the setting (``hnsw`` is a reserved prefix);
    the savepoint keeps the query alive, which then gets what ef_search candidates pass."""
    with contextlib.suppress(DBAPIError):
        async with conn.begin_nested():
            await conn.execute(text(ITERATIVE_SCAN))


async def similarities(
    conn: AsyncConnection,
    query_embedding: Sequence[float],
    chunk_ids: Sequence[int],
    *,
    caller: Caller,
) -> dict[int, float]:
    """Cosine similarity of the query to each given chunk the caller can see (for fusion)."""
    if not chunk_ids:
        return {}
    values = {"q": vector_literal(query_embedding), "ids": list(chunk_ids)}
    rows = await conn.execute(*_SIMILAR.bind(caller, values))
    return {int(r[0]): float(r[1]) for r in rows.all()}


async def load_chunks(
    conn: AsyncConnection,
    chunk_ids: Sequence[int],
    *,
    caller: Caller,
    reads: PassageReads = CURRENT,
) -> dict[int, ScoredChunk]:
    """Chunk rows by id that the caller can see (score 0: the caller sets it)."""
    rows = await conn.execute(*reads.load.bind(caller, {**reads.values, "ids": list(chunk_ids)}))
    return {int(r[0]): ScoredChunk(int(r[0]), r[1], r[2], r[3], 0.0) for r in rows.all()}


@dataclass(frozen=True)
class Ranked:
    """A fused ranking: chunk ids best first, their scores and a note on each; local mode
    adds the best chain of passages it followed (chunk ids in hop order)."""

    ids: list[int]
    scores: dict[int, float]
    why: dict[int, str]
    chain: tuple[int, ...] = ()


async def hybrid_search(
    conn: AsyncConnection,
    question: str,
    query_embedding: Sequence[float],
    k: int,
    *,
    stats: CorpusStats,
    rrf_k: int = 60,
    lexical: bool = True,
    caller: Caller,
    reads: PassageReads = CURRENT,
) -> Ranked:
    """Dense (HNSW) and BM25 rankings fused by reciprocal rank; dense only when lexical=False."""
    depth = max(3 * k, 30)
    dense = await vector_search(conn, query_embedding, depth, caller=caller, reads=reads)
    dense_ids = [h.chunk_id for h in dense]
    cos = {h.chunk_id: h.score for h in dense}
    if not lexical:
        ids = dense_ids[:k]
        return Ranked(ids, {c: cos[c] for c in ids}, {c: f"cosine {cos[c]:.3f}" for c in ids})
    bm25 = await bm25_search(
        conn, question, depth, stats, caller=caller, statement=reads.bm25, values=reads.values
    )
    bm25_ids = sorted(bm25, key=lambda c: (-bm25[c], c))
    fused = rrf([dense_ids, bm25_ids], rrf_k)
    ids = sorted(fused, key=lambda c: (-fused[c], c))[:k]
    dense_rank = {c: i for i, c in enumerate(dense_ids, 1)}
    bm25_rank = {c: i for i, c in enumerate(bm25_ids, 1)}
    why = {c: f"RRF: dense #{dense_rank.get(c, '-')}, BM25 #{bm25_rank.get(c, '-')}" for c in ids}
    return Ranked(ids, {c: fused[c] for c in ids}, why)
