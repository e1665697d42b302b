"""What the graph explorer (issue 34, /explorer) draws, under the caller's visibility
(docs/access-control.md, by the same predicates as every other read): an entity's
neighbourhood (nodes and the relationships among them, capped, with what was cut), one
relationship's evidence, and an entity's mentions with their sentences and documents.

The neighbourhood, for ``hops`` 1 or 2 and a cap of ``limit`` nodes (the entity included):
1. the entity's neighbours, strongest relationship first (weight, then id), up to the cap;
   how many were not shown is counted (``cut``);
2. with two hops, each shown neighbour's own strongest neighbours, ``SECOND_HOP_EACH`` each
   at most, until the cap;
3. the relationships among the shown nodes, at most ``EDGES_PER_NODE`` per node in all: first,
   for each shown node, the strongest relationship to the node that reached it (so none is
   drawn alone), then the others, strongest first.

A restricted caller's weights are those of its visible evidence, a co-occurrence is weak on
the evidence it sees, and names, types and mention counts are rebuilt from visible mentions
(visibility.entity_kinds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.extraction import CO_OCCURS
from services.retrieval.schemas import (
    ExploreEdge,
    ExploreNode,
    MentionRow,
    Neighbourhood,
    RelationshipDetail,
    SaidEvidence,
)
from services.retrieval.visibility import (
    DOC_VISIBLE,
    EntityFacts,
    Filtered,
    entity_kinds,
    entity_visible,
    visible_evidence,
)

MAX_NODES = 500  # the most a neighbourhood draws (a page stays readable at a few hundred)
SECOND_HOP_EACH = 8  # second-hop neighbours drawn per first-hop neighbour, at most
EDGES_PER_NODE = 4  # relationships among the shown nodes: this many per node in all
EVIDENCE_ROWS = 20  # sentences a relationship's evidence lists, strongest first


def _ways(here: str, visible: bool) -> str:
    """(other, weight) of every relationship of the entity ``here`` (a column or parameter),
    both ways; a restricted caller's: visible evidence, the other end visible."""
    parts = []
    for mine, theirs in (("source_id", "target_id"), ("target_id", "source_id")):
        if visible:
            parts.append(
                f"SELECT r.{theirs} AS other, v.w AS w FROM relationships r CROSS JOIN LATERAL "  # noqa: S608 - constants
                + visible_evidence("r.id")
                + f" v WHERE r.{mine} = {here} AND v.n > 0 AND "
                + entity_visible(f"r.{theirs}")
            )
        else:
            parts.append(
                f"SELECT r.{theirs} AS other, r.weight AS w FROM relationships r"  # noqa: S608 - constants
                f" WHERE r.{mine} = {here}"
            )
    return " UNION ALL ".join(parts)


def _first(visible: bool) -> str:
    return (
        f"SELECT other, max(w), count(*) OVER () FROM ({_ways(':id', visible)}) t"  # noqa: S608 - constants
        " WHERE other <> :id GROUP BY other ORDER BY 2 DESC, 1 LIMIT :n"
    )


def _second(visible: bool) -> str:
    return (
        "SELECT f.id, x.other FROM unnest(CAST(:f AS bigint[])) WITH ORDINALITY f(id, ord)"  # noqa: S608 - constants
        f" CROSS JOIN LATERAL (SELECT other, max(w) AS w FROM ({_ways('f.id', visible)}) t"
        " WHERE other <> f.id AND other <> ALL(CAST(:seen AS bigint[])) GROUP BY other"
        " ORDER BY 2 DESC, 1 LIMIT :per) x ORDER BY f.ord, x.w DESC, x.other"
    )


