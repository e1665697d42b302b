"""Local (multi-hop) retrieval: ground the question's entities, expand over the adjacency rows
and the passage-entity graph (mentions), rank passages by personalised PageRank from the
grounded entities and fuse with the dense score (DESIGN.md: the prototype's best method)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.normalize import entity_key

HUB_MENTIONS = 200  # entities mentioned more often than this are not expanded through
MAX_NGRAM = 5
_WORD = re.compile(r"[\w'’.-]+", re.UNICODE)
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "is",
        "was",
        "are",
        "were",
        "be",
        "been",
        "which",
        "who",
        "whom",
        "what",
        "when",
        "where",
        "why",
        "how",
        "did",
        "does",
        "do",
        "that",
        "this",
        "these",
        "those",
        "it",
        "its",
        "as",
        "than",
        "both",
        "same",
        "same",
        "other",
        "also",
        "their",
        "his",
        "her",
        "they",
        "he",
        "she",
        "film",
        "one",
        "two",
        "first",
    ]
)


@dataclass
class Grounding:
    """Entities found in the question, with their seed weights (IDF-like)."""

    weights: dict[int, float] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


@dataclass
class LocalGraph:
    """The bounded neighbourhood around the seeds."""

    graph: nx.Graph
    names: dict[int, str]
    relations: list[tuple[int, int, str, str]]  # source, target, type, description


def question_keys(question: str, spans: Iterable[str]) -> set[str]:
    """Normalised keys of the question's n-grams and extracted spans that may name entities."""
    words = _WORD.findall(question)
    keys = {entity_key(s) for s in spans if s.strip()}
    for n in range(1, MAX_NGRAM + 1):
        for i in range(len(words) - n + 1):
            gram = words[i : i + n]
            if all(w.lower() in _STOP for w in gram):
                continue
            if n == 1 and (len(gram[0]) < 3 or gram[0].islower()):
                continue
            keys.add(entity_key(" ".join(gram)))
    keys.discard("")
    return keys


async def ground(
    conn: AsyncConnection, question: str, spans: Sequence[str], total_chunks: int
) -> Grounding:
    """Exact key/alias matches for n-grams and spans, trigram matches for extracted spans."""
    keys = sorted(question_keys(question, spans))
    rows = (
        await conn.execute(
            text(
                "SELECT e.id, e.name, e.mention_count FROM entities e WHERE e.key = ANY(:k)"
                " UNION SELECT e.id, e.name, e.mention_count FROM aliases a"
                " JOIN entities e ON e.id = a.entity_id WHERE a.alias_key = ANY(:k)"
            ),
            {"k": keys},
        )
    ).all()
    found = {int(r[0]): (r[1], int(r[2]), 1.0) for r in rows}
    for span in spans:
        fuzzy = await conn.execute(
            text(
                "SELECT id, name, mention_count, similarity(name, :s) AS sim FROM entities"
                " WHERE name % :s ORDER BY sim DESC LIMIT 3"
            ),
            {"s": span},
        )
        for r in fuzzy.all():
            if float(r[3]) >= 0.5 and int(r[0]) not in found:
                found[int(r[0])] = (r[1], int(r[2]), float(r[3]))
    out = Grounding()
    for eid, (name, mentions, sim) in found.items():
        out.weights[eid] = sim * math.log((total_chunks + 1) / (mentions + 1) + 1.0)
        out.names[eid] = name
    return out


async def neighbourhood(conn: AsyncConnection, seeds: Sequence[int]) -> LocalGraph:
    """Seeds, their 1-hop relationship neighbours, the passages that mention them, and one
    more passage-entity step (the bridge to a second document); hubs are not expanded."""
    g = nx.Graph()
    rels = (
        await conn.execute(
            text(
                "SELECT source_id, target_id, type, weight, description FROM relationships"
                " WHERE source_id = ANY(:e) OR target_id = ANY(:e) ORDER BY weight DESC LIMIT 500"
            ),
            {"e": list(seeds)},
        )
    ).all()
    relations = []
    for s, t, rtype, w, desc in rels:
        g.add_edge(("e", s), ("e", t), weight=math.log1p(float(w)))
        relations.append((int(s), int(t), rtype, desc))
    entities = set(seeds) | {int(r[0]) for r in rels} | {int(r[1]) for r in rels}
    chunks = await _mentions_of(conn, entities, g, seeds)
    # Step two: entities in those passages, then the passages mentioning them.
    second = await conn.execute(
        text(
            "SELECT DISTINCT m.entity_id FROM mentions m JOIN entities e ON e.id = m.entity_id"
            " WHERE m.chunk_id = ANY(:c) AND e.mention_count <= :hub"
        ),
        {"c": list(chunks), "hub": HUB_MENTIONS},
    )
    await _mentions_of(conn, {int(r[0]) for r in second.all()} - entities, g, seeds)
    names_rows = await conn.execute(
        text("SELECT id, name FROM entities WHERE id = ANY(:e)"),
        {"e": [n[1] for n in g.nodes if n[0] == "e"]},
    )
    return LocalGraph(g, {int(r[0]): r[1] for r in names_rows.all()}, relations)


async def _mentions_of(
    conn: AsyncConnection, entities: set[int], g: nx.Graph, seeds: Sequence[int]
) -> set[int]:
    if not entities:
        return set()
    rows = await conn.execute(
        text(
            "SELECT m.entity_id, m.chunk_id FROM mentions m JOIN entities e ON e.id = m.entity_id"
            " WHERE m.entity_id = ANY(:e) AND (e.mention_count <= :hub OR e.id = ANY(:s))"
            " LIMIT 20000"
        ),
        {"e": sorted(entities), "hub": HUB_MENTIONS, "s": list(seeds)},
    )
    chunks = set()
    for eid, cid in rows.all():
        g.add_edge(("e", int(eid)), ("c", int(cid)), weight=1.0)
        chunks.add(int(cid))
    return chunks


def personalised_pagerank(g: nx.Graph, seeds: Mapping[int, float]) -> dict[int, float]:
    """PPR (damping 0.85) from the seed entities; returns the score of every passage node."""
    personalization = {("e", e): w for e, w in seeds.items() if ("e", e) in g and w > 0}
    if not personalization:
        return {}
    scores = nx.pagerank(g, alpha=0.85, personalization=personalization, weight="weight")
    return {node[1]: float(s) for node, s in scores.items() if node[0] == "c"}


def zscores(values: Mapping[int, float]) -> dict[int, float]:
    """Standard scores; all zeros when the values do not vary."""
    if not values:
        return {}
    xs = list(values.values())
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {k: ((v - mean) / sd if sd > 1e-12 else 0.0) for k, v in values.items()}


def fuse(
    dense: Mapping[int, float], ppr: Mapping[int, float], vector_weight: float
) -> dict[int, float]:
    """vector_weight·z(dense) + (1-vector_weight)·z(log1p(PPR / median PPR))."""
    positive = sorted(v for v in ppr.values() if v > 0)
    median = positive[len(positive) // 2] if positive else 1.0
    graph = {c: math.log1p(ppr.get(c, 0.0) / median) for c in dense}
    zd, zg = zscores(dense), zscores(graph)
    return {c: vector_weight * zd[c] + (1 - vector_weight) * zg[c] for c in dense}
