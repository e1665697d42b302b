"""Entity look-ups for the API: search by name (exact key or alias first, then trigram
similarity of names and aliases) and one entity with its strongest neighbours."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.normalize import entity_key
from services.retrieval.schemas import EntityDetail, EntitySummary, Neighbour
from services.retrieval.visibility import (
    DOC_VISIBLE,
    EntityFacts,
    Filtered,
    alias_visible,
    ends_visible,
    entity_facts,
    visible_evidence,
)


def _search_admin(fuzzy: bool) -> str:
    """The operator's search: exact key or alias, then (``fuzzy``) trigram similarity of names
    and aliases."""
    similar = (
        "  UNION ALL SELECT e.id, similarity(e.name, :name) FROM entities e WHERE e.name % :name"
        "  UNION ALL SELECT a.entity_id, similarity(a.alias, :name) FROM aliases a"
        "   WHERE a.alias % :name"
    )
    return (
        "WITH hits AS ("  # noqa: S608 - the fragments are constants
        "  SELECT e.id, 1.0 AS score FROM entities e WHERE e.key = :key"
        "  UNION ALL SELECT a.entity_id, 1.0 FROM aliases a WHERE a.alias_key = :key"
        + (similar if fuzzy else "")
        + "),"
        " best AS (SELECT id, max(score) AS score FROM hits GROUP BY id)"
        " SELECT e.id, e.name, e.type, e.mention_count, b.score,"
        "  coalesce((SELECT array_agg(a.alias ORDER BY a.alias) FROM aliases a"
        "   WHERE a.entity_id = e.id), '{}') AS aliases"
        " FROM best b JOIN entities e ON e.id = b.id"
        " ORDER BY b.score DESC, e.mention_count DESC, e.id LIMIT :n"
    )


def _search_restricted(fuzzy: bool) -> str:
    """A restricted caller finds entities by the surfaces of their visible mentions only,
    ranked by visible mentions; names, counts and aliases then come from entity_facts."""
    similar = (
        "  UNION ALL SELECT a.entity_id, similarity(a.alias, :name) FROM aliases a"  # noqa: S608 - visibility fragments are constants
        "   WHERE a.alias % :name AND " + alias_visible("a")
    )
    return (
        "WITH hits AS ("  # noqa: S608 - visibility fragments are constants
        "  SELECT a.entity_id AS id, 1.0 AS score FROM aliases a WHERE a.alias_key = :key AND "
        + alias_visible("a")
        + (similar if fuzzy else "")
        + "),"
        " best AS (SELECT id, max(score) AS score FROM hits GROUP BY id)"
        " SELECT b.id, b.score FROM best b CROSS JOIN LATERAL (SELECT count(*) AS n FROM"
        "  mentions vm JOIN documents d ON d.doc_id = vm.doc_id WHERE vm.entity_id = b.id AND "
        + DOC_VISIBLE
        + ") c ORDER BY b.score DESC, c.n DESC, b.id LIMIT :n"
    )


# by name or alias, then similar names (fuzzy: True), or exact names and aliases only
_SEARCH = {
    fuzzy: Filtered.of(_search_admin(fuzzy), _search_restricted(fuzzy)) for fuzzy in (True, False)
}
_OTHER = "CASE WHEN r.source_id = :id THEN r.target_id ELSE r.source_id END"
_NEIGHBOURS_ADMIN = (
    "SELECT CASE WHEN r.source_id = :id THEN r.target_id ELSE r.source_id END AS other,"
    " n.name, r.type, CASE WHEN r.source_id = :id THEN 'out' ELSE 'in' END, r.weight,"
    " coalesce((SELECT ev.sentence FROM relationship_evidence ev WHERE ev.relationship_id = r.id"
    "  ORDER BY ev.strength DESC, ev.id LIMIT 1), '')"
    " FROM relationships r JOIN entities n"
    "  ON n.id = CASE WHEN r.source_id = :id THEN r.target_id ELSE r.source_id END"
    " WHERE r.source_id = :id OR r.target_id = :id"
    " ORDER BY r.weight DESC, r.id LIMIT :n"
)
# Restricted: visible relationships, weight and best sentence from visible evidence; the
# neighbour's name ('' here) is filled in from entity_facts.
_NEIGHBOURS = Filtered.of(
    _NEIGHBOURS_ADMIN,
    "SELECT " + _OTHER + " AS other, '', r.type,"  # noqa: S608 - _OTHER and visibility fragments are constants
    " CASE WHEN r.source_id = :id THEN 'out' ELSE 'in' END, v.w,"
    " coalesce((SELECT ev.sentence FROM relationship_evidence ev JOIN documents d"
    "  ON d.doc_id = ev.doc_id WHERE ev.relationship_id = r.id AND "
    + DOC_VISIBLE
    + "  ORDER BY ev.strength DESC, ev.id LIMIT 1), '')"
    " FROM relationships r CROSS JOIN LATERAL "
    + visible_evidence("r.id")
    + " v WHERE (r.source_id = :id OR r.target_id = :id) AND v.n > 0 AND "
    + ends_visible("r.source_id", "r.target_id")
    + " ORDER BY v.w DESC, r.id LIMIT :n",
)


async def search_entities(
    conn: AsyncConnection, name: str, limit: int, *, caller: Caller, exact: bool = False
) -> list[EntitySummary]:
    """Entities the caller can see whose name or alias matches ``name``, best match first:
    the name or an alias itself (score 1), then similar names, unless ``exact``."""
    values = {"key": entity_key(name), "name": name, "n": limit}
    rows = (await conn.execute(*_SEARCH[not exact].bind(caller, values))).all()
    if caller.unfiltered:
        return [
            EntitySummary(
                id=int(r[0]),
                name=str(r[1]),
                type=str(r[2]),
                mentions=int(r[3]),
                score=round(float(r[4]), 4),
                aliases=list(r[5]),
            )
            for r in rows
        ]
    facts = await entity_facts(conn, caller, [int(r[0]) for r in rows])
    return [_summary(int(r[0]), facts[int(r[0])], float(r[1])) for r in rows if int(r[0]) in facts]


def _summary(entity_id: int, facts: EntityFacts, score: float) -> EntitySummary:
    return EntitySummary(
        id=entity_id,
        name=facts.name,
        type=facts.type,
        mentions=facts.mentions,
        score=round(score, 4),
        aliases=facts.aliases,
    )


async def entity_detail(
    conn: AsyncConnection, entity_id: int, neighbours: int, *, caller: Caller
) -> EntityDetail | None:
    """The entity with its strongest relationships, or None when it does not exist or the
    caller cannot see it (so existence does not leak)."""
    facts = (await entity_facts(conn, caller, [entity_id])).get(entity_id)
    if facts is None:
        return None
    rows = (await conn.execute(*_NEIGHBOURS.bind(caller, {"id": entity_id, "n": neighbours}))).all()
    label = {int(r[0]): str(r[1]) for r in rows}
    if not caller.unfiltered:
        others = await entity_facts(conn, caller, list(label))
        label = {e: f.name for e, f in others.items()}
    return EntityDetail(
        **_summary(entity_id, facts, 1.0).model_dump(),
        description=facts.description,
        neighbours=[
            Neighbour(
                id=int(r[0]),
                name=label[int(r[0])],
                relation=str(r[2]),
                direction="out" if r[3] == "out" else "in",
                weight=float(r[4]),
                evidence=str(r[5]),
            )
            for r in rows
            if int(r[0]) in label
        ],
    )
