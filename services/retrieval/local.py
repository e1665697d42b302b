"""Local (multi-hop) retrieval: ground the question's entities, expand over the adjacency rows
and the passage-entity graph (mentions; neighbourhood.py), score passages by personalised
PageRank from the seeds (or the seeds' path formula), fuse with the dense and BM25 scores, and
follow chains of passages to the later hops (chain_search.py, chains.py)."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval import chain_search, chains, neighbourhood, ranking, reseed
from services.retrieval.graph_memory import MemoryGraph
from services.retrieval.graph_walk import MemoryGraphReads
from services.retrieval.grounding import Grounding
from services.retrieval.lexical import CorpusStats, bm25_search, question_lexemes
from services.retrieval.schemas import Hop
from services.retrieval.vector import Ranked, similarities, vector_search

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
    hide_weak_edges: bool = False  # leave out co-occurrences with one piece of evidence


_PAGERANK = text(
    "SELECT entity_id, pagerank FROM snapshot_entities WHERE snapshot_id = :s"
    " AND entity_id = ANY(:e)"
)


async def graph_scores(
    conn: AsyncConnection,
    reads: neighbourhood.GraphReads,
    hood: neighbourhood.LocalGraph,
    grounding: Grounding,
    *,
    ranker: Ranker,
    snapshot_id: int | None,
    executor: Executor | None = None,
    methods: LocalMethods = LocalMethods(),
) -> dict[int, float]:
    """Passage scores from the graph: PPR from the seeds (computed in ``executor``, off the
    event loop), or the path formula (importance = the snapshot's PageRank when one is
    published, else mention counts)."""
    if ranker == "ppr":
        loop = asyncio.get_running_loop()
        walk = functools.partial(hood.pagerank, grounding.weights, hub_damping=methods.hub_damping)
        return await loop.run_in_executor(executor, walk)
    # The formula walks two relationship hops: add the neighbours' own relationships.
    ring = sorted(
        {e for s, t, *_ in hood.relations for e in (s, t)}
        - set(grounding.weights)
        - {e for e, n in hood.mention_counts.items() if n > neighbourhood.HUB_MENTIONS}
    )
    second: list[neighbourhood.Relation] = []
    if ring:
        second, _ = await reads.relations(ring, methods.hide_weak_edges, 2000)
    edges = [(s, t, w) for s, t, _, w, _ in hood.relations]
    edges += [(s, t, w) for s, t, _, w, _ in second]
    mentions = list(hood.mentions)
    new = {e for s, t, _ in edges for e in (s, t)} - set(hood.names)
    if new:
        hubs_out = [e for e, _ in await reads.not_hubs(sorted(new))]
        mentions += await reads.mentions_of(hubs_out)
        names, counts = await reads.names_of(sorted(new))
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
    memory: MemoryGraph | None = None,
) -> tuple[Ranked, list[Hop]]:
    """The k best passages by fused dense, BM25 and graph scores, with explaining hops, from
    what the caller can see. The walk restarts from the seeds; with re-seeding, a second
    walk also restarts from the bridge entities of the fused top. Chains start at the fused
    top, or continue from ``chain_start`` (a follow-up search). The graph is read from
    ``memory`` (the process's held graph) as the caller may see it (graph_walk.py), unless the
    query has a document scope (filters): then from the database, as the caller sees it."""
    depth = max(3 * k, 30)
    reads: neighbourhood.GraphReads = (
        MemoryGraphReads(memory, conn, caller)
        if memory is not None and caller.scope is None
        else neighbourhood.DbGraphReads(conn, caller)
    )
    hood = await neighbourhood.around(
        reads, sorted(grounding.weights), hide_weak=methods.hide_weak_edges
    )
    walk = functools.partial(
        graph_scores,
        conn,
        reads,
        hood,
        ranker=ranker,
        snapshot_id=snapshot_id,
        executor=executor,
        methods=methods,
    )
    graph = await walk(grounding)
    signal = ranking.GraphSignal.of(graph)
    dense_hits = await vector_search(conn, embedding, depth, caller=caller)
    chained_walk = bool(methods.chain_width) and ranker == "ppr"
    # the question's lexemes, read once for BM25 and the chains (when either runs)
    lexemes = await question_lexemes(conn, question) if weights.lexical or chained_walk else []
    bm25 = (
        await bm25_search(conn, question, depth, stats, caller=caller, asked=lexemes)
        if weights.lexical
        else {}
    )
    dense: dict[int, float] = {}
    chained: set[int] = set()  # passages chains reached through bridge entities

    async def fused_ranking(graph: ranking.GraphSignal, lexical: bool = True) -> dict[int, float]:
        top_graph = graph.order[: max(5 * k, 50)]
        pool = {h.chunk_id for h in dense_hits} | set(top_graph) | set(bm25) | chained
        missing = sorted(pool - set(dense))
        dense.update(await similarities(conn, embedding, missing, caller=caller))
        signals = {
            "vector": dense,
            "lexical": bm25,
            "graph": graph.over(pool),
        }
        chosen = {"vector": weights.vector, "lexical": weights.lexical, "graph": weights.graph}
        if not lexical:
            chosen["lexical"] = 0.0
        return ranking.fuse(signals, chosen, pool)

    async def dense_and_graph(extra: dict[int, float]) -> dict[int, float]:
        """The fused dense and graph scores with these passages (and their cosine to the
        question) among the candidates too."""
        chained.update(extra)
        dense.update(extra)
        return await fused_ranking(signal, lexical=False)

    fused = await fused_ranking(signal)
    if methods.reseed_passages and ranker == "ppr":
        top = sorted(fused, key=lambda c: (-fused[c], c))[: methods.reseed_passages]
        bridges = reseed.bridge_seeds(top, hood.mentions, grounding.weights, stats.chunks)
        if bridges:
            # One more passage-entity step from the passages the bridge entities lead to,
            # so a hop beyond them is in the graph the second walk runs on.
            reached = reseed.reached_passages(bridges, hood.mentions, skip=top)
            known = {e for e, _ in hood.mentions} | set(hood.names)
            more = await reads.bridge_step(reached, sorted(known))
            hood.mentions = sorted(set(hood.mentions) | set(more))
            both = Grounding(reseed.split_reset(grounding.weights, bridges), grounding.names)
            graph = await walk(both)
            signal = ranking.GraphSignal.of(graph)
            fused = await fused_ranking(signal)
    chain: tuple[int, ...] = ()
    first = sorted(fused, key=lambda c: (-fused[c], c))[:k]  # the fused top k, before chains
    if chained_walk:
        order, chain = await chain_search.follow_chains(
            conn,
            question,
            embedding,
            fused,
            sorted(grounding.weights),
            width=methods.chain_width,
            steps=k,
            base=dense_and_graph,
            stats=stats,
            lexical_weight=weights.lexical,
            caller=caller,
            start=chain_start,
            reads=reads,
            lexemes=lexemes,
        )
        # the merged order has no common scale: each passage scores 1 / its rank
        fused = {c: 1.0 / (i + 1) for i, c in enumerate(order)}
    ids = sorted(fused, key=lambda c: (-fused[c], c))[:k]
    why = {
        c: f"dense {dense.get(c, 0.0):.3f}, BM25 {bm25.get(c, 0.0):.2f}, "
        f"graph ({ranker}) {graph.get(c, 0.0):.2e}"
        + ("" if c in first else ", reached through a chain of passages")
        for c in ids
    }
    await reads.describe(hood, neighbourhood.SHOWN_HOPS)
    hops: list[Hop] = [
        (hood.names.get(s, str(s)), rtype, hood.names.get(t, str(t)), desc[:300])
        for s, t, rtype, _, desc in hood.relations[: neighbourhood.SHOWN_HOPS]
    ]
    return Ranked(ids, {c: fused[c] for c in ids}, why, chain=chain), hops
