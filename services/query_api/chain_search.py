"""Chains on the database: local mode's chains of passages (the pure rules are in chains.py)
read their links, question terms and titles here, step by step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.query_api import chains
from services.query_api.lexical import CorpusStats, question_lexemes, question_terms, useful_terms
from services.query_api.neighbourhood import bridge_step

# The entities a passage is about: its document's title (resolution.with_title, no offsets).
_TOPICS = text(
    "SELECT chunk_id, entity_id FROM mentions WHERE chunk_id = ANY(:c) AND start_char < 0"
)


async def follow_chains(
    conn: AsyncConnection,
    question: str,
    fused: dict[int, float],
    seeds: Sequence[int],
    *,
    width: int,
    steps: int,
    base: Callable[[set[int]], Awaitable[dict[int, float]]],
    stats: CorpusStats,
    lexical_weight: float,
    caller: Caller,
    start: chains.ChainStart | None = None,
) -> tuple[list[int], tuple[int, ...]]:
    """The fused ranking interleaved with the later passages of chains that start at its
    ``width`` best passages (or continue from ``start``) and follow bridge entities
    (services/query_api/chains.py), and the best chain's passages (the offline answer reads
    its next hop). ``base`` gives the fused dense and graph scores with more passages among
    the candidates."""
    order = sorted(fused, key=lambda c: (-fused[c], c))
    heads = list(start.heads) if start else order[:width]
    if not heads:
        return order, ()
    used = sorted(start.used) if start else seeds  # entities no step bridges through
    asked = await question_lexemes(conn, question)
    idf = useful_terms(await stats.frequencies.of(conn, asked), stats.chunks)
    asked = sorted(idf)  # the terms that say something: in some passage, in at most half
    terms = await question_terms(conn, asked, [*order, *heads])
    links = chains.Links()
    links.add_about(await _about(conn, [*order, *heads]))
    beam, ended = chains.starts(heads, fused, used, terms), []
    fetched: set[int] = set()
    for _ in range(steps):  # a chain longer than the top k cannot fit in it
        lasts = sorted({ch.passages[-1] for ch in beam} - fetched)
        links.add(await bridge_step(conn, lasts, used, caller))
        fetched.update(lasts)
        fresh = sorted(chains.reachable(beam, links) - terms.keys())
        terms |= await question_terms(conn, asked, fresh)
        links.add_about(await _about(conn, fresh))
        relevance = chains.Relevance(await base(set(fresh)), idf, lexical_weight, terms)
        beam, done = chains.step(beam, links, relevance, width=width, total=stats.chunks)
        ended += done
        if not beam:
            break
    # Continued chains list only what they add: their heads were ranked by the earlier search.
    found = [*ended, *beam]
    later = chains.ranking(() if start else heads, found)
    best = min(found, key=lambda ch: (-ch.score, ch.passages), default=None)
    return chains.interleave(order, later), best.passages if best else ()


async def _about(conn: AsyncConnection, chunks: Sequence[int]) -> list[tuple[int, int]]:
    """(chunk, entity) pairs: the entities these passages are about (their title)."""
    if not chunks:
        return []
    rows = await conn.execute(_TOPICS, {"c": list(chunks)})
    return [(int(c), int(e)) for c, e in rows.all()]
