"""Chains on the database: local mode's chains of passages (the pure rules are in chains.py)
read their links, question terms and titles here, step by step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.db.engine import vector_literal
from services.retrieval import chains
from services.retrieval.lexical import (
    TERMS_OF_CHUNK,
    CorpusStats,
    question_lexemes,
    question_terms,
    useful_terms,
)
from services.retrieval.neighbourhood import DbGraphReads, GraphReads
from services.retrieval.visibility import VISIBLE_DOC_IDS, Filtered

# What a step needs of the passages it reached, in one statement (three had cost a round trip
# each, nine steps a question): the question's cosine (fusion), which of the question's terms
# each contains (relevance) and the entities it is about.
_ABOUT = "ARRAY(SELECT m.entity_id FROM mentions m WHERE m.chunk_id = c.id AND m.start_char = -1)"
_REACHED = (
    "SELECT c.id, 1 - (c.embedding <=> CAST(:q AS vector)), {terms}, {about}"
    " FROM chunks c WHERE c.id = ANY(:ids)"
)
_VISIBLE = " AND c.doc_id IN (" + VISIBLE_DOC_IDS + ")"
_WITH_ABOUT = _REACHED.format(terms=TERMS_OF_CHUNK, about=_ABOUT)
_REACHED_FACTS = Filtered.of(_WITH_ABOUT, _WITH_ABOUT + _VISIBLE)
# The same without the title entities, for a walk that holds them (graph_walk.py).
_NO_ABOUT = _REACHED.format(terms=TERMS_OF_CHUNK, about="'{}'::bigint[]")
_REACHED_NO_ABOUT = Filtered.of(_NO_ABOUT, _NO_ABOUT + _VISIBLE)


@dataclass(frozen=True)
class Reached:
    """The passages a step reached: cosine to the question (those the caller may see), the
    question's terms each contains, the entities each is about."""

    cosine: dict[int, float]
    terms: dict[int, frozenset[str]]
    about: list[tuple[int, int]]


async def reached_facts(
    conn: AsyncConnection,
    chunks: Sequence[int],
    asked: Sequence[str],
    embedding: Sequence[float],
    caller: Caller,
    *,
    reads: GraphReads,
) -> Reached:
    """Reached for these passages (a passage the caller may not see has no terms and is
    about nothing); their title entities from ``reads`` when it holds them in memory, else
    in the same statement."""
    out = Reached({}, dict.fromkeys(chunks, frozenset()), [])
    if not chunks:
        return out
    values: dict[str, object] = {
        "q": vector_literal(embedding),
        "lex": list(asked),
        "ids": list(chunks),
    }
    if reads.holds_topics:
        statement = _REACHED_NO_ABOUT.bind(caller, values)
        out.about.extend(await reads.about(chunks))
    else:
        statement = _REACHED_FACTS.bind(caller, values)
    for chunk, cosine, terms, about in (await conn.execute(*statement)).all():
        out.cosine[int(chunk)] = float(cosine)
        out.terms[int(chunk)] = frozenset(terms)
        out.about.extend((int(chunk), int(e)) for e in about)
    return out


async def follow_chains(
    conn: AsyncConnection,
    question: str,
    embedding: Sequence[float],
    fused: dict[int, float],
    seeds: Sequence[int],
    *,
    width: int,
    steps: int,
    base: Callable[[dict[int, float]], Awaitable[dict[int, float]]],
    stats: CorpusStats,
    lexical_weight: float,
    caller: Caller,
    start: chains.ChainStart | None = None,
    reads: GraphReads | None = None,
    lexemes: Sequence[str] | None = None,
) -> tuple[list[int], tuple[int, ...]]:
    """The fused ranking interleaved with the later passages of chains that start at its
    ``width`` best passages (or continue from ``start``) and follow bridge entities
    (services/retrieval/chains.py), and the best chain's passages (the offline answer reads
    its next hop). ``base`` gives the fused dense and graph scores with more passages among
    the candidates (given with their cosine to the question). The links come from ``reads``
    (the database as the caller sees it when none); ``lexemes``: the question's, when the
    caller has read them (``question_lexemes``)."""
    graph = reads or DbGraphReads(conn, caller)
    order = sorted(fused, key=lambda c: (-fused[c], c))
    heads = list(start.heads) if start else order[:width]
    if not heads:
        return order, ()
    used = sorted(start.used) if start else seeds  # entities no step bridges through
    asked = list(lexemes) if lexemes is not None else await question_lexemes(conn, question)
    idf = useful_terms(await stats.frequencies.of(conn, asked), stats.chunks)
    asked = sorted(idf)  # the terms that say something: in some passage, in at most half
    terms = await question_terms(conn, asked, [*order, *heads])
    links = chains.Links()
    links.add_about(await graph.about([*order, *heads]))
    beam, ended = chains.starts(heads, fused, used, terms), []
    fetched: set[int] = set()
    for _ in range(steps):  # a chain longer than the top k cannot fit in it
        lasts = sorted({ch.passages[-1] for ch in beam} - fetched)
        links.add(await graph.bridge_step(lasts, used))
        fetched.update(lasts)
        fresh = sorted(chains.reachable(beam, links) - terms.keys())
        reached = await reached_facts(conn, fresh, asked, embedding, caller, reads=graph)
        terms |= reached.terms
        links.add_about(reached.about)
        relevance = chains.Relevance(await base(reached.cosine), idf, lexical_weight, terms)
        beam, done = chains.step(beam, links, relevance, width=width, total=stats.chunks)
        ended += done
        if not beam:
            break
    # Continued chains list only what they add: their heads were ranked by the earlier search.
    found = [*ended, *beam]
    later = chains.ranking(() if start else heads, found)
    best = min(found, key=lambda ch: (-ch.score, ch.passages), default=None)
    return chains.interleave(order, later), best.passages if best else ()
