"""Rebuild the shared rows an event touched from the evidence that remains: weights, counts,
names, types and descriptions; remove what no evidence supports any more. Same rule on insert,
update and delete. Entities and relationships live exactly as long as some evidence (a mention,
a piece of relationship evidence) refers to them: reference counting through provenance.

Called once, at the end of the event's transaction, under the update locks of
graph_store/locks.py (rules 4 and 5)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.bulk import BulkInsert, insert_rows
from services.indexer.graph_store.changes import ChangeSet
from services.indexer.graph_store.entities import retype_entities
from services.indexer.graph_store.locks import (
    lock_entities,
    lock_relationships,
    orphan_entities,
    unsupported_relationships,
)

_RELATIONSHIP_AGGREGATES = text(
    "UPDATE relationships r SET weight = s.w, evidence_count = s.n, description = s.x"
    " FROM (SELECT relationship_id, sum(strength) AS w, count(*) AS n,"
    "  left(string_agg(sentence, ' ' ORDER BY doc_id, sentence), 2000) AS x"
    "  FROM relationship_evidence WHERE relationship_id = ANY(:ids)"
    "  GROUP BY relationship_id) s WHERE r.id = s.relationship_id"
)
_DANGLING = text(
    "DELETE FROM relationships WHERE source_id = ANY(:ids) OR target_id = ANY(:ids) RETURNING id"
)
_DELETE_ENTITIES = text("DELETE FROM entities WHERE id = ANY(:ids)")
# A curation's rename names the entity; else its most used full surface.
_ENTITY_AGGREGATES = text(
    "UPDATE entities e SET mention_count = s.n, type = s.t, name = coalesce((SELECT c.name_b"
    "  FROM curations c WHERE c.key_a = e.key AND c.kind = 'rename' AND c.undone_at IS NULL"
    "  ORDER BY c.id DESC LIMIT 1), s.nm),"
    " description = s.x, updated_at = now()"
    " FROM (SELECT entity_id, count(*) AS n,"
    "  mode() WITHIN GROUP (ORDER BY type) AS t,"
    "  (SELECT m3.surface FROM mentions m3 WHERE m3.entity_id = m.entity_id"
    "   GROUP BY m3.surface ORDER BY (m3.surface LIKE '% %') DESC, count(*) DESC,"
    "   m3.surface LIMIT 1) AS nm,"
    "  (SELECT left(string_agg(q.sentence, ' ' ORDER BY q.doc_id, q.sentence), 1500)"
    "   FROM (SELECT DISTINCT m2.doc_id, m2.sentence FROM mentions m2"
    "         WHERE m2.entity_id = m.entity_id ORDER BY m2.doc_id, m2.sentence"
    "         LIMIT 5) q) AS x"
    "  FROM mentions m WHERE m.entity_id = ANY(:ids) GROUP BY m.entity_id) s"
    " WHERE e.id = s.entity_id"
)
# Aliases are the surfaces that still have mentions. Both statements run under the entities'
# update locks: an alias written before them could be found present by this event, then deleted
# by another that took the lock first and could not see this event's uncommitted mention.
_ALIASES = BulkInsert(
    "aliases",
    (("entity_id", "bigint"), ("alias", "text"), ("alias_key", "text")),
    "ON CONFLICT DO NOTHING",
)
_STALE_ALIASES = text(
    "DELETE FROM aliases a WHERE a.entity_id = ANY(:ids) AND NOT EXISTS"
    " (SELECT 1 FROM mentions m WHERE m.entity_id = a.entity_id"
    "  AND m.surface = a.alias)"
)


async def rebuild(
    conn: AsyncConnection,
    entity_ids: Iterable[int],
    rel_ids: Iterable[int],
    changes: ChangeSet,
    *,
    removed_evidence: bool,
    aliases: Sequence[tuple[int, str, str]] = (),
) -> None:
    """Rebuild ``rel_ids`` and ``entity_ids`` (and the entities ``changes`` retypes) from their
    evidence, recording what changed in ``changes``; write ``aliases`` (entity_id, alias,
    alias_key: the surfaces of the event's new mentions, whose entities are among
    ``entity_ids``). ``removed_evidence``: the event deleted
    chunks. One that did not only added evidence, to every row it touched (each entity it
    resolved to got a mention, each relationship a piece of evidence), so no row of it can be
    left without evidence and the statements that look for such rows are skipped."""
    rels = sorted(set(rel_ids))
    ents = sorted(set(entity_ids) | changes.retype.keys())
    if rels:
        await lock_relationships(conn, rels)
        removed = await unsupported_relationships(conn, rels) if removed_evidence else set()
        changes.edges_removed |= removed - changes.edges_added
        changes.edges_added -= removed
        await conn.execute(_RELATIONSHIP_AGGREGATES, {"ids": rels})
        changes.edges_changed |= set(rels) - removed - changes.edges_added
    if ents:
        await lock_entities(conn, ents)
        await retype_entities(conn, changes.retype)
        # An entity with no mentions has no evidence left for any of its edges either.
        orphan_ids = await orphan_entities(conn, ents) if removed_evidence else []
        if orphan_ids:
            dangling = await conn.execute(_DANGLING, {"ids": orphan_ids})
            dropped = {r[0] for r in dangling.all()}
            changes.edges_removed |= dropped - changes.edges_added
            changes.edges_added -= dropped
            changes.edges_changed -= dropped
            await conn.execute(_DELETE_ENTITIES, {"ids": orphan_ids})
        removed_nodes = set(orphan_ids)
        changes.nodes_removed |= removed_nodes - changes.nodes_added
        changes.nodes_added -= removed_nodes
        await conn.execute(_ENTITY_AGGREGATES, {"ids": ents})
        if removed_evidence:
            await conn.execute(_STALE_ALIASES, {"ids": ents})
        await insert_rows(conn, _ALIASES, aliases)
        changes.nodes_changed |= set(ents) - removed_nodes - changes.nodes_added
