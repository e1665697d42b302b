"""Merges one document's chunks, mentions and evidence into PostgreSQL inside the caller's
transaction. Entities and relationships live exactly as long as some evidence (a mention, a
piece of relationship evidence) refers to them: reference counting through provenance."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.bulk import BulkInsert, bind, insert_rows
from services.core.db.engine import vector_literal
from services.core.errors import StaleComputeError
from services.core.extraction import Extraction
from services.core.normalize import entity_key
from services.indexer.resolution import (
    Resolution,
    document_surfaces,
    resolve_entities,
    retype_entities,
    with_title,
)

_MENTIONS = BulkInsert(
    "mentions",
    (
        ("entity_id", "bigint"),
        ("chunk_id", "bigint"),
        ("doc_id", "text"),
        ("surface", "text"),
        ("type", "text"),
        ("start_char", "int"),
        ("end_char", "int"),
        ("sentence", "text"),
    ),
    "ON CONFLICT (chunk_id, entity_id, start_char) DO NOTHING",
)
_ALIASES = BulkInsert(
    "aliases",
    (("entity_id", "bigint"), ("alias", "text"), ("alias_key", "text")),
    "ON CONFLICT DO NOTHING",
)
_EVIDENCE = BulkInsert(
    "relationship_evidence",
    (
        ("relationship_id", "bigint"),
        ("chunk_id", "bigint"),
        ("doc_id", "text"),
        ("strength", "float8"),
        ("sentence", "text"),
    ),
)
_CHANGES = BulkInsert(
    "graph_changes",
    (
        ("kind", "text"),
        ("ref_id", "bigint"),
        ("op", "text"),
        ("doc_id", "text"),
        ("event_id", "text"),
    ),
)

# A delete's node changes are also kept in erasures under their change ids, so the communities
# withheld for it are found from the deletes alone (services/core/erasure.py).
_LOG_ERASURE = text(
    f"WITH c AS ({_CHANGES.statement().text} RETURNING id, kind, ref_id)"  # noqa: S608 - constants
    " INSERT INTO erasures (change_id, entity_id) SELECT id, ref_id FROM c WHERE kind = 'node'"
)


@dataclass(frozen=True)
class NewChunk:
    """A chunk the database does not have yet, with its embedding and extraction."""

    ord: int
    diff_hash: str
    text: str
    token_count: int
    start_char: int
    end_char: int
    embedding: Sequence[float]
    extraction: Extraction


@dataclass
class ChangeSet:
    """What one event did to the graph, for graph_changes and for the caller's report."""

    nodes_added: set[int] = field(default_factory=set)
    nodes_removed: set[int] = field(default_factory=set)
    nodes_changed: set[int] = field(default_factory=set)
    edges_added: set[int] = field(default_factory=set)
    edges_removed: set[int] = field(default_factory=set)
    edges_changed: set[int] = field(default_factory=set)
    # Wildcard entities a typed mention narrows (id -> type group), written by rebuild().
    retype: dict[int, str] = field(default_factory=dict)


async def remove_chunks(
    conn: AsyncConnection, chunk_ids: Sequence[int]
) -> tuple[set[int], set[int]]:
    """Delete chunks (their mentions and evidence cascade); return the touched entity and
    relationship ids so their counts, weights and descriptions can be rebuilt."""
    if not chunk_ids:
        return set(), set()
    ids = list(chunk_ids)
    ents = await conn.execute(
        text("SELECT DISTINCT entity_id FROM mentions WHERE chunk_id = ANY(:ids)"), {"ids": ids}
    )
    rels = await conn.execute(
        text(
            "SELECT DISTINCT relationship_id FROM relationship_evidence WHERE chunk_id = ANY(:ids)"
        ),
        {"ids": ids},
    )
    entity_ids = {r[0] for r in ents.all()}
    rel_ids = {r[0] for r in rels.all()}
    await conn.execute(text("DELETE FROM chunks WHERE id = ANY(:ids)"), {"ids": ids})
    return entity_ids, rel_ids


async def reorder_chunks(conn: AsyncConnection, moves: Sequence[tuple[int, int, int, int]]) -> None:
    """Kept chunks (chunk_id, ord, start_char, end_char) may move inside the document; their
    embedding and extraction stay, their position follows the current text."""
    if moves:
        await conn.execute(
            text(
                "UPDATE chunks SET ord = :o, start_char = :s, end_char = :e WHERE id = :i"
                " AND (ord, start_char, end_char) IS DISTINCT FROM (:o, :s, :e)"
            ),
            [{"i": i, "o": o, "s": st, "e": en} for i, o, st, en in moves],
        )