def _edges(visible: bool, cond: str, tail: str) -> str:
    """(id, source, target, type, weight, weak) of the relationships ``r`` where ``cond``,
    strongest first, then ``tail``; a restricted caller's weight and weakness are those of its
    visible evidence, and a relationship without any is not one."""
    if not visible:
        return (
            "SELECT r.id, r.source_id, r.target_id, r.type, r.weight, r.weak"  # noqa: S608 - constants
            f" FROM relationships r WHERE {cond} ORDER BY r.weight DESC, r.id{tail}"
        )
    return (
        "SELECT r.id, r.source_id, r.target_id, r.type, v.w,"  # noqa: S608 - constants
        f" r.type = '{CO_OCCURS}' AND v.n <= 1 FROM relationships r CROSS JOIN LATERAL "
        + visible_evidence("r.id")
        + f" v WHERE v.n > 0 AND {cond} ORDER BY v.w DESC, r.id{tail}"
    )


# The strongest relationship between a drawn entity and the one that reached it (pairs :a,
# :b): drawn first, so that no drawn entity is drawn alone.
_PAIRED = "((r.source_id = p.a AND r.target_id = p.b) OR (r.source_id = p.b AND r.target_id = p.a))"


def _tree(visible: bool) -> str:
    return (
        "SELECT q.* FROM unnest(CAST(:a AS bigint[]), CAST(:b AS bigint[])) p(a, b)"  # noqa: S608 - constants
        f" CROSS JOIN LATERAL ({_edges(visible, _PAIRED, ' LIMIT 1')}) q"
    )


_FIRST = Filtered.of(_first(False), _first(True))
_SECOND = Filtered.of(_second(False), _second(True))
_TREE = Filtered.of(_tree(False), _tree(True))
# The other relationships among the drawn entities, strongest first, up to :m.
_OTHERS = "r.source_id = ANY(:n) AND r.target_id = ANY(:n) AND r.id <> ALL(CAST(:t AS bigint[]))"
_AMONG = Filtered.of(_edges(False, _OTHERS, " LIMIT :m"), _edges(True, _OTHERS, " LIMIT :m"))
_RELATIONSHIP = Filtered.of(
    "SELECT r.id, r.source_id, r.target_id, r.type, r.weight, r.weak FROM relationships r"
    " WHERE r.id = :r",
    "SELECT r.id, r.source_id, r.target_id, r.type, v.w,"  # noqa: S608 - constants
    f" r.type = '{CO_OCCURS}' AND v.n <= 1 FROM relationships r CROSS JOIN LATERAL "
    + visible_evidence("r.id")
    + " v WHERE r.id = :r AND v.n > 0",
)
_EVIDENCE = Filtered.of(
    "SELECT ev.doc_id, ev.sentence, ev.strength FROM relationship_evidence ev"
    " WHERE ev.relationship_id = :r ORDER BY ev.strength DESC, ev.id LIMIT :n",
    "SELECT ev.doc_id, ev.sentence, ev.strength FROM relationship_evidence ev"  # noqa: S608 - constants
    " JOIN documents d ON d.doc_id = ev.doc_id WHERE ev.relationship_id = :r AND "
    + DOC_VISIBLE
    + " ORDER BY ev.strength DESC, ev.id LIMIT :n",
)
_MENTIONS = Filtered.of(
    "SELECT m.doc_id, m.surface, m.sentence FROM mentions m WHERE m.entity_id = :e"
    " ORDER BY m.doc_id, m.id LIMIT :n",
    "SELECT m.doc_id, m.surface, m.sentence FROM mentions m"  # noqa: S608 - constants
    " JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = :e AND "
    + DOC_VISIBLE
    + " ORDER BY m.doc_id, m.id LIMIT :n",
)


