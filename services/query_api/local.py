"""Local (multi-hop) retrieval: ground the question's entities, expand over the adjacency rows
and the passage-entity graph (mentions), score passages by personalised PageRank from the seeds
(or the seeds' path formula), and fuse with the dense and BM25 scores."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.query_api import chains, ranking, reseed
from services.query_api.grounding import Grounding
from services.query_api.lexical import (
    CorpusStats,
    bm25_search,
    question_lexemes,
    question_terms,
    useful_terms,
)
from services.query_api.schemas import Hop
from services.query_api.vector import Ranked, similarities, vector_search
from services.query_api.visibility import (
    DOC_VISIBLE,
    Filtered,
    ends_visible,
    entity_facts,
    visible_evidence,
)

HUB_MENTIONS = 200  # entities mentioned more often than this are not expanded through
MAX_BRIDGE_MENTIONS = 4000  # second-step passage links kept (rarest entities first)
Ranker = Literal["ppr", "paths"]


@dataclass(frozen=True)
class LocalWeights:
    """Fusion weights of the three signals (z-scores). Equal: no signal is preferred, and only
    the ratios matter (0.3/0.3/0.4 had been fitted on the 300-document dev set)."""

    vector: float = 1.0
    lexical: float = 1.0
    graph: float = 1.0


@dataclass(frozen=True)
class LocalMethods:
    """Which multi-hop methods local mode's PPR uses (settings KGSTREAM_QUERY_LOCAL_*; rules
    in docs/retrieval.md)."""

    reseed_passages: int = 5  # top fused passages whose bridge entities re-seed (0: off)
    hub_damping: bool = False  # passage-entity edges weighted 1 / ln(1 + df)
    chain_width: int = 3  # chains of passages followed through bridge entities (0: off)


@dataclass
class LocalGraph:
    """The bounded neighbourhood around the seeds, as edge lists."""

    names: dict[int, str]  # the relationship endpoints
    mention_counts: dict[int, int]
    relations: list[tuple[int, int, str, float, str]]  # source, target, type, weight, description
    mentions: list[tuple[int, int]] = field(default_factory=list)  # (entity, chunk)

    def pagerank(
        self,
        seeds: dict[int, float],
        methods: LocalMethods = LocalMethods(),
    ) -> dict[int, float]:
        """PPR over the passage-entity graph plus relationship edges (log1p weights)."""
        rel = np.array([(s, t, w) for s, t, _, w, _ in self.relations], dtype=np.float64)
        men = np.array(self.mentions, dtype=np.int64).reshape(-1, 2)
        mention_weights = np.ones(len(men))
        if methods.hub_damping and len(men):
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
_RELS = Filtered.of(
    "SELECT r.source_id, r.target_id, r.type, r.weight, r.description FROM relationships r"
    " WHERE r.source_id = ANY(:e) OR r.target_id = ANY(:e)"
    " ORDER BY r.weight DESC, r.id LIMIT :n",
    "SELECT r.source_id, r.target_id, r.type, v.w, v.x FROM relationships r"  # noqa: S608 - visibility fragments are constants
    " CROSS JOIN LATERAL "
    + visible_evidence("r.id")
    + " v WHERE (r.source_id = ANY(:e) OR r.target_id = ANY(:e)) AND v.n > 0 AND "
    + ends_visible("r.source_id", "r.target_id")
    + " ORDER BY v.w DESC, r.id LIMIT :n",
)
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
_BRIDGE = """
SELECT DISTINCT m.entity_id, m.chunk_id FROM {outer} m.entity_id IN (
  SELECT b.id FROM (
    SELECT e.id, sum(e.mention_count) OVER (ORDER BY e.mention_count, e.id) AS links
    FROM entities e
    WHERE e.id IN (SELECT p.entity_id FROM {inner} p.chunk_id = ANY(:c))
      AND e.id <> ALL(:known) AND e.mention_count <= :hub
  ) b WHERE b.links <= :max)
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
# The entities a passage is about: its document's title (resolution.with_title, no offsets).
_TOPICS = text(
    "SELECT chunk_id, entity_id FROM mentions WHERE chunk_id = ANY(:c) AND start_char < 0"
)
_NAMES = text("SELECT id, name, mention_count FROM entities WHERE id = ANY(:e)")
_PAGERANK = text(
    "SELECT entity_id, pagerank FROM snapshot_entities WHERE snapshot_id = :s"
    " AND entity_id = ANY(:e)"
)