async def add_chunks(
    conn: AsyncConnection,
    *,
    doc_id: str,
    title: str,
    chunks: Sequence[NewChunk],
    resolution: Resolution,
    changes: ChangeSet,
) -> tuple[set[int], set[int]]:
    """Insert new chunks, their mentions and relationship evidence; return touched ids."""
    touched_entities: set[int] = set()
    touched_rels: set[int] = set()
    if not chunks:
        return touched_entities, touched_rels
    inserted = await conn.execute(
        text(
            "INSERT INTO chunks (doc_id, ord, content_hash, text, token_count, start_char,"
            " end_char, embedding) SELECT :d, o, h, t, n, s, e, CAST(v AS vector) FROM unnest("
            " CAST(:o AS int[]), CAST(:h AS text[]), CAST(:t AS text[]), CAST(:n AS int[]),"
            " CAST(:s AS int[]), CAST(:e AS int[]), CAST(:v AS text[])) AS u(o, h, t, n, s, e, v)"
            " RETURNING id, content_hash"
        ),
        {
            "d": doc_id,
            "o": [c.ord for c in chunks],
            "h": [c.diff_hash for c in chunks],
            "t": [c.text for c in chunks],
            "n": [c.token_count for c in chunks],
            "s": [c.start_char for c in chunks],
            "e": [c.end_char for c in chunks],
            "v": [vector_literal(c.embedding) for c in chunks],
        },
    )
    chunk_ids = {str(r.content_hash): int(r.id) for r in inserted.all()}

    mentioned = [e for c in chunks for e in with_title(title, c.extraction).entities]
    surfaces = document_surfaces(mentioned, resolution.canonical)
    resolved = await resolve_entities(conn, surfaces, resolution)
    changes.nodes_added |= resolved.added
    changes.retype.update(resolved.retype)
    ids = resolved.ids

    def entity_id(name: str) -> int | None:
        own = entity_key(name)
        return ids.get(resolution.canonical.get(own, own))

    mention_rows: list[tuple[int, int, str, str, str, int, int, str]] = []
    for c in chunks:
        for ent in with_title(title, c.extraction).entities:
            eid = entity_id(ent.name)
            if eid is None:
                continue
            touched_entities.add(eid)
            mention_rows.append(
                (
                    eid,
                    chunk_ids[c.diff_hash],
                    doc_id,
                    ent.name,
                    ent.type,
                    ent.start,
                    ent.end,
                    ent.sentence,
                )
            )
    # Sorted by entity: concurrent writers take their key-share locks on shared entities (the
    # foreign key checks) and meet each other's aliases in the same order.
    mention_rows.sort(key=lambda r: (r[0], r[1], r[5]))  # stable: duplicates keep their order
    # A document may name nothing at all (no title, no entities).
    await insert_rows(conn, _MENTIONS, mention_rows)
    aliases = {(row[0], row[3]): entity_key(row[3]) for row in mention_rows}
    await insert_rows(conn, _ALIASES, [(e, a, k) for (e, a), k in sorted(aliases.items())])

    # (relationship, chunk) -> (doc, strongest strength, first sentence): one evidence row each.
    edge_rows: dict[tuple[int, int, str], dict[int, tuple[str, float, str]]] = {}
    for c in chunks:
        for rel in c.extraction.relations:
            s, t = entity_id(rel.source), entity_id(rel.target)
            if s is None or t is None or s == t:
                continue
            if rel.type == "co_occurs" and s > t:
                s, t = t, s  # undirected: one row per pair
            per_chunk = edge_rows.setdefault((s, t, rel.type), {})
            chunk = chunk_ids[c.diff_hash]
            kept = per_chunk.get(chunk)
            strength = rel.strength if kept is None else max(kept[1], rel.strength)
            sentence = rel.sentence if kept is None else kept[2]
            per_chunk[chunk] = (doc_id, strength, sentence)
    rel_ids = await _upsert_relationships(conn, sorted(edge_rows), changes)
    evidence = sorted(  # by relationship id, as rebuild() locks them
        (rel_ids[edge], chunk, *row)
        for edge, per_chunk in edge_rows.items()
        for chunk, row in per_chunk.items()
    )
    await insert_rows(conn, _EVIDENCE, evidence)
    touched_rels.update(rel_ids.values())
    return touched_entities, touched_rels