async def neighbourhood(
    conn: AsyncConnection, entity_id: int, hops: int, limit: int, *, caller: Caller
) -> Neighbourhood | None:
    """The entity's neighbourhood as the caller sees it (module docstring); None when the
    caller cannot see the entity (so existence does not leak)."""
    limit = max(2, min(limit, MAX_NODES))
    kinds = await entity_kinds(conn, caller, [entity_id])
    if entity_id not in kinds:
        return None
    values = {"id": entity_id, "n": limit - 1}  # the entity itself is one of the drawn
    rows = (await conn.execute(*_FIRST.bind(caller, values))).all()
    first = [int(r[0]) for r in rows]
    total = int(rows[0][2]) if rows else 0
    hop_of = {entity_id: 0} | dict.fromkeys(first, 1)
    reached_from = dict.fromkeys(first, entity_id)  # who reached each drawn entity
    notes = []
    if total > len(first):
        notes.append(f"{total - len(first)} of {total} neighbours not shown (cap {limit})")
    if hops >= 2 and first and len(hop_of) < limit:
        second = {"f": first, "seen": list(hop_of), "per": SECOND_HOP_EACH}
        found = (await conn.execute(*_SECOND.bind(caller, second))).all()
        for near, other in found:
            if int(other) in hop_of:
                continue
            if len(hop_of) >= limit:
                notes.append(f"second hop cut at the cap ({limit} nodes)")
                break
            hop_of[int(other)] = 2
            reached_from[int(other)] = int(near)
        if any(n >= SECOND_HOP_EACH for n in Counter(int(near) for near, _ in found).values()):
            notes.append(f"second hop: at most {SECOND_HOP_EACH} neighbours of each neighbour")
    kinds |= await entity_kinds(conn, caller, [e for e in hop_of if e not in kinds])
    shown = [e for e in hop_of if e in kinds]
    pairs = [(reached_from[e], e) for e in shown if e in reached_from]
    tree = {"a": [a for a, _ in pairs], "b": [b for _, b in pairs]}
    drawn = list((await conn.execute(*_TREE.bind(caller, tree))).all())
    others: dict[str, object] = {
        "n": shown,
        "t": [int(r[0]) for r in drawn],
        "m": max(0, EDGES_PER_NODE * len(shown) - len(drawn)),
    }
    drawn += (await conn.execute(*_AMONG.bind(caller, others))).all()
    edges = [
        ExploreEdge(
            id=int(r[0]),
            source=int(r[1]),
            target=int(r[2]),
            type=str(r[3]),
            weight=round(float(r[4]), 4),
            weak=bool(r[5]),
        )
        for r in drawn
    ]
    return Neighbourhood(
        center=_node(entity_id, kinds[entity_id], 0),
        nodes=[_node(e, kinds[e], hop_of[e]) for e in shown],
        edges=edges,
        neighbours=total,
        notes=notes,
    )


def _node(entity_id: int, facts: EntityFacts, hops: int) -> ExploreNode:
    return ExploreNode(
        id=entity_id, name=facts.name, type=facts.type, mentions=facts.mentions, hops=hops
    )


async def relationship_detail(
    conn: AsyncConnection, relationship_id: int, *, caller: Caller
) -> RelationshipDetail | None:
    """One relationship with its strongest evidence sentences, as the caller sees it; None
    when it has no visible evidence or an end the caller cannot see."""
    row = (await conn.execute(*_RELATIONSHIP.bind(caller, {"r": relationship_id}))).first()
    if row is None:
        return None
    ends = await entity_kinds(conn, caller, [int(row[1]), int(row[2])])
    if int(row[1]) not in ends or int(row[2]) not in ends:
        return None
    said = await conn.execute(*_EVIDENCE.bind(caller, {"r": relationship_id, "n": EVIDENCE_ROWS}))
    return RelationshipDetail(
        id=int(row[0]),
        source=_node(int(row[1]), ends[int(row[1])], 0),
        target=_node(int(row[2]), ends[int(row[2])], 0),
        type=str(row[3]),
        weight=round(float(row[4]), 4),
        weak=bool(row[5]),
        evidence=[
            SaidEvidence(doc_id=str(d), sentence=str(s), strength=round(float(w), 4))
            for d, s, w in said.all()
        ],
    )


async def entity_mentions(
    conn: AsyncConnection, entity_id: int, limit: int, *, caller: Caller
) -> Sequence[MentionRow]:
    """The entity's mentions the caller can see, by document: the surface and its sentence."""
    rows = await conn.execute(*_MENTIONS.bind(caller, {"e": entity_id, "n": limit}))
    return [MentionRow(doc_id=str(d), surface=str(s), sentence=str(t)) for d, s, t in rows.all()]
