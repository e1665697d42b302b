"""The bounded neighbourhood local mode walks (every statement that returns rows a caller may
not see has a restricted-caller twin; the others only look up ids those returned):
the seeds' relationships, the passages that mention them, and bridge steps to the other
entities of those passages with all their mentions; hubs are not expanded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval import ranking, reseed
from services.retrieval.visibility import (
    DOC_VISIBLE,
    Filtered,
    ends_visible,
    entity_names,
    visible_evidence,
)

HUB_MENTIONS = 200  # entities mentioned more often than this are not expanded through
MAX_BRIDGE_MENTIONS = 4000  # passage links each step reads (rarest entities first)
SHOWN_HOPS = 10  # relations a local result shows as its hops
# The indexer's co-occurrence type (services/core/extraction.py, not imported: it loads spaCy),
# weak with one piece of evidence.
CO_OCCURS = "co_occurs"

Relation = tuple[int, int, str, float, str]  # source, target, type, weight, description


@dataclass
class LocalGraph:
    """The bounded neighbourhood around the seeds, as edge lists."""

    names: dict[int, str]  # the relationship endpoints
    mention_counts: dict[int, int]
    relations: list[Relation]
    mentions: list[tuple[int, int]] = field(default_factory=list)  # (entity, chunk)
    relation_ids: list[int] = field(default_factory=list)  # when read from memory

    def pagerank(self, seeds: dict[int, float], *, hub_damping: bool = False) -> dict[int, float]:
        """PPR over the passage-entity graph plus relationship edges (log1p weights)."""
        rel = np.array([(s, t, w) for s, t, _, w, _ in self.relations], dtype=np.float64)
        men = np.array(self.mentions, dtype=np.int64).reshape(-1, 2)
        mention_weights = np.ones(len(men))
        if hub_damping and len(men):
            counts = reseed.passage_counts(self.mentions)
            df = np.array([counts[e] for e in men[:, 0].tolist()], dtype=np.int64)
            mention_weights = ranking.mention_weight(df)
        rel_s = rel[:, 0].astype(np.int64) if len(rel) else np.zeros(0, dtype=np.int64)
        rel_t = rel[:, 1].astype(np.int64) if len(rel) else np.zeros(0, dtype=np.int64)
        return ranking.pagerank_coded(
            np.concatenate([ranking.code_entities(rel_s), ranking.code_entities(men[:, 0])]),
            np.concatenate([ranking.code_entities(rel_t), ranking.code_passages(men[:, 1])]),
            np.concatenate([np.log1p(rel[:, 2]) if len(rel) else np.zeros(0), mention_weights]),
            seeds,
        )


# For a restricted caller: visible relationships only, weight and description rebuilt from
# visible evidence; mentions only in visible documents. The PPR graph is built from these.
# ``{strong}``: nothing, or the filter that leaves weak edges out (STRONG_RELATIONSHIPS).
_RELATIONSHIPS_ADMIN = (
    "SELECT r.source_id, r.target_id, r.type, r.weight, r.description FROM relationships r"
    " WHERE (r.source_id = ANY(:e) OR r.target_id = ANY(:e)){strong}"
    " ORDER BY r.weight DESC, r.id LIMIT :n"
)
_RELATIONSHIPS_VISIBLE = (
    "SELECT r.source_id, r.target_id, r.type, v.w, v.x FROM relationships r"  # noqa: S608 - visibility fragments are constants
    " CROSS JOIN LATERAL "
    + visible_evidence("r.id")
    + " v WHERE (r.source_id = ANY(:e) OR r.target_id = ANY(:e)) AND v.n > 0 AND "
    + ends_visible("r.source_id", "r.target_id")
    + "{strong} ORDER BY v.w DESC, r.id LIMIT :n"
)
RELATIONSHIPS = Filtered.of(
    _RELATIONSHIPS_ADMIN.format(strong=""), _RELATIONSHIPS_VISIBLE.format(strong="")
)
# Weak edges (relationships.weak: a co-occurrence with one piece of evidence) left out:
# KGSTREAM_QUERY_LOCAL_HIDE_WEAK_EDGES (docs/curation.md, "Pruning").
# A restricted caller's weak edges are judged on the evidence it can see (the whole graph's
# count would tell it whether documents it cannot read evidence an edge).
STRONG_RELATIONSHIPS = Filtered.of(
    _RELATIONSHIPS_ADMIN.format(strong=" AND NOT r.weak"),
    _RELATIONSHIPS_VISIBLE.format(strong=f" AND NOT (r.type = '{CO_OCCURS}' AND v.n <= 1)"),
)


def relationships(hide_weak: bool) -> Filtered:
    """Local mode's relationship statement: every edge, or the strong ones only."""
    return STRONG_RELATIONSHIPS if hide_weak else RELATIONSHIPS


