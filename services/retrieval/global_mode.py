"""Global retrieval over the published snapshot's community summaries: pick a level by the
question's breadth (unless given), rank that level's communities against the question by
embedding (lexically when a level has no embeddings), and return the passages that mention the
top communities' members as contexts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.db.engine import vector_literal
from services.core.erasure import WithheldCache, withheld_communities
from services.retrieval.community_vectors import CommunityVectors, LevelVectors, snapshot_levels
from services.retrieval.contexts import Retrieval
from services.retrieval.lexical import or_query
from services.retrieval.schemas import CommunityHit, CommunitySummary, Context, QueryRequest
from services.retrieval.visibility import (
    DOC_VISIBLE,
    Filtered,
    community_visible,
    community_visible_to_all,
)

_BROAD = re.compile(
    r"\b(themes?|overall|overview|main|summar\w*|trends?|general|across|whole|all|"
    r"collection|corpus|big\s+picture|landscape)\b",
    re.IGNORECASE,
)

# :l is a level, or NULL for the leaves (communities without children, at any level): the
# finest partition that still covers the whole graph.
_AT_LEVEL = (
    "(level = CAST(:l AS integer) OR (CAST(:l AS integer) IS NULL AND id NOT IN ("
    "SELECT parent_id FROM communities WHERE snapshot_id = :s AND parent_id IS NOT NULL)))"
)
# Communities a restricted caller may read (docs/access-control.md): every contributing
# document visible, checked live, before ranking and LIMIT (so before any LLM map step).
_SHOWN = " AND " + community_visible("co")
# ... and those a whole-corpus caller may read (the same rule with nothing else to hide).
_SHOWN_TO_ALL = " AND " + community_visible_to_all("co")
# Communities whose summary may quote a deleted document: read by nobody (core/erasure.py).
_KEPT = " AND co.id <> ALL(CAST(:withheld AS bigint[]))"
_EMBEDDING_HEAD = (
    "SELECT id, level, title, summary, rating, size,"  # noqa: S608 - _AT_LEVEL is a constant
    " 1 - (embedding <=> CAST(:q AS vector)) AS score FROM communities co"
    " WHERE snapshot_id = :s AND embedding IS NOT NULL AND " + _AT_LEVEL + _KEPT
)
_EMBEDDING_ORDER = " ORDER BY embedding <=> CAST(:q AS vector), id LIMIT :n"


def _shown(head: str, tail: str = "") -> Filtered:
    """A read of communities in its three forms: the operator's, a restricted caller's and a
    whole-corpus caller's (their visibility between ``head`` and ``tail``)."""
    return Filtered.of(head + tail, head + _SHOWN + tail, head + _SHOWN_TO_ALL + tail, scoped=False)


_BY_EMBEDDING = _shown(_EMBEDDING_HEAD, _EMBEDDING_ORDER)
# Ids are stable across snapshots: only the published one's rows (a retired one's summary may
# quote a deleted document).
_BY_ID_HEAD = (
    "SELECT id, level, title, summary, rating, size FROM communities co"
    " WHERE snapshot_id = :s AND id = ANY(:ids)"
)
_BY_ID = _shown(_BY_ID_HEAD)
_TEXT_HEAD = (
    "SELECT id, level, title, summary, rating, size,"  # noqa: S608 - _AT_LEVEL is a constant
    " ts_rank_cd(to_tsvector('english', title || ' ' || summary), CAST(:tsq AS tsquery)) AS score"
    " FROM communities co WHERE snapshot_id = :s AND " + _AT_LEVEL + _KEPT
)
_TEXT_ORDER = " ORDER BY score DESC, rating DESC NULLS LAST, id LIMIT :n"
_BY_TEXT = _shown(_TEXT_HEAD, _TEXT_ORDER)
_LIST_HEAD = (
    "SELECT id, level, parent_id, size, title, summary, rating FROM communities co"  # noqa: S608 - _KEPT is a constant
    " WHERE snapshot_id = :s AND (CAST(:l AS integer) IS NULL OR level = :l)"
    # an entity's communities only, when one is given
    " AND (CAST(:e AS bigint) IS NULL OR co.id IN (SELECT cm.community_id FROM"
    " community_members cm WHERE cm.snapshot_id = :s AND cm.entity_id = :e))" + _KEPT
)
_LIST_ORDER = " ORDER BY level, rating DESC NULLS LAST, size DESC, id LIMIT :n"
_LIST = _shown(_LIST_HEAD, _LIST_ORDER)
_QUERY_LEXEMES = text("SELECT tsvector_to_array(to_tsvector('english', :q))")
_PASSAGES_HEAD = (
    "SELECT c.id, c.doc_id, d.title, c.text, 1 - (c.embedding <=> CAST(:q AS vector)) AS s"
    " FROM chunks c JOIN documents d USING (doc_id)"
    " WHERE c.id IN (SELECT m.chunk_id FROM mentions m JOIN community_members cm"
    "  ON cm.entity_id = m.entity_id WHERE cm.snapshot_id = :s AND cm.community_id = ANY(:ids))"
)
_PASSAGES_ORDER = " ORDER BY c.embedding <=> CAST(:q AS vector), c.id LIMIT :k"
_MEMBER_PASSAGES = Filtered.of(
    _PASSAGES_HEAD + _PASSAGES_ORDER, _PASSAGES_HEAD + " AND " + DOC_VISIBLE + _PASSAGES_ORDER
)


