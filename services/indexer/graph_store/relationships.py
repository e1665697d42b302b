"""Relationships and their evidence from the new chunks of a document: one evidence row per
(relationship, chunk), the relationship row found or created. Locks follow graph_store/locks.py
(rule 3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.bulk import BulkInsert, insert_rows
from services.core.errors import StaleComputeError
from services.core.extraction import ExtractedRelation
from services.indexer.graph_store.changes import ChangeSet
from services.indexer.graph_store.locks import EXISTING_RELATIONSHIPS
from services.indexer.provided import EXTRACTED, PUBLISHER

Edge = tuple[int, int, str]  # (source entity, target entity, type)

_EVIDENCE = BulkInsert(
    "relationship_evidence",
    (
        ("relationship_id", "bigint"),
        ("chunk_id", "bigint"),
        ("doc_id", "text"),
        ("strength", "float8"),
        ("sentence", "text"),
        ("origin", "text"),
    ),
)
_INSERT = text(
    "INSERT INTO relationships (source_id, target_id, type)"
    " SELECT s, t, y FROM unnest(CAST(:s AS bigint[]), CAST(:t AS bigint[]),"
    "  CAST(:y AS text[])) AS u(s, t, y) ORDER BY s, t, y"
    " ON CONFLICT (source_id, target_id, type) DO NOTHING"
    " RETURNING id, source_id, target_id, type"
)
# Finding an edge and inserting it race only with a writer that inserts it (the insert waits for
# it, then finds it next round) or deletes its last evidence and commits in between.
_UPSERT_ROUNDS = 5


async def add_relationships(
    conn: AsyncConnection,
    *,
    doc_id: str,
    relations: Sequence[tuple[str, ExtractedRelation]],
    entity_ids: Mapping[str, int],
    chunk_ids: Mapping[str, int],
    changes: ChangeSet,
    provided: Sequence[tuple[str, ExtractedRelation]] = (),
) -> set[int]:
    """Insert the evidence of every relation (diff hash of its chunk, the relation with its ends
    as surface keys) whose ends resolved to two entities; return the relationships it
    supports. ``relations`` were extracted, ``provided`` come from the publisher (services/
    indexer/provided.py); one call takes both, so every relationship is locked in one sorted
    order (graph_store/locks.py)."""
    # (relationship, chunk, origin) -> (doc, strongest strength, first sentence): one row each.
    edge_rows: dict[Edge, dict[tuple[int, str], tuple[str, float, str]]] = {}
    labelled = [(h, r, EXTRACTED) for h, r in relations] + [(h, r, PUBLISHER) for h, r in provided]
    for chunk_hash, rel, origin in labelled:
        s, t = entity_ids.get(rel.source), entity_ids.get(rel.target)
        if s is None or t is None or s == t:
            continue
        if rel.type == "co_occurs" and s > t:
            s, t = t, s  # undirected: one row per pair
        per_chunk = edge_rows.setdefault((s, t, rel.type), {})
        where = (chunk_ids[chunk_hash], origin)
        kept = per_chunk.get(where)
        strength = rel.strength if kept is None else max(kept[1], rel.strength)
        sentence = rel.sentence if kept is None else kept[2]
        per_chunk[where] = (doc_id, strength, sentence)
    rel_ids = await _upsert_relationships(conn, sorted(edge_rows), changes)
    evidence = sorted(  # by relationship id (graph_store/locks.py, rule 3)
        (rel_ids[edge], chunk, doc, strength, sentence, origin)
        for edge, per_chunk in edge_rows.items()
        for (chunk, origin), (doc, strength, sentence) in per_chunk.items()
    )
    await insert_rows(conn, _EVIDENCE, evidence)
    return set(rel_ids.values())


async def _upsert_relationships(
    conn: AsyncConnection, edges: Sequence[Edge], changes: ChangeSet
) -> dict[Edge, int]:
    """Relationship id per edge, inserting the missing ones. Existing rows are not updated
    here (an update would lock a hub's edges for the rest of the event): they are share-locked
    against deletion, and rebuild updates them at the end."""
    ids: dict[Edge, int] = {}
    missing = list(edges)
    for _ in range(_UPSERT_ROUNDS):
        ids.update(await _edge_ids(conn, EXISTING_RELATIONSHIPS, missing))
        missing = [e for e in missing if e not in ids]
        inserted = await _edge_ids(conn, _INSERT, missing)
        ids.update(inserted)
        changes.edges_added.update(inserted.values())
        missing = [e for e in missing if e not in ids]
        if not missing:
            return ids
    raise StaleComputeError(f"relationships kept vanishing under a concurrent delete: {missing}")


async def _edge_ids(
    conn: AsyncConnection, statement: TextClause, edges: Sequence[Edge]
) -> dict[Edge, int]:
    """(source, target, type) -> id of the rows ``statement`` returns for ``edges``."""
    if not edges:
        return {}
    params = {"s": [e[0] for e in edges], "t": [e[1] for e in edges], "y": [e[2] for e in edges]}
    rows = (await conn.execute(statement, params)).all()
    return {(int(r.source_id), int(r.target_id), str(r.type)): int(r.id) for r in rows}
