"""Path mode: k shortest paths between two entities over the relationship graph (≤ 6 hops),
each hop with its strongest evidence sentence. The graph is loaded by a bidirectional
breadth-first expansion (hubs contribute their strongest edges only), then networkx enumerates
simple paths shortest first."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval.contexts import Retrieval, contexts_for
from services.retrieval.entities import search_entities
from services.retrieval.grounding import Grounding
from services.retrieval.ranking import HOP_DECAY, edge_strength
from services.retrieval.schemas import Hop, QueryRequest, Route
from services.retrieval.vector import Ranked
from services.retrieval.visibility import (
    DOC_VISIBLE,
    Filtered,
    ends_visible,
    entity_facts,
    visible_evidence,
)

EDGES_PER_NODE = 40  # strongest relationships followed out of any one entity
MAX_FRONTIER = 2000  # entities expanded per ring, so hubs cannot blow the search up

_RINGS = (
    "SELECT n.src, n.dst, n.rid, n.type, n.weight, n.forward"
    " FROM unnest(CAST(:e AS bigint[])) AS q(id)"
    " CROSS JOIN LATERAL (SELECT q.id AS src,"
    "  CASE WHEN r.source_id = q.id THEN r.target_id ELSE r.source_id END AS dst,"
)
# A restricted caller walks visible relationships only, weighted by their visible evidence.
_NEIGHBOURS = Filtered.of(
    _RINGS + "  r.id AS rid, r.type, r.weight, r.source_id = q.id AS forward FROM relationships r"
    "  WHERE r.source_id = q.id OR r.target_id = q.id"
    "  ORDER BY r.weight DESC, r.id LIMIT :per) n",
    _RINGS + "  r.id AS rid, r.type, v.w AS weight, r.source_id = q.id AS forward"
    "  FROM relationships r CROSS JOIN LATERAL "
    + visible_evidence("r.id")
    + " v WHERE (r.source_id = q.id OR r.target_id = q.id) AND v.n > 0 AND "
    + ends_visible("r.source_id", "r.target_id")
    + "  ORDER BY v.w DESC, r.id LIMIT :per) n",
)
_BEST_EVIDENCE = (
    "SELECT DISTINCT ON (ev.relationship_id) ev.relationship_id, ev.sentence, ev.chunk_id"
    " FROM relationship_evidence ev"
)
_EVIDENCE_ORDER = " ORDER BY ev.relationship_id, ev.strength DESC, ev.id"
_EVIDENCE = Filtered.of(
    _BEST_EVIDENCE + " WHERE ev.relationship_id = ANY(:r)" + _EVIDENCE_ORDER,
    _BEST_EVIDENCE + " JOIN documents d ON d.doc_id = ev.doc_id"
    " WHERE ev.relationship_id = ANY(:r) AND " + DOC_VISIBLE + _EVIDENCE_ORDER,
)


@dataclass(frozen=True)
class EntityPath:
    """A path as entity ids, the relationship used per hop, and its score."""

    entities: list[int]
    relationships: list[int]
    directed: list[tuple[int, str, int]]  # each hop as its relationship reads: source, type, target
    score: float


@dataclass(frozen=True)
class Evidence:
    """The best sentence for one relationship and the chunk it came from."""

    sentence: str
    chunk_id: int


def path_score(strengths: Sequence[float]) -> float:
    """Π edge strength × 0.9^hops (shorter and better-evidenced paths first)."""
    return math.prod(strengths) * HOP_DECAY ** len(strengths)


async def load_between(
    conn: AsyncConnection, source: int, target: int, max_hops: int, *, caller: Caller
) -> nx.Graph:
    """The relationship graph (visible to the caller) reachable within max_hops/2 rings around
    each end."""
    g = nx.Graph()
    g.add_nodes_from([source, target])
    seen = {source, target}
    frontiers = [{source}, {target}]
    for ring in range(max_hops):
        side = ring % 2
        frontier = sorted(frontiers[side])[:MAX_FRONTIER]
        if not frontier:
            continue
        ring_of = {"e": frontier, "per": EDGES_PER_NODE}
        rows = await conn.execute(*_NEIGHBOURS.bind(caller, ring_of))
        nxt = set()
        for src, dst, rid, rtype, weight, forward in rows.all():
            s, d, w = int(src), int(dst), float(weight)
            if s == d:
                continue
            current = g.get_edge_data(s, d)
            if current is None or current["strength"] < edge_strength(w):
                head, tail = (s, d) if forward else (d, s)
                g.add_edge(
                    s,
                    d,
                    rid=int(rid),
                    type=str(rtype),
                    strength=edge_strength(w),
                    ends=(head, tail),
                )
            if d not in seen:
                nxt.add(d)
        seen |= nxt
        frontiers[side] = nxt
    return g


def k_shortest(g: nx.Graph, source: int, target: int, k: int, max_hops: int) -> list[EntityPath]:
    """Up to k simple paths with at most max_hops hops, fewest hops first, then score."""
    if source not in g or target not in g or source == target:
        return []
    try:
        generator = nx.shortest_simple_paths(g, source, target)
        candidates = []
        for nodes in itertools.islice(generator, 4 * k):
            if len(nodes) - 1 > max_hops:
                break
            candidates.append(nodes)
    except nx.NetworkXNoPath:
        return []
    paths = []
    for nodes in candidates:
        edges = [g.edges[a, b] for a, b in itertools.pairwise(nodes)]
        paths.append(
            EntityPath(
                entities=[int(n) for n in nodes],
                relationships=[int(e["rid"]) for e in edges],
                directed=[(e["ends"][0], str(e["type"]), e["ends"][1]) for e in edges],
                score=path_score([float(e["strength"]) for e in edges]),
            )
        )
    paths.sort(key=lambda p: (len(p.relationships), -p.score, p.entities))
    return paths[:k]


async def evidence(
    conn: AsyncConnection, relationship_ids: Sequence[int], *, caller: Caller
) -> dict[int, Evidence]:
    """The strongest evidence sentence of each relationship, from documents the caller sees."""
    rows = await conn.execute(*_EVIDENCE.bind(caller, {"r": sorted(set(relationship_ids))}))
    return {int(r[0]): Evidence(str(r[1]), int(r[2])) for r in rows.all()}


_BETWEEN = re.compile(
    r"\bbetween\s+(?P<a>.+?)\s+and\s+(?P<b>.+?)[?.!]*$|\bfrom\s+(?P<c>.+?)\s+to\s+(?P<d>.+?)[?.!]*$",
    re.IGNORECASE,
)


def named_ends(question: str) -> tuple[str, str] | None:
    """("X", "Y") from "... between X and Y" or "... from X to Y", else None."""
    m = _BETWEEN.search(question.strip())
    if m is None:
        return None
    a, b = (m.group("a"), m.group("b")) if m.group("a") else (m.group("c"), m.group("d"))
    return a.strip(" \"'"), b.strip(" \"'")


async def endpoints(
    conn: AsyncConnection, question: str, grounding: Grounding, *, caller: Caller
) -> tuple[int, int] | None:
    """The two entities to connect: named ends when the question spells them out, else the
    two heaviest grounded seeds."""
    ends = named_ends(question)
    if ends is not None:
        found = [await search_entities(conn, name, 1, caller=caller) for name in ends]
        if all(found) and found[0][0].id != found[1][0].id:
            return found[0][0].id, found[1][0].id
    seeds = sorted(grounding.weights, key=lambda e: (-grounding.weights[e], e))
    return (seeds[0], seeds[1]) if len(seeds) >= 2 else None


async def find_routes(
    conn: AsyncConnection, source: int, target: int, k: int, max_hops: int, *, caller: Caller
) -> tuple[list[Route], list[int]]:
    """Up to k routes with evidence, and the evidence chunks in route order (all visible to the
    caller)."""
    graph = await load_between(conn, source, target, max_hops, caller=caller)
    found = k_shortest(graph, source, target, k, max_hops)
    ev = await evidence(conn, [r for p in found for r in p.relationships], caller=caller)
    facts = await entity_facts(conn, caller, [e for p in found for e in p.entities])
    label = {e: f.name for e, f in facts.items()}
    routes, chunks = [], []
    for p in found:
        hops: list[Hop] = []
        for rid, (head, rtype, tail) in zip(p.relationships, p.directed, strict=True):
            proof = ev.get(rid)
            hops.append(
                (
                    label.get(head, str(head)),
                    rtype,
                    label.get(tail, str(tail)),
                    proof.sentence if proof else "",
                )
            )
            if proof is not None:
                chunks.append(proof.chunk_id)
        routes.append(
            Route(
                entities=[label.get(e, str(e)) for e in p.entities],
                hops=hops,
                score=round(p.score, 6),
            )
        )
    return routes, list(dict.fromkeys(chunks))


async def path_retrieve(
    conn: AsyncConnection,
    req: QueryRequest,
    grounding: Grounding,
    max_hops: int,
    *,
    caller: Caller,
) -> Retrieval | None:
    """Routes between the question's two entities, their evidence passages as contexts; None
    when the question does not name two entities or they are not connected."""
    ends = await endpoints(conn, req.question, grounding, caller=caller)
    if ends is None:
        return None
    routes, chunk_ids = await find_routes(
        conn, ends[0], ends[1], min(req.k, 5), max_hops, caller=caller
    )
    if not routes:
        return None
    ranked = Ranked(
        chunk_ids[: req.k],
        {c: 1.0 / (i + 1) for i, c in enumerate(chunk_ids)},
        dict.fromkeys(chunk_ids, "evidence of a hop on the path"),
    )
    contexts = await contexts_for(conn, ranked, caller=caller)
    return Retrieval(
        "path",
        contexts,
        hops=[h for r in routes for h in r.hops],
        routes=routes,
        grounded=grounding.ranked_names(),
    )