async def rebuild(
    conn: AsyncConnection, entity_ids: Iterable[int], rel_ids: Iterable[int], changes: ChangeSet
) -> None:
    """Recompute weights, counts, names, types and descriptions from the evidence that
    remains; remove what no evidence supports any more. Same rule on insert, update, delete.

    Called once, at the end of the event's transaction: the rows it locks are the shared ones
    (a hub entity appears in many documents), so they are held for as short a time as the
    event allows. Every writer that added or removed evidence of a row rebuilds that row, and
    locks it first, in id order (relationships, then entities): no two writers deadlock here,
    and the aggregates, read by the statements that follow the lock, see the evidence of every
    writer that held the lock before (none of their updates is lost). A row left without
    evidence is deleted unless another writer holds a key-share lock on it: that writer is
    adding evidence to it (a mention, an edge, an alias) and rebuilds it after this commit;
    waiting for it here would deadlock on the lock just taken."""
    rels = sorted(set(rel_ids))
    ents = sorted(set(entity_ids) | changes.retype.keys())
    if rels:
        await conn.execute(_LOCK_RELATIONSHIPS, {"ids": rels})
        gone = await conn.execute(
            text(
                "DELETE FROM relationships WHERE id IN (SELECT r.id FROM relationships r"
                " WHERE r.id = ANY(:ids) AND NOT EXISTS"
                "  (SELECT 1 FROM relationship_evidence v WHERE v.relationship_id = r.id)"
                " ORDER BY r.id FOR UPDATE SKIP LOCKED) RETURNING id"
            ),
            {"ids": rels},
        )
        removed = {r[0] for r in gone.all()}
        changes.edges_removed |= removed - changes.edges_added
        changes.edges_added -= removed
        await conn.execute(
            text(
                "UPDATE relationships r SET weight = s.w, evidence_count = s.n, description = s.x"
                " FROM (SELECT relationship_id, sum(strength) AS w, count(*) AS n,"
                "  left(string_agg(sentence, ' ' ORDER BY doc_id, sentence), 2000) AS x"
                "  FROM relationship_evidence WHERE relationship_id = ANY(:ids)"
                "  GROUP BY relationship_id) s WHERE r.id = s.relationship_id"
            ),
            {"ids": rels},
        )
        changes.edges_changed |= set(rels) - removed - changes.edges_added
    if ents:
        await conn.execute(_LOCK_ENTITIES, {"ids": ents})
        await retype_entities(conn, changes.retype)
        # An entity with no mentions has no evidence left for any of its edges either.
        orphans = await conn.execute(
            text(
                "SELECT e.id FROM entities e WHERE e.id = ANY(:ids) AND NOT EXISTS"
                " (SELECT 1 FROM mentions m WHERE m.entity_id = e.id)"
                " ORDER BY e.id FOR UPDATE OF e SKIP LOCKED"
            ),
            {"ids": ents},
        )
        orphan_ids = sorted(r[0] for r in orphans.all())
        if orphan_ids:
            dangling = await conn.execute(
                text(
                    "DELETE FROM relationships WHERE source_id = ANY(:ids) OR target_id = ANY(:ids)"
                    " RETURNING id"
                ),
                {"ids": orphan_ids},
            )
            dropped = {r[0] for r in dangling.all()}
            changes.edges_removed |= dropped - changes.edges_added
            changes.edges_added -= dropped
            changes.edges_changed -= dropped
            await conn.execute(
                text("DELETE FROM entities WHERE id = ANY(:ids)"), {"ids": orphan_ids}
            )
        removed_nodes = set(orphan_ids)
        changes.nodes_removed |= removed_nodes - changes.nodes_added
        changes.nodes_added -= removed_nodes
        await conn.execute(
            text(
                "UPDATE entities e SET mention_count = s.n, type = s.t, name = s.nm,"
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
            ),
            {"ids": ents},
        )
        # Aliases are the surfaces that still have mentions.
        await conn.execute(
            text(
                "DELETE FROM aliases a WHERE a.entity_id = ANY(:ids) AND NOT EXISTS"
                " (SELECT 1 FROM mentions m WHERE m.entity_id = a.entity_id"
                "  AND m.surface = a.alias)"
            ),
            {"ids": ents},
        )
        changes.nodes_changed |= set(ents) - removed_nodes - changes.nodes_added


