"""Answers questions from PostgreSQL. Framework-free: the FastAPI app and the CLI both call
``QueryService.query``; every query reads one REPEATABLE READ, read-only transaction."""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import Executor
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.embedding import Embedder
from services.core.extraction import Extractor
from services.query_api import local
from services.query_api.schemas import Context, Mode, PathStep, QueryRequest, QueryResponse
from services.query_api.vector import ScoredChunk, load_chunks, similarities, vector_search

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_TERM = re.compile(r"\w+")


@dataclass(frozen=True)
class QueryService:
    """Everything a query needs, built once by a composition root."""

    engine: AsyncEngine
    embedder: Embedder
    extractor: Extractor
    executor: Executor
    local_vector_weight: float = 0.5

    async def query(self, req: QueryRequest) -> QueryResponse:
        """Retrieve contexts for the question in the requested (or routed) mode."""
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        embedding = (
            await loop.run_in_executor(self.executor, self.embedder.embed, [req.question])
        )[0]
        mode: Mode = "local" if req.mode in ("local", "auto") else "vector"
        t_embed = time.perf_counter()
        async with self.engine.connect() as conn:
            await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                await conn.execute(text("SET TRANSACTION READ ONLY"))
                snapshot_id = await conn.scalar(
                    text("SELECT id FROM snapshots WHERE status = 'published'")
                )
                paths: list[PathStep] = []
                grounded: list[str] = []
                if mode == "local":
                    contexts, grounded, paths = await self._local(conn, req, embedding)
                    if not contexts:  # nothing grounded: the vector index still has an answer
                        mode = "vector"
                if mode == "vector":
                    hits = await vector_search(conn, embedding, req.k)
                    contexts = [_context(h, h.score, "cosine similarity") for h in hits]
        t_end = time.perf_counter()
        return QueryResponse(
            answer=extractive_answer(req.question, contexts),
            mode_used=mode,
            snapshot_id=snapshot_id,
            contexts=contexts,
            grounded_entities=grounded if req.explain else [],
            paths=paths if req.explain else [],
            timings={
                "embed_ms": round((t_embed - t0) * 1000, 2),
                "retrieve_ms": round((t_end - t_embed) * 1000, 2),
            },
        )

    async def _local(
        self, conn: AsyncConnection, req: QueryRequest, embedding: list[float]
    ) -> tuple[list[Context], list[str], list[PathStep]]:
        loop = asyncio.get_running_loop()
        extraction = (
            await loop.run_in_executor(self.executor, self.extractor.extract, [req.question])
        )[0]
        total = int(await conn.scalar(text("SELECT count(*) FROM chunks")) or 0)
        grounding = await local.ground(
            conn, req.question, [e.name for e in extraction.entities], total
        )
        if not grounding.weights:
            return [], [], []
        hood = await local.neighbourhood(conn, sorted(grounding.weights))
        ppr = local.personalised_pagerank(hood.graph, grounding.weights)
        dense_hits = await vector_search(conn, embedding, max(3 * req.k, 20))
        top_graph = sorted(ppr, key=lambda c: -ppr[c])[: max(5 * req.k, 50)]
        candidates = {h.chunk_id for h in dense_hits} | set(top_graph)
        dense = await similarities(conn, embedding, sorted(candidates))
        fused = local.fuse(dense, ppr, self.local_vector_weight)
        ranked = sorted(fused, key=lambda c: (-fused[c], c))[: req.k]
        rows = await load_chunks(conn, ranked)
        contexts = [
            _context(rows[c], fused[c], f"dense {dense[c]:.3f}, graph {ppr.get(c, 0.0):.2e}")
            for c in ranked
            if c in rows
        ]
        names = [
            grounding.names[e]
            for e in sorted(grounding.weights, key=lambda e: -grounding.weights[e])
        ]
        paths = [
            PathStep(
                source=hood.names.get(s, str(s)),
                relation=rtype,
                target=hood.names.get(t, str(t)),
                evidence=desc[:300],
            )
            for s, t, rtype, desc in hood.relations[:10]
        ]
        return contexts, names, paths


def _context(chunk: ScoredChunk, score: float, why: str) -> Context:
    return Context(
        doc_id=chunk.doc_id,
        chunk_id=chunk.chunk_id,
        title=chunk.title,
        text=chunk.text,
        score=round(score, 6),
        why=why,
    )


def extractive_answer(question: str, contexts: list[Context], top: int = 3) -> str:
    """The best supporting sentence from the top contexts, quoted with its source; never an
    invented answer. Sentences are scored by overlap with the question's terms."""
    terms = {t.lower() for t in _TERM.findall(question) if len(t) > 2}
    best: tuple[float, str, str] | None = None
    for rank, ctx in enumerate(contexts[:top]):
        for sentence in _SENTENCE.split(ctx.text):
            words = {w.lower() for w in _TERM.findall(sentence)}
            score = len(terms & words) - 0.5 * rank
            if sentence.strip() and (best is None or score > best[0]):
                best = (score, sentence.strip(), ctx.doc_id)
    if best is None:
        return "No indexed passage matches this question yet."
    return f"{best[1]} [{best[2]}]"
