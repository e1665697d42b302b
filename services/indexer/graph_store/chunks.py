"""A document's own rows: its chunks (inserted, moved, removed) and the mentions of its new
chunks, with the aliases they support (written by graph_store/rebuild.py under the entities'
update locks). Mentions and relationship evidence cascade with their chunk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.bulk import BulkInsert, insert_rows
from services.core.db.engine import vector_literal
from services.core.extraction import StatedTime
from services.indexer.write_plan import MentionRow, NewChunk

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
        ("origin", "text"),
    ),
    "ON CONFLICT (chunk_id, entity_id, start_char) DO NOTHING",
)
# alembic 0023: when the facts of a sentence held.
_TIMES = BulkInsert(
    "fact_times",
    (
        ("chunk_id", "bigint"),
        ("doc_id", "text"),
        ("sentence", "text"),
        ("valid_from", "date"),
        ("valid_to", "date"),
        ("expression", "text"),
    ),
)
_TOUCHED_ENTITIES = text("SELECT DISTINCT entity_id FROM mentions WHERE chunk_id = ANY(:ids)")
_TOUCHED_RELATIONSHIPS = text(
    "SELECT DISTINCT relationship_id FROM relationship_evidence WHERE chunk_id = ANY(:ids)"
)
_DELETE = text("DELETE FROM chunks WHERE id = ANY(:ids)")
_CLEAR_MENTIONS = text("DELETE FROM mentions WHERE chunk_id = ANY(:ids)")
_CLEAR_EVIDENCE = text("DELETE FROM relationship_evidence WHERE chunk_id = ANY(:ids)")
_CLEAR_TIMES = text("DELETE FROM fact_times WHERE chunk_id = ANY(:ids)")
_MOVE = text(
    "UPDATE chunks SET ord = :o, start_char = :s, end_char = :e WHERE id = :i"
    " AND (ord, start_char, end_char) IS DISTINCT FROM (:o, :s, :e)"
)
_INSERT = text(
    "INSERT INTO chunks (doc_id, ord, content_hash, text, token_count, start_char,"
    " end_char, embedding, born_at) SELECT :d, o, h, t, n, s, e, CAST(v AS vector), :born"
    " FROM unnest("
    " CAST(:o AS int[]), CAST(:h AS text[]), CAST(:t AS text[]), CAST(:n AS int[]),"
    " CAST(:s AS int[]), CAST(:e AS int[]), CAST(:v AS text[])) AS u(o, h, t, n, s, e, v)"
    " RETURNING id, content_hash"
)


async def remove_chunks(
    conn: AsyncConnection, chunk_ids: Sequence[int]
) -> tuple[set[int], set[int]]:
    """Delete chunks (their mentions and evidence cascade); return the touched entity and
    relationship ids so their counts, weights and descriptions can be rebuilt."""
    if not chunk_ids:
        return set(), set()
    ids = list(chunk_ids)
    ents = await conn.execute(_TOUCHED_ENTITIES, {"ids": ids})
    rels = await conn.execute(_TOUCHED_RELATIONSHIPS, {"ids": ids})
    entity_ids = {r[0] for r in ents.all()}
    rel_ids = {r[0] for r in rels.all()}
    await conn.execute(_DELETE, {"ids": ids})
    return entity_ids, rel_ids


async def clear_extraction(
    conn: AsyncConnection, chunk_ids: Sequence[int]
) -> tuple[set[int], set[int]]:
    """Delete the chunks' mentions, relationship evidence and fact times, keeping the chunks
    (a document resolved again under new curations); return the touched entity and
    relationship ids."""
    if not chunk_ids:
        return set(), set()
    ids = list(chunk_ids)
    ents = await conn.execute(_TOUCHED_ENTITIES, {"ids": ids})
    rels = await conn.execute(_TOUCHED_RELATIONSHIPS, {"ids": ids})
    await conn.execute(_CLEAR_MENTIONS, {"ids": ids})
    await conn.execute(_CLEAR_EVIDENCE, {"ids": ids})
    await conn.execute(_CLEAR_TIMES, {"ids": ids})
    return {r[0] for r in ents.all()}, {r[0] for r in rels.all()}


async def move_chunks(conn: AsyncConnection, moves: Sequence[tuple[int, int, int, int]]) -> None:
    """Kept chunks (chunk_id, ord, start_char, end_char) may move inside the document; their
    embedding and extraction stay, their position follows the current text."""
    if moves:
        await conn.execute(_MOVE, [{"i": i, "o": o, "s": st, "e": en} for i, o, st, en in moves])


async def insert_chunks(
    conn: AsyncConnection, doc_id: str, chunks: Sequence[NewChunk], born_at: datetime
) -> dict[str, int]:
    """Insert new chunks, brought in by the version of ``born_at`` (its occurred_at: as_of
    reads, alembic 0025); return chunk id per diff hash."""
    if not chunks:
        return {}
    inserted = await conn.execute(
        _INSERT,
        {
            "d": doc_id,
            "born": born_at,
            "o": [c.ord for c in chunks],
            "h": [c.diff_hash for c in chunks],
            "t": [c.text for c in chunks],
            "n": [c.token_count for c in chunks],
            "s": [c.start_char for c in chunks],
            "e": [c.end_char for c in chunks],
            "v": [vector_literal(c.embedding) for c in chunks],
        },
    )
    return {str(r.content_hash): int(r.id) for r in inserted.all()}


AliasRow = tuple[int, str, str]  # (entity_id, alias, alias_key)


async def insert_mentions(
    conn: AsyncConnection,
    doc_id: str,
    mentions: Sequence[MentionRow],
    entity_ids: Mapping[str, int],
    chunk_ids: Mapping[str, int],
) -> tuple[set[int], list[AliasRow]]:
    """Insert the mentions whose surface resolved to an entity; return the entities they name
    and their surfaces as aliases, in entity order (for ``rebuild`` to write)."""
    rows: list[tuple[int, int, str, str, str, int, int, str, str]] = []
    alias_keys: dict[tuple[int, str], str] = {}
    for m in mentions:
        eid = entity_ids.get(m.key)
        if eid is None:
            continue
        rows.append(
            (
                eid,
                chunk_ids[m.chunk],
                doc_id,
                m.surface,
                m.type,
                m.start,
                m.end,
                m.sentence,
                m.origin,
            )
        )
        alias_keys[(eid, m.surface)] = m.alias_key
    # In entity order (graph_store/locks.py, rule 3); stable: duplicates keep their order.
    rows.sort(key=lambda r: (r[0], r[1], r[5]))
    # A document may name nothing at all (no title, no entities).
    await insert_rows(conn, _MENTIONS, rows)
    return {r[0] for r in rows}, [(e, a, k) for (e, a), k in sorted(alias_keys.items())]


async def insert_times(
    conn: AsyncConnection,
    doc_id: str,
    times: Sequence[tuple[str, StatedTime]],
    chunk_ids: Mapping[str, int],
) -> None:
    """Insert when the facts of the new chunks' sentences held (alembic 0023)."""
    rows = [
        (chunk_ids[h], doc_id, t.sentence, t.span.start, t.span.end, t.span.expression)
        for h, t in times
    ]
    await insert_rows(conn, _TIMES, rows)