# Of the communities, those with a passage in a document the read may see (with a document
# scope: in scope), for a scoped read, whose summaries are not scoped (visibility.py).
_WITH_PASSAGES = Filtered.of(
    "SELECT DISTINCT cm.community_id FROM community_members cm"
    " WHERE cm.snapshot_id = :s AND cm.community_id = ANY(:ids)",
    "SELECT DISTINCT cm.community_id FROM community_members cm"  # noqa: S608 - DOC_VISIBLE is a constant
    " JOIN mentions m ON m.entity_id = cm.entity_id JOIN documents d ON d.doc_id = m.doc_id"
    " WHERE cm.snapshot_id = :s AND cm.community_id = ANY(:ids) AND " + DOC_VISIBLE,
)


@dataclass(frozen=True)
class Passage:
    """A passage reached through a community's members."""

    chunk_id: int
    doc_id: str
    title: str
    text: str
    score: float


def breadth_level(question: str, levels: Sequence[int]) -> int | None:
    """Broad questions (themes, overall, ...) read the coarsest level; others the leaves
    (None), the most specific communities wherever the hierarchy stops splitting."""
    if levels and _BROAD.search(question):
        return min(levels)
    return None


async def rank_communities(
    conn: AsyncConnection,
    *,
    snapshot_id: int,
    level: int | None,
    question: str,
    embedding: Sequence[float],
    n: int,
    caller: Caller,
    vectors: CommunityVectors | None = None,
    erasures: WithheldCache | None = None,
) -> list[CommunityHit]:
    """The n communities of the level (None: the leaves) the caller may read, closest to the
    question (ranked in memory from ``vectors`` when given, then checked for the caller)."""
    withheld = await _withheld(conn, snapshot_id, erasures)
    params = {
        "s": snapshot_id,
        "l": level,
        "n": n,
        "q": vector_literal(embedding),
        "withheld": withheld,
    }
    if vectors is not None:
        rows = await _rank_in_memory(
            conn,
            await vectors.level(conn, snapshot_id, level),
            embedding=embedding,
            n=n,
            params=params,
            caller=caller,
        )
    else:
        rows = [tuple(r) for r in (await conn.execute(*_BY_EMBEDDING.bind(caller, params))).all()]
    if not rows:
        lexemes = (await conn.scalar(_QUERY_LEXEMES, {"q": question})) or []
        tsq = or_query(list(lexemes)) or "''"
        rows = [
            tuple(r)
            for r in (await conn.execute(*_BY_TEXT.bind(caller, {**params, "tsq": tsq}))).all()
        ]
    return [
        CommunityHit(
            id=int(r[0]),
            level=int(r[1]),
            title=str(r[2]),
            summary=str(r[3]),
            rating=None if r[4] is None else float(r[4]),
            size=int(r[5]),
            score=round(float(r[6] or 0.0), 6),
        )
        for r in rows
    ]