async def neighbourhood(
    conn: AsyncConnection,
    seeds: Sequence[int],
    *,
    caller: Caller,
) -> LocalGraph:
    """Seeds, their 1-hop relationship neighbours, the passages that mention them, and one
    more passage-entity step (the bridge to a second document); hubs are not expanded. Only
    what the caller can see."""
    rels = (await conn.execute(*_RELS.bind(caller, {"e": list(seeds), "n": 500}))).all()
    relations = [(int(s), int(t), str(y), float(w), str(d)) for s, t, y, w, d in rels]
    entities = sorted(set(seeds) | {r[0] for r in relations} | {r[1] for r in relations})
    first = await _mentions_of(conn, [e for e, _ in await _not_hubs(conn, entities)], caller)
    # The bridge: other entities of those passages, rarest first, up to a bound of links.
    bridge = await bridge_step(conn, sorted({c for _, c in first}), entities, caller)
    mentions = sorted(set(first) | set(bridge))
    names, counts = await _names(conn, entities, caller)
    return LocalGraph(names, counts, relations, mentions)


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


async def _not_hubs(conn: AsyncConnection, entities: Sequence[int]) -> list[tuple[int, int]]:
    """(entity, mention count) of the non-hub entities among these, rarest first."""
    if not entities:
        return []
    rows = await conn.execute(_NOT_HUBS, {"e": list(entities), "hub": HUB_MENTIONS})
    return [(int(e), int(n)) for e, n in rows.all()]