async def log_changes(
    conn: AsyncConnection, changes: ChangeSet, doc_id: str, event_id: str, *, erasure: bool = False
) -> int:
    """Append every node/edge added, removed or changed to graph_changes; return the count.
    ``erasure``: the event is a delete, whose node changes also go to erasures."""
    rows = [
        (kind, ref, op, doc_id, event_id)
        for kind, op, refs in (
            ("node", "add", changes.nodes_added),
            ("node", "remove", changes.nodes_removed),
            ("node", "change", changes.nodes_changed),
            ("edge", "add", changes.edges_added),
            ("edge", "remove", changes.edges_removed),
            ("edge", "change", changes.edges_changed),
        )
        for ref in sorted(refs)
    ]
    if erasure and rows:
        await conn.execute(_LOG_ERASURE, bind(_CHANGES, rows))
    else:
        await insert_rows(conn, _CHANGES, rows)
    return len(rows)


_LOCK_RELATIONSHIPS = text(
    "SELECT id FROM relationships WHERE id = ANY(:ids) ORDER BY id FOR NO KEY UPDATE"
)
_LOCK_ENTITIES = text("SELECT id FROM entities WHERE id = ANY(:ids) ORDER BY id FOR NO KEY UPDATE")
_INSERT_RELATIONSHIPS = text(
    "INSERT INTO relationships (source_id, target_id, type)"
    " SELECT s, t, y FROM unnest(CAST(:s AS bigint[]), CAST(:t AS bigint[]),"
    "  CAST(:y AS text[])) AS u(s, t, y) ORDER BY s, t, y"
    " ON CONFLICT (source_id, target_id, type) DO NOTHING"
    " RETURNING id, source_id, target_id, type"
)
# A key-share lock keeps an existing row from being deleted until commit, and conflicts with
# no update: the weight and count updates of other writers go on (rebuild locks them later).
_EXISTING_RELATIONSHIPS = text(
    "SELECT r.id, r.source_id, r.target_id, r.type FROM relationships r"
    " JOIN unnest(CAST(:s AS bigint[]), CAST(:t AS bigint[]), CAST(:y AS text[])) AS u(s, t, y)"
    " ON (r.source_id, r.target_id, r.type) = (u.s, u.t, u.y) ORDER BY r.id FOR KEY SHARE OF r"
)
# Finding an edge and inserting it race only with a writer that inserts it (the insert waits for
# it, then finds it next round) or deletes its last evidence and commits in between.
_UPSERT_ROUNDS = 5


async def _upsert_relationships(
    conn: AsyncConnection, edges: Sequence[tuple[int, int, str]], changes: ChangeSet
) -> dict[tuple[int, int, str], int]:
    """Relationship id per edge, inserting the missing ones. Existing rows are not updated
    here (an update would lock a hub's edges for the rest of the event): they are share-locked
    against deletion, and rebuild() updates them at the end."""
    ids: dict[tuple[int, int, str], int] = {}
    missing = list(edges)
    for _ in range(_UPSERT_ROUNDS):
        ids.update(await _edge_ids(conn, _EXISTING_RELATIONSHIPS, missing))
        missing = [e for e in missing if e not in ids]
        inserted = await _edge_ids(conn, _INSERT_RELATIONSHIPS, missing)
        ids.update(inserted)
        changes.edges_added.update(inserted.values())
        missing = [e for e in missing if e not in ids]
        if not missing:
            return ids
    raise StaleComputeError(f"relationships kept vanishing under a concurrent delete: {missing}")


async def _edge_ids(
    conn: AsyncConnection, statement: TextClause, edges: Sequence[tuple[int, int, str]]
) -> dict[tuple[int, int, str], int]:
    """(source, target, type) -> id of the rows ``statement`` returns for ``edges``."""
    if not edges:
        return {}
    params = {"s": [e[0] for e in edges], "t": [e[1] for e in edges], "y": [e[2] for e in edges]}
    rows = (await conn.execute(statement, params)).all()
    return {(int(r.source_id), int(r.target_id), str(r.type)): int(r.id) for r in rows}