# Small statements over explicit id lists: each is an index lookup (one query joining
# mentions to entities made the planner scan both tables on a 10k-document corpus).
_NOT_HUBS = text(
    "SELECT id, mention_count FROM entities WHERE id = ANY(:e) AND mention_count <= :hub"
    " ORDER BY mention_count, id"
)
# (entity, chunk) pairs come back as two arrays in one row: thousands of rows turned into
# Python tuples one by one cost 3 ms a query on a 10k-document corpus (py-spy).
_AS_ARRAYS = (
    "SELECT coalesce(array_agg(p.e), '{{}}'), coalesce(array_agg(p.c), '{{}}') FROM ({}) AS p(e, c)"
)
_MENTIONS = Filtered.of(
    _AS_ARRAYS.format(
        "SELECT DISTINCT entity_id, chunk_id FROM mentions WHERE entity_id = ANY(:e)"
    ),
    _AS_ARRAYS.format(
        "SELECT DISTINCT m.entity_id, m.chunk_id FROM mentions m JOIN documents d"  # noqa: S608 - DOC_VISIBLE is a constant
        " ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:e) AND " + DOC_VISIBLE
    ),
)
# The bridge in one statement: the other entities of the first-hop passages (not known yet,
# not hubs), rarest first while their mentions add up to at most :max links, and their
# mentions. Done in SQL so the thousands of candidate ids and rows of a large corpus are
# ranked where they are, not shipped to Python (issue 10, deliverable 4's profile).
# The chosen ids are made an array first (ARRAY(...)), so their mentions are read by index,
# at most :max rows: as an IN (subquery) the planner estimated the ids from the candidates and
# hash-joined a sequential scan of every mention to them (10.5 ms a call at 10k documents,
# 110 ms at the slowest, growing with the corpus; issue 20).
_BRIDGE = """
SELECT DISTINCT m.entity_id, m.chunk_id FROM {outer} m.entity_id = ANY(ARRAY(
  SELECT b.id FROM (
    SELECT e.id, sum(e.mention_count) OVER (ORDER BY e.mention_count, e.id) AS links
    FROM entities e
    WHERE e.id IN (SELECT p.entity_id FROM {inner} p.chunk_id = ANY(:c))
      AND NOT EXISTS (SELECT FROM unnest(CAST(:known AS bigint[])) k(id) WHERE k.id = e.id)
      AND e.mention_count <= :hub
  ) b WHERE b.links <= :max))
"""
_VISIBLE_MENTIONS = "mentions {m} JOIN documents d ON d.doc_id = {m}.doc_id WHERE " + DOC_VISIBLE
_BRIDGE_MENTIONS = Filtered.of(
    _AS_ARRAYS.format(_BRIDGE.format(outer="mentions m WHERE", inner="mentions p WHERE")),
    _AS_ARRAYS.format(
        _BRIDGE.format(
            outer=_VISIBLE_MENTIONS.format(m="m") + " AND",
            inner=_VISIBLE_MENTIONS.format(m="p") + " AND",
        )
    ),
)
_NAMES = text("SELECT id, name, mention_count FROM entities WHERE id = ANY(:e)")


@runtime_checkable
class GraphReads(Protocol):
    """What local mode reads of the graph: from the database for any caller (``DbGraphReads``)
    or from the graph held in memory (graph_walk.py)."""

    holds_topics: bool  # ``about`` costs no round trip: statements need not read it too

    async def relations(
        self, seeds: Sequence[int], hide_weak: bool, limit: int
    ) -> tuple[list[Relation], list[int]]:
        """The seeds' relationships by weight then id, at most ``limit`` (and their ids when
        known: those read from memory are described later, ``describe``)."""
        ...

    async def not_hubs(self, entities: Sequence[int]) -> list[tuple[int, int]]:
        """(entity, mention count) of the non-hub entities among these, rarest first."""
        ...

    async def mentions_of(self, entities: Sequence[int]) -> list[tuple[int, int]]:
        """Their (entity, chunk) passage edges."""
        ...

    async def bridge_step(
        self, chunks: Sequence[int], known: Sequence[int]
    ) -> list[tuple[int, int]]:
        """(entity, chunk) edges of the other entities of these passages (not ``known``, not
        hubs), rarest first up to MAX_BRIDGE_MENTIONS links."""
        ...

    async def about(self, chunks: Sequence[int]) -> list[tuple[int, int]]:
        """(chunk, entity) pairs: the entities these passages are about (their title)."""
        ...

    async def names_of(self, entities: Sequence[int]) -> tuple[dict[int, str], dict[int, int]]:
        """Names and mention counts of those that exist (names may be filled in later)."""
        ...

    async def describe(self, hood: LocalGraph, shown: int) -> None:
        """Fill in the names and descriptions of the first ``shown`` relations."""
        ...


# The entities a passage is about: its document's title (resolution.with_title, at -1; the
# publisher's facts sit at -2, -3, ...: services/indexer/provided.py).
_TOPICS = text(
    "SELECT chunk_id, entity_id FROM mentions WHERE chunk_id = ANY(:c) AND start_char = -1"
)