async def _rank_in_memory(
    conn: AsyncConnection,
    ranked: LevelVectors,
    *,
    embedding: Sequence[float],
    n: int,
    params: dict[str, Any],
    caller: Caller,
) -> list[tuple[Any, ...]]:
    """Rank the level in memory, then read the winners by id with the caller's check: those
    the caller may not read drop out and the next ones by rank take their places. An admin or
    whole-corpus caller loses few (withheld or changed through a deleted document) and reads
    on until n are read or the level is exhausted; a restricted caller reads the first n so,
    and when some failed its check, the rest in one ranking statement that checks every
    community left (the filtered ranking's cost, which is what a caller who may read few
    communities would pay anyway)."""
    exclude = list(params["withheld"])
    rows: list[tuple[Any, ...]] = []
    while len(rows) < n:
        best = ranked.top(embedding, n - len(rows), exclude=exclude)
        if not best:
            break
        ids = [i for i, _ in best]
        found = (await conn.execute(*_BY_ID.bind(caller, {**params, "ids": ids}))).all()
        by_id = {int(r[0]): r for r in found}
        rows += [(*by_id[i][:6], cos) for i, cos in best if i in by_id]
        exclude += ids
        if len(rows) < n and not caller.unfiltered:
            rest = {**params, "withheld": exclude, "n": n - len(rows)}
            rows += [
                tuple(r) for r in (await conn.execute(*_BY_EMBEDDING.bind(caller, rest))).all()
            ]
            break
    return rows


async def member_passages(
    conn: AsyncConnection,
    snapshot_id: int,
    community_ids: Sequence[int],
    embedding: Sequence[float],
    k: int,
    *,
    caller: Caller,
) -> list[Passage]:
    """Visible passages mentioning members of the communities, closest to the question first."""
    if not community_ids:
        return []
    values = {"s": snapshot_id, "ids": list(community_ids), "q": vector_literal(embedding), "k": k}
    rows = await conn.execute(*_MEMBER_PASSAGES.bind(caller, values))
    return [Passage(int(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows.all()]


async def global_retrieve(
    conn: AsyncConnection,
    req: QueryRequest,
    embedding: Sequence[float],
    snapshot_id: int | None,
    n: int,
    *,
    caller: Caller,
    vectors: CommunityVectors | None = None,
    erasures: WithheldCache | None = None,
) -> Retrieval | None:
    """Top communities at the requested (or breadth-chosen) level and their passages; None
    when there is no published snapshot with communities."""
    if snapshot_id is None:
        return None
    available = await (vectors.levels if vectors else snapshot_levels)(conn, snapshot_id)
    if not available:
        return None
    level = req.level if req.level is not None else breadth_level(req.question, available)
    where = "leaf communities" if level is None else f"level {level}"
    hits = await rank_communities(
        conn,
        snapshot_id=snapshot_id,
        level=level,
        question=req.question,
        embedding=embedding,
        n=n,
        caller=caller,
        vectors=vectors,
        erasures=erasures,
    )
    notes = [] if level is None or level in available else [f"global: level {level} is empty"]
    if caller.scope is not None and hits:  # a summary is used only where its passages are
        values = {"s": snapshot_id, "ids": [h.id for h in hits]}
        kept = {int(r[0]) for r in await conn.execute(*_WITH_PASSAGES.bind(caller, values))}
        if len(kept) < len(hits):
            notes.append(f"global: {len(hits) - len(kept)} communities have nothing in the filters")
        hits = [h for h in hits if h.id in kept]
    ids = [h.id for h in hits]
    passages = await member_passages(conn, snapshot_id, ids, embedding, req.k, caller=caller)
    contexts = [
        Context(
            doc_id=p.doc_id,
            chunk_id=p.chunk_id,
            title=p.title,
            text=p.text,
            score=round(p.score, 6),
            why=f"mentions members of communities {[h.id for h in hits][:3]} ({where})",
        )
        for p in passages
    ]
    return Retrieval("global", contexts, communities=hits, notes=notes)


async def list_communities(
    conn: AsyncConnection,
    snapshot_id: int,
    level: int | None,
    limit: int,
    *,
    caller: Caller,
    erasures: WithheldCache | None = None,
    entity: int | None = None,
) -> list[CommunitySummary]:
    """Communities of the snapshot (one level, or all; those ``entity`` is a member of, when
    given) the caller may read, best rated first."""
    withheld = await _withheld(conn, snapshot_id, erasures)
    values = {"s": snapshot_id, "l": level, "n": limit, "withheld": withheld, "e": entity}
    rows = (await conn.execute(*_LIST.bind(caller, values))).all()
    return [
        CommunitySummary(
            id=int(r[0]),
            level=int(r[1]),
            parent_id=None if r[2] is None else int(r[2]),
            size=int(r[3]),
            title=str(r[4]),
            summary=str(r[5]),
            rating=None if r[6] is None else float(r[6]),
        )
        for r in rows
    ]


async def _withheld(
    conn: AsyncConnection, snapshot_id: int, erasures: WithheldCache | None
) -> list[int]:
    if erasures is None:
        return await withheld_communities(conn, snapshot_id)
    return await erasures.get(conn, snapshot_id)