async def _mentions_of(
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


async def _names(
    conn: AsyncConnection, entities: Sequence[int], caller: Caller
) -> tuple[dict[int, str], dict[int, int]]:
    names, counts = {}, {}
    if not caller.admin:
        facts = await entity_facts(conn, caller, entities)
        return {e: f.name for e, f in facts.items()}, {e: f.mentions for e, f in facts.items()}
    for eid, name, count in (await conn.execute(_NAMES, {"e": list(entities)})).all():
        names[int(eid)], counts[int(eid)] = str(name), int(count)
    return names, counts


async def graph_scores(
    conn: AsyncConnection,
    hood: LocalGraph,
    grounding: Grounding,
    *,
    ranker: Ranker,
    snapshot_id: int | None,
    executor: Executor | None = None,
    caller: Caller,
    methods: LocalMethods = LocalMethods(),
) -> dict[int, float]:
    """Passage scores from the graph: PPR from the seeds (computed in ``executor``, off the
    event loop), or the path formula (importance = the snapshot's PageRank when one is
    published, else mention counts)."""
    if ranker == "ppr":
        loop = asyncio.get_running_loop()
        walk = functools.partial(hood.pagerank, grounding.weights, methods)
        return await loop.run_in_executor(executor, walk)
    # The formula walks two relationship hops: add the neighbours' own relationships.
    ring = sorted(
        {e for s, t, *_ in hood.relations for e in (s, t)}
        - set(grounding.weights)
        - {e for e, n in hood.mention_counts.items() if n > HUB_MENTIONS}
    )
    second: list[Any] = []
    if ring:
        second = list((await conn.execute(*_RELS.bind(caller, {"e": ring, "n": 2000}))).all())
    edges = [(s, t, w) for s, t, _, w, _ in hood.relations]
    edges += [(int(r[0]), int(r[1]), float(r[3])) for r in second]
    mentions = list(hood.mentions)
    new = {e for s, t, _ in edges for e in (s, t)} - set(hood.names)
    if new:
        hubs_out = [e for e, _ in await _not_hubs(conn, sorted(new))]
        mentions += await _mentions_of(conn, hubs_out, caller)
        names, counts = await _names(conn, sorted(new), caller)
        hood.names.update(names)
        hood.mention_counts.update(counts)
    entities = sorted(hood.names)
    raw: dict[int, float] = {e: math.log1p(hood.mention_counts.get(e, 0)) for e in entities}
    if snapshot_id is not None:
        rows = await conn.execute(_PAGERANK, {"s": snapshot_id, "e": entities})
        pagerank = {int(e): float(p) for e, p in rows.all()}
        if pagerank:
            raw = {e: pagerank.get(e, 0.0) for e in entities}
    importance = ranking.normalised_importance(raw)
    best = ranking.best_paths(edges, grounding.weights, importance, max_hops=2)
    return ranking.passage_path_scores(best, mentions)


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
    used = sorted(start.used) if start else seeds  # entities no step bridges through
    asked = await question_lexemes(conn, question)
    idf = useful_terms(await stats.frequencies.of(conn, asked), stats.chunks)
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


async def local_search(
    conn: AsyncConnection,
    question: str,
    embedding: Sequence[float],
    grounding: Grounding,
    k: int,
    *,
    ranker: Ranker,
    weights: LocalWeights,
    snapshot_id: int | None,
    stats: CorpusStats,
    executor: Executor | None = None,
    caller: Caller,
    methods: LocalMethods = LocalMethods(),
    chain_start: chains.ChainStart | None = None,
) -> tuple[Ranked, list[Hop]]:
    """The k best passages by fused dense, BM25 and graph scores, with explaining hops, from
    what the caller can see. The walk restarts from the seeds; with re-seeding, a second
    walk also restarts from the bridge entities of the fused top. Chains start at the fused
    top, or continue from ``chain_start`` (a follow-up search)."""
    depth = max(3 * k, 30)
    hood = await neighbourhood(conn, sorted(grounding.weights), caller=caller)
    walk = functools.partial(
        graph_scores,
        conn,
        hood,
        ranker=ranker,
        snapshot_id=snapshot_id,
        executor=executor,
        caller=caller,
        methods=methods,
    )
    graph = await walk(grounding)
    dense_hits = await vector_search(conn, embedding, depth, caller=caller)
    bm25 = await bm25_search(conn, question, depth, stats, caller=caller) if weights.lexical else {}
    dense: dict[int, float] = {}
    chained: set[int] = set()  # passages chains reached through bridge entities

    async def fused_ranking(graph: dict[int, float], lexical: bool = True) -> dict[int, float]:
        top_graph = sorted(graph, key=lambda c: (-graph[c], c))[: max(5 * k, 50)]
        pool = {h.chunk_id for h in dense_hits} | set(top_graph) | set(bm25) | chained
        missing = sorted(pool - set(dense))
        dense.update(await similarities(conn, embedding, missing, caller=caller))
        signals = {
            "vector": dense,
            "lexical": bm25,
            "graph": ranking.graph_signal(graph, pool),
        }
        chosen = {"vector": weights.vector, "lexical": weights.lexical, "graph": weights.graph}
        if not lexical:
            chosen["lexical"] = 0.0
        return ranking.fuse(signals, chosen, pool)

    async def dense_and_graph(extra: set[int]) -> dict[int, float]:
        """The fused dense and graph scores with these passages among the candidates too."""
        chained.update(extra)
        return await fused_ranking(graph, lexical=False)

    fused = await fused_ranking(graph)
    if methods.reseed_passages and ranker == "ppr":
        top = sorted(fused, key=lambda c: (-fused[c], c))[: methods.reseed_passages]
        bridges = reseed.bridge_seeds(top, hood.mentions, grounding.weights, stats.chunks)
        if bridges:
            # One more passage-entity step from the passages the bridge entities lead to,
            # so a hop beyond them is in the graph the second walk runs on.
            reached = reseed.reached_passages(bridges, hood.mentions, skip=top)
            known = {e for e, _ in hood.mentions} | set(hood.names)
            more = await bridge_step(conn, reached, sorted(known), caller)
            hood.mentions = sorted(set(hood.mentions) | set(more))
            both = Grounding(reseed.split_reset(grounding.weights, bridges), grounding.names)
            graph = await walk(both)
            fused = await fused_ranking(graph)
    chain: tuple[int, ...] = ()
    if methods.chain_width and ranker == "ppr":
        order, chain = await follow_chains(
            conn,
            question,
            fused,
            sorted(grounding.weights),
            width=methods.chain_width,
            steps=k,
            base=dense_and_graph,
            stats=stats,
            lexical_weight=weights.lexical,
            caller=caller,
            start=chain_start,
        )
        fused = {c: -float(i) for i, c in enumerate(order)}
    ids = sorted(fused, key=lambda c: (-fused[c], c))[:k]
    why = {
        c: f"dense {dense.get(c, 0.0):.3f}, BM25 {bm25.get(c, 0.0):.2f}, "
        f"graph ({ranker}) {graph.get(c, 0.0):.2e}"
        for c in ids
    }
    hops: list[Hop] = [
        (hood.names.get(s, str(s)), rtype, hood.names.get(t, str(t)), desc[:300])
        for s, t, rtype, _, desc in hood.relations[:10]
    ]
    return Ranked(ids, {c: fused[c] for c in ids}, why, chain=chain), hops
