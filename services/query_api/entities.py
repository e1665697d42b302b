"""Entity look-ups for the API: search by name (exact key or alias first, then trigram
similarity of names and aliases) and one entity with its strongest neighbours."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.normalize import entity_key
from services.query_api.schemas import EntityDetail, EntitySummary, Neighbour

_SEARCH = text(
    "WITH hits AS ("
    "  SELECT e.id, 1.0 AS score FROM entities e WHERE e.key = :key"
    "  UNION ALL SELECT a.entity_id, 1.0 FROM aliases a WHERE a.alias_key = :key"
    "  UNION ALL SELECT e.id, similarity(e.name, :name) FROM entities e WHERE e.name % :name"
    "  UNION ALL SELECT a.entity_id, similarity(a.alias, :name) FROM aliases a"
    "   WHERE a.alias % :name),"
    " best AS (SELECT id, max(score) AS score FROM hits GROUP BY id)"
    " SELECT e.id, e.name, e.type, e.mention_count, b.score,"
    "  coalesce((SELECT array_agg(a.alias ORDER BY a.alias) FROM aliases a"
    "   WHERE a.entity_id = e.id), '{}') AS aliases"
    " FROM best b JOIN entities e ON e.id = b.id"
    " ORDER BY b.score DESC, e.mention_count DESC, e.id LIMIT :n"
)
_ONE = text(
    "SELECT e.id, e.name, e.type, e.mention_count, e.description,"
    " coalesce((SELECT array_agg(a.alias ORDER BY a.alias) FROM aliases a"
    "  WHERE a.entity_id = e.id), '{}') FROM entities e WHERE e.id = :id"
)
_NEIGHBOURS = text(
    "SELECT CASE WHEN r.source_id = :id THEN r.target_id ELSE r.source_id END AS other,"
    " n.name, r.type, CASE WHEN r.source_id = :id THEN 'out' ELSE 'in' END, r.weight,"
    " coalesce((SELECT ev.sentence FROM relationship_evidence ev WHERE ev.relationship_id = r.id"
    "  ORDER BY ev.strength DESC, ev.id LIMIT 1), '')"
    " FROM relationships r JOIN entities n"
    "  ON n.id = CASE WHEN r.source_id = :id THEN r.target_id ELSE r.source_id END"
    " WHERE r.source_id = :id OR r.target_id = :id"
    " ORDER BY r.weight DESC, r.id LIMIT :n"
)


async def search_entities(conn: AsyncConnection, name: str, limit: int) -> list[EntitySummary]:
    """Entities whose name or alias matches ``name``, best match first."""
    rows = await conn.execute(_SEARCH, {"key": entity_key(name), "name": name, "n": limit})
    return [
        EntitySummary(
            id=int(r[0]),
            name=str(r[1]),
            type=str(r[2]),
            mentions=int(r[3]),
            score=round(float(r[4]), 4),
            aliases=list(r[5]),
        )
        for r in rows.all()
    ]


async def entity_detail(
    conn: AsyncConnection, entity_id: int, neighbours: int
) -> EntityDetail | None:
    """The entity with its strongest relationships, or None when it does not exist."""
    row = (await conn.execute(_ONE, {"id": entity_id})).first()
    if row is None:
        return None
    rows = await conn.execute(_NEIGHBOURS, {"id": entity_id, "n": neighbours})
    return EntityDetail(
        id=int(row[0]),
        name=str(row[1]),
        type=str(row[2]),
        mentions=int(row[3]),
        description=str(row[4]),
        aliases=list(row[5]),
        score=1.0,
        neighbours=[
            Neighbour(
                id=int(r[0]),
                name=str(r[1]),
                relation=str(r[2]),
                direction="out" if r[3] == "out" else "in",
                weight=float(r[4]),
                evidence=str(r[5]),
            )
            for r in rows.all()
        ],
    )