class DbGraphReads:
    """GraphReads by the statements of this module, as the caller may see."""

    holds_topics = False

    def __init__(self, conn: AsyncConnection, caller: Caller) -> None:
        self._conn, self._caller = conn, caller

    async def relations(
        self, seeds: Sequence[int], hide_weak: bool, limit: int
    ) -> tuple[list[Relation], list[int]]:
        statement = relationships(hide_weak)
        values = {"e": list(seeds), "n": limit}
        rows = (await self._conn.execute(*statement.bind(self._caller, values))).all()
        return [(int(s), int(t), str(y), float(w), str(d)) for s, t, y, w, d in rows], []

    async def not_hubs(self, entities: Sequence[int]) -> list[tuple[int, int]]:
        return await not_hubs(self._conn, entities)

    async def mentions_of(self, entities: Sequence[int]) -> list[tuple[int, int]]:
        return await mentions_of(self._conn, entities, self._caller)

    async def bridge_step(
        self, chunks: Sequence[int], known: Sequence[int]
    ) -> list[tuple[int, int]]:
        return await bridge_step(self._conn, chunks, known, self._caller)

    async def about(self, chunks: Sequence[int]) -> list[tuple[int, int]]:
        if not chunks:
            return []
        rows = await self._conn.execute(_TOPICS, {"c": list(chunks)})
        return [(int(c), int(e)) for c, e in rows.all()]

    async def names_of(self, entities: Sequence[int]) -> tuple[dict[int, str], dict[int, int]]:
        return await names_of(self._conn, entities, self._caller)

    async def describe(self, hood: LocalGraph, shown: int) -> None:  # noqa: ARG002 - protocol
        return None  # read with their descriptions and names


async def around(reads: GraphReads, seeds: Sequence[int], *, hide_weak: bool = False) -> LocalGraph:
    """Seeds, their 1-hop relationship neighbours (``hide_weak``: strong edges only), the
    passages that mention them, and one more passage-entity step (the bridge to a second
    document); hubs are not expanded. Only what the caller can see."""
    relations, relation_ids = await reads.relations(seeds, hide_weak, 500)
    entities = sorted(set(seeds) | {r[0] for r in relations} | {r[1] for r in relations})
    first = await reads.mentions_of(first_step(await reads.not_hubs(entities), seeds))
    # The bridge: other entities of those passages, rarest first, up to a bound of links.
    bridge = await reads.bridge_step(sorted({c for _, c in first}), entities)
    mentions = sorted(set(first) | set(bridge))
    names, counts = await reads.names_of(entities)
    return LocalGraph(names, counts, relations, mentions, relation_ids)


def first_step(ranked: Sequence[tuple[int, int]], seeds: Sequence[int]) -> list[int]:
    """The entities whose passages the first step reads: the (non-hub) seeds, then their
    relationship neighbours rarest first while the links add up to MAX_BRIDGE_MENTIONS, the
    same budget as the bridge step's (``ranked``: (entity, mention count), rarest first)."""
    own = set(seeds)
    chosen = [e for e, _ in ranked if e in own]
    links = sum(n for e, n in ranked if e in own)
    for entity, count in ranked:
        if entity in own:
            continue
        links += count
        if links > MAX_BRIDGE_MENTIONS:
            break
        chosen.append(entity)
    return chosen


async def bridge_step(
    conn: AsyncConnection, chunks: Sequence[int], known: Sequence[int], caller: Caller
) -> list[tuple[int, int]]:
    """(entity, chunk) mentions of the other entities of these passages (not ``known``, not
    hubs), rarest first up to MAX_BRIDGE_MENTIONS links."""
    if not chunks:
        return []
    values = {
        "c": sorted(chunks),
        "known": sorted(known),
        "hub": HUB_MENTIONS,
        "max": MAX_BRIDGE_MENTIONS,
    }
    return await _pairs(conn, *_BRIDGE_MENTIONS.bind(caller, values))


async def not_hubs(conn: AsyncConnection, entities: Sequence[int]) -> list[tuple[int, int]]:
    """(entity, mention count) of the non-hub entities among these, rarest first."""
    if not entities:
        return []
    rows = await conn.execute(_NOT_HUBS, {"e": list(entities), "hub": HUB_MENTIONS})
    return [(int(e), int(n)) for e, n in rows.all()]


async def mentions_of(
    conn: AsyncConnection, entities: Sequence[int], caller: Caller
) -> list[tuple[int, int]]:
    if not entities:
        return []
    return await _pairs(conn, *_MENTIONS.bind(caller, {"e": list(entities)}))


async def _pairs(
    conn: AsyncConnection, statement: TextClause, values: dict[str, object]
) -> list[tuple[int, int]]:
    """The (entity, chunk) pairs of a statement that returns them as two arrays."""
    entities, chunks = (await conn.execute(statement, values)).one()
    return list(zip(entities, chunks, strict=True))


async def names_of(
    conn: AsyncConnection, entities: Sequence[int], caller: Caller
) -> tuple[dict[int, str], dict[int, int]]:
    names, counts = {}, {}
    if not caller.unfiltered:
        named = await entity_names(conn, caller, entities)
        return {e: n for e, (n, _) in named.items()}, {e: c for e, (_, c) in named.items()}
    for eid, name, count in (await conn.execute(_NAMES, {"e": list(entities)})).all():
        names[int(eid)], counts[int(eid)] = str(name), int(count)
    return names, counts
