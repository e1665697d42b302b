"""The graph local mode walks, held in memory (issue 32, steps 2 and 3): graph_walk.py reads
it for a caller who sees the whole corpus; graph_holder.py keeps one per query process.

What it holds, as numpy arrays (no Python object per row):
- **passage edges**: each (entity, chunk) pair some mention makes, whether one of those
  mentions is the chunk's title (``start_char = -1``: the entities a passage is *about*),
  sorted by entity then chunk, and the same edges sorted by chunk then entity;
- **entities**: id and mention count (the hub rule and the bridge budget), sorted by id;
- **relationships**: id, source, target, weight (float64, as stored: the walk's order and its
  log weights are then those of the database), type and whether it is weak, sorted by id,
  with their order by source and by target.

How it is built and kept current: one bulk read in an exact snapshot
(services/core/db/snapshots.py ``graph_snapshot``: every ``graph_changes`` id at or below its
watermark is in what it reads, every later change above it), then, at each refresh, the changes
between the held watermark and a new exact one: the passage edges and the row of each changed
entity and each changed relationship are read again as that snapshot shows them and replace
the held ones. A refresh returns a new state; the old one stays whole for the queries reading
it (one consistent state per query).

Tested by tests/integration/test_graph_memory.py (after any sequence of document events with
refreshes in between, the held state equals one built from the database) and by the curation
property of tests/integration/test_curations.py (the same through curations, undos and the
re-resolution of stored documents they cause)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.db.snapshots import fetch_packed, graph_snapshot

Ids = NDArray[np.int64]
Flags = NDArray[np.bool_]
# Positions of rows in an order: int32 (4 bytes a row; 2^31 rows is past any one process's
# memory for these arrays).
Positions = NDArray[np.int32]


def _unset() -> NDArray[Any]:
    """An index not given: computed from the rows (any index of rows has one entry a row)."""
    return np.zeros(0, dtype=np.int64)


def _positions(order: NDArray[Any]) -> Positions:
    return order.astype(np.int32, copy=False)


_PASSAGE_EDGES_OF = text(
    "SELECT entity_id, chunk_id, bool_or(start_char = -1) FROM mentions"
    " WHERE entity_id = ANY(:ids) GROUP BY entity_id, chunk_id"
)
_ENTITIES_OF = text("SELECT id, mention_count FROM entities WHERE id = ANY(:ids)")
_RELATIONSHIPS_OF = text(
    "SELECT id, source_id, target_id, weight, type, weak FROM relationships WHERE id = ANY(:ids)"
)
# The bulk reads, packed (big-endian, as int8send / float8send / int4send / boolsend write
# them), one bytea per group of at most 2^20 keys; a relationship's type as its index in _TYPES.
_EDGE_ROW = np.dtype([("entity", ">i8"), ("chunk", ">i8"), ("topic", "?")])
_ENTITY_ROW = np.dtype([("id", ">i8"), ("mentions", ">i4")])
_REL_ROW = np.dtype(
    [
        ("id", ">i8"),
        ("src", ">i8"),
        ("dst", ">i8"),
        ("weight", ">f8"),
        ("type", ">i4"),
        ("weak", "?"),
    ]
)
_PACKED_PASSAGE_EDGES = (
    "SELECT count(*), string_agg(int8send(entity_id) || int8send(chunk_id) || boolsend(topic),"
    " ''::bytea) FROM (SELECT entity_id, chunk_id, bool_or(start_char = -1) AS topic"
    " FROM mentions GROUP BY entity_id, chunk_id) m GROUP BY entity_id >> 20"
)
_PACKED_ENTITIES = (
    "SELECT count(*), string_agg(int8send(id) || int4send(mention_count), ''::bytea)"
    " FROM entities GROUP BY id >> 20"
)
_TYPES = text("SELECT array_agg(DISTINCT type ORDER BY type) FROM relationships")
# The codes are positions in the types just read (bound, so the two reads cannot disagree).
_PACKED_RELATIONSHIPS = (
    "WITH t AS (SELECT type, (n - 1)::int AS code"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS u(type, n))"
    " SELECT count(*), string_agg(int8send(r.id) || int8send(r.source_id)"
    " || int8send(r.target_id) || float8send(r.weight) || int4send(t.code) || boolsend(r.weak),"
    " ''::bytea) FROM relationships r JOIN t USING (type) GROUP BY r.id >> 20"
)
_TOP = text("SELECT max(id) FROM graph_changes")
_CHANGES = text(
    "SELECT kind, ref_id FROM graph_changes WHERE id > :since AND id <= :until"
    " AND kind IN ('node', 'edge')"
)


def _ids(values: Sequence[int] | Ids) -> Ids:
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class Relationships:
    """Relationships as parallel arrays, sorted by id; a type as its index in ``vocabulary``
    (int32: an LLM may name many types). ``by_source`` / ``by_target``: the rows in source
    (target) order, and ``source_keys`` / ``target_keys`` the sources (targets) in that order,
    for the walk's lookups; computed when not given."""

    ids: Ids
    sources: Ids
    targets: Ids
    weights: NDArray[np.float64]
    types: NDArray[np.int32]
    weak: Flags
    vocabulary: tuple[str, ...]
    by_source: Positions = field(default_factory=_unset, repr=False, compare=False)
    source_keys: Ids = field(default_factory=_unset, repr=False, compare=False)
    by_target: Positions = field(default_factory=_unset, repr=False, compare=False)
    target_keys: Ids = field(default_factory=_unset, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.by_source) != len(self.ids):
            order = _positions(np.argsort(self.sources, kind="stable"))
            object.__setattr__(self, "by_source", order)
            object.__setattr__(self, "source_keys", self.sources[order])
        if len(self.by_target) != len(self.ids):
            order = _positions(np.argsort(self.targets, kind="stable"))
            object.__setattr__(self, "by_target", order)
            object.__setattr__(self, "target_keys", self.targets[order])

    @classmethod
    def of(cls, rows: Sequence[Any], vocabulary: tuple[str, ...] = ()) -> Relationships:
        """From (id, source, target, weight, type, weak) rows; types coded in ``vocabulary``
        extended by the names it lacks."""
        rows = sorted(rows, key=lambda r: int(r[0]))
        extra = sorted({str(r[4]) for r in rows} - set(vocabulary))
        vocabulary = (*vocabulary, *extra)
        code = {t: i for i, t in enumerate(vocabulary)}
        return cls(
            _ids([int(r[0]) for r in rows]),
            _ids([int(r[1]) for r in rows]),
            _ids([int(r[2]) for r in rows]),
            np.array([float(r[3]) for r in rows], dtype=np.float64),
            np.array([code[str(r[4])] for r in rows], dtype=np.int32),
            np.array([bool(r[5]) for r in rows], dtype=np.bool_),
            vocabulary,
        )

    def sorted_by_id(self) -> Relationships:
        order = np.argsort(self.ids, kind="stable")
        return Relationships(
            self.ids[order],
            self.sources[order],
            self.targets[order],
            self.weights[order],
            self.types[order],
            self.weak[order],
            self.vocabulary,
        )

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> Relationships:
        """The rows of ``changed`` ids (sorted, distinct) replaced by ``rows`` (what the
        database now holds of them; a removed relationship has none), in time linear in the
        rows held: no sort of what did not change."""
        fresh = Relationships.of(rows, self.vocabulary)
        deleted, _ = _present(self.ids, changed)
        kept_ids = np.delete(self.ids, deleted)
        inserted_at = np.searchsorted(kept_ids, fresh.ids)
        ids = np.insert(kept_ids, inserted_at, fresh.ids)
        change = {"deleted": deleted, "inserted_at": inserted_at}
        by_source, source_keys = _reordered(
            self.by_source,
            self.source_keys,
            deleted_keys=self.sources[deleted],
            inserted_keys=fresh.sources,
            **change,
        )
        by_target, target_keys = _reordered(
            self.by_target,
            self.target_keys,
            deleted_keys=self.targets[deleted],
            inserted_keys=fresh.targets,
            **change,
        )
        return Relationships(
            ids,
            _patched(self.sources, deleted, inserted_at, fresh.sources),
            _patched(self.targets, deleted, inserted_at, fresh.targets),
            _patched(self.weights, deleted, inserted_at, fresh.weights),
            _patched(self.types, deleted, inserted_at, fresh.types),
            _patched(self.weak, deleted, inserted_at, fresh.weak),
            fresh.vocabulary,
            by_source,
            source_keys,
            by_target,
            target_keys,
        )

    def type_names(self) -> list[str]:
        return [self.vocabulary[int(c)] for c in self.types]

    def touching(self, entities: Ids) -> NDArray[Any]:
        """Rows (positions) whose source or target is one of ``entities``, each once, sorted."""
        out = [self.by_source[_with_keys(self.source_keys, entities)]]
        out.append(self.by_target[_with_keys(self.target_keys, entities)])
        return np.unique(np.concatenate(out))

    def indexes_hold(self) -> bool:
        """Whether both orders are permutations of the rows in key order (tests)."""
        sources = _is_order(self.by_source, self.sources, self.source_keys)
        return sources and _is_order(self.by_target, self.targets, self.target_keys)

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.sources, self.targets, self.weights, self.types, self.weak)
        index = sum(a.nbytes for a in (self.by_source, self.source_keys))
        index += sum(a.nbytes for a in (self.by_target, self.target_keys))
        return sum(a.nbytes for a in arrays) + index + sum(len(t) for t in self.vocabulary)


def _patched(
    values: NDArray[Any], deleted: Ids, inserted_at: Ids, inserted: NDArray[Any]
) -> NDArray[Any]:
    """``values`` without the rows at ``deleted``, with ``inserted`` put before the kept rows at
    ``inserted_at`` (nondecreasing positions among the kept rows, as np.insert takes them)."""
    return np.insert(np.delete(values, deleted), inserted_at, inserted)


def _present(sorted_ids: Ids, wanted: Ids) -> tuple[Ids, Flags]:
    """(the positions of those of ``wanted`` that are in ``sorted_ids``, which of ``wanted``
    they are): ``wanted`` sorted and distinct, so the positions are too."""
    at = np.searchsorted(sorted_ids, wanted)
    found = np.zeros(len(wanted), dtype=np.bool_)
    inside = at < len(sorted_ids)
    found[inside] = sorted_ids[at[inside]] == wanted[inside]
    return at[found], found


def _with_keys(sorted_keys: Ids, wanted: Ids) -> Ids:
    """Positions in ``sorted_keys`` of every entry whose key is in ``wanted`` (distinct),
    sorted."""
    lo = np.searchsorted(sorted_keys, wanted, side="left")
    hi = np.searchsorted(sorted_keys, wanted, side="right")
    return _spans(lo, hi)


def _reordered(
    order: Positions,
    sorted_keys: Ids,
    *,
    deleted: Ids,
    deleted_keys: Ids,
    inserted_at: Ids,
    inserted_keys: Ids,
) -> tuple[Positions, Ids]:
    """An order of the rows by key and the keys in that order, kept through a change that
    deleted the rows at ``deleted`` (old positions, sorted; their keys ``deleted_keys``) and
    inserted rows with ``inserted_keys`` at ``inserted_at`` (as np.insert takes them): the
    deleted rows found by their keys, the kept rows' positions moved, the new rows placed
    among them by key (ties after). Linear copies only: no gather of the whole order."""
    candidates = _with_keys(sorted_keys, np.unique(deleted_keys))
    at = candidates[np.isin(order[candidates], deleted)]
    kept, keys = np.delete(order, at), np.delete(sorted_keys, at)
    if deleted.size:
        kept = kept - np.searchsorted(deleted, kept)  # positions after the deletion
    if inserted_at.size:
        kept = kept + np.searchsorted(inserted_at, kept, side="right")  # after the insertion
    new_rows = inserted_at + np.arange(len(inserted_at), dtype=np.int64)
    by_key = np.argsort(inserted_keys, kind="stable")
    spots = np.searchsorted(keys, inserted_keys[by_key], side="right")
    order = _positions(np.insert(kept, spots, new_rows[by_key]))
    return order, np.insert(keys, spots, inserted_keys[by_key])


def _is_order(order: Positions, keys: NDArray[Any], sorted_keys: Ids) -> bool:
    """Whether ``order`` is a permutation of the rows that sorts ``keys`` and ``sorted_keys``
    are the keys in that order."""
    every = len(order) == len(keys) and np.array_equal(np.sort(order), np.arange(len(keys)))
    ordered = every and np.array_equal(keys[order], sorted_keys)
    return bool(ordered and np.all(np.diff(sorted_keys) >= 0))


@dataclass(frozen=True)
class PassageEdges:
    """(entity, chunk) pairs with their title flag, sorted by entity then chunk; ``by_chunk``
    holds the positions in chunk order (ties in any order: the walk reads a passage's edges as
    a set) and ``chunk_keys`` the chunks in that order; computed when not given."""

    entities: Ids
    chunks: Ids
    topics: Flags
    by_chunk: Positions = field(default_factory=_unset, repr=False, compare=False)
    chunk_keys: Ids = field(default_factory=_unset, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.by_chunk) != len(self.entities):
            order = _positions(np.lexsort((self.entities, self.chunks)))
            object.__setattr__(self, "by_chunk", order)
        if len(self.chunk_keys) != len(self.entities):
            object.__setattr__(self, "chunk_keys", self.chunks[self.by_chunk])

    @classmethod
    def sorted_of(cls, entities: Ids, chunks: Ids, topics: Flags) -> PassageEdges:
        order = np.lexsort((chunks, entities))
        return cls(entities[order], chunks[order], topics[order])

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> PassageEdges:
        """The edges of ``changed`` entities (sorted, distinct) replaced by ``rows`` (their
        edges now), in time linear in the edges held: no sort of what did not change."""
        new_entities, new_chunks, new_topics = _edge_rows(rows)
        order = np.lexsort((new_chunks, new_entities))
        new_entities, new_chunks = new_entities[order], new_chunks[order]
        deleted = self.of_entities(changed)
        kept_entities = np.delete(self.entities, deleted)
        inserted_at = np.searchsorted(kept_entities, new_entities)
        by_chunk, chunk_keys = _reordered(
            self.by_chunk,
            self.chunk_keys,
            deleted=deleted,
            deleted_keys=self.chunks[deleted],
            inserted_at=inserted_at,
            inserted_keys=new_chunks,
        )
        return PassageEdges(
            np.insert(kept_entities, inserted_at, new_entities),
            _patched(self.chunks, deleted, inserted_at, new_chunks),
            _patched(self.topics, deleted, inserted_at, new_topics[order]),
            by_chunk,
            chunk_keys,
        )

    def of_entities(self, entities: Ids) -> Ids:
        """Positions of the edges of these entities (sorted, each once)."""
        return _with_keys(self.entities, entities)

    def of_chunks(self, chunks: Ids) -> Positions:
        """Positions (in entity order) of the edges of these chunks."""
        return self.by_chunk[_with_keys(self.chunk_keys, chunks)]

    def index_holds(self) -> bool:
        """Whether ``by_chunk`` orders the edges by chunk and ``chunk_keys`` follows it (tests)."""
        return _is_order(self.by_chunk, self.chunks, self.chunk_keys)

    @property
    def nbytes(self) -> int:
        arrays = (self.entities, self.chunks, self.topics, self.by_chunk, self.chunk_keys)
        return sum(a.nbytes for a in arrays)


def _spans(lo: Ids, hi: Ids) -> Ids:
    """The positions lo[i] <= p < hi[i] of every i (``lo``/``hi`` from distinct sorted keys, so
    the spans do not overlap), sorted."""
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not lo.size:
        return np.zeros(0, dtype=np.int64)
    lengths = hi - lo
    starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
    positions = starts + np.arange(int(lengths.sum()), dtype=np.int64)
    return np.sort(positions)


@dataclass(frozen=True)
class EntityCounts:
    """Every entity's id (sorted) and mention count."""

    ids: Ids
    mentions: NDArray[np.int32]

    def of(self, entities: Ids) -> tuple[Ids, NDArray[np.int32]]:
        """(ids, counts) of those of ``entities`` (sorted, distinct) that exist."""
        at, found = _present(self.ids, entities)
        return entities[found], self.mentions[at]

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> EntityCounts:
        """The counts of ``changed`` entities (sorted, distinct) replaced by ``rows`` (id,
        count; a removed entity has none)."""
        fresh = sorted((int(r[0]), int(r[1])) for r in rows)
        new_ids = _ids([i for i, _ in fresh])
        deleted, _ = _present(self.ids, changed)
        kept = np.delete(self.ids, deleted)
        inserted_at = np.searchsorted(kept, new_ids)
        counts = np.array([n for _, n in fresh], dtype=np.int32)
        return EntityCounts(
            np.insert(kept, inserted_at, new_ids),
            _patched(self.mentions, deleted, inserted_at, counts),
        )


@dataclass(frozen=True)
class MemoryGraph:
    """One consistent state of the walked graph, as of ``watermark``."""

    watermark: int
    edges: PassageEdges
    entity_counts: EntityCounts
    relationships: Relationships

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (indexes included) and of the type names."""
        counts = self.entity_counts.ids.nbytes + self.entity_counts.mentions.nbytes
        return self.edges.nbytes + counts + self.relationships.nbytes

    def canonical(self) -> dict[str, list[tuple[Any, ...]]]:
        """The state as comparable data (tests)."""
        r, e = self.relationships, self.edges
        return {
            "passage_edges": list(
                zip(e.entities.tolist(), e.chunks.tolist(), e.topics.tolist(), strict=True)
            ),
            "entities": list(
                zip(
                    self.entity_counts.ids.tolist(),
                    self.entity_counts.mentions.tolist(),
                    strict=True,
                )
            ),
            "indexes_hold": [(e.index_holds(), r.indexes_hold())],
            "relationships": [
                (i, s, t, w, k, weak)
                for i, s, t, w, k, weak in zip(
                    r.ids.tolist(),
                    r.sources.tolist(),
                    r.targets.tolist(),
                    r.weights.tolist(),
                    r.type_names(),
                    r.weak.tolist(),
                    strict=True,
                )
            ],
        }


def _edge_rows(rows: Sequence[Any]) -> tuple[Ids, Ids, Flags]:
    entities = _ids([int(r[0]) for r in rows])
    chunks = _ids([int(r[1]) for r in rows])
    return entities, chunks, np.array([bool(r[2]) for r in rows], dtype=np.bool_)


async def _read_all(conn: AsyncConnection, watermark: int) -> MemoryGraph:
    """Every passage edge, entity and relationship, packed by the server into fixed-width
    binary records (services/core/db/snapshots.py ``fetch_packed``: no Python object per
    row)."""
    edges = await fetch_packed(conn, _PACKED_PASSAGE_EDGES, _EDGE_ROW)
    entities = await fetch_packed(conn, _PACKED_ENTITIES, _ENTITY_ROW)
    types = [str(t) for t in (await conn.scalar(_TYPES)) or []]
    rels = await fetch_packed(conn, _PACKED_RELATIONSHIPS, _REL_ROW, (types,))
    relationships = Relationships(
        rels["id"].astype(np.int64),
        rels["src"].astype(np.int64),
        rels["dst"].astype(np.int64),
        rels["weight"].astype(np.float64),
        rels["type"].astype(np.int32),
        rels["weak"].astype(np.bool_),
        tuple(types),
    ).sorted_by_id()
    order = np.argsort(entities["id"], kind="stable")
    counts = EntityCounts(
        entities["id"].astype(np.int64)[order], entities["mentions"].astype(np.int32)[order]
    )
    passage_edges = PassageEdges.sorted_of(
        edges["entity"].astype(np.int64), edges["chunk"].astype(np.int64), edges["topic"]
    )
    return MemoryGraph(watermark, passage_edges, counts, relationships)


async def build(engine: AsyncEngine) -> MemoryGraph:
    """The whole walked graph in one bulk read of an exact snapshot."""
    async with graph_snapshot(engine) as (conn, watermark):
        return await _read_all(conn, watermark)


async def shown_by(conn: AsyncConnection, held: MemoryGraph) -> bool:
    """Whether ``conn``'s snapshot shows every change ``held`` holds (its last graph change at
    or past the watermark): a replica's read may be behind the primary the graph is read
    from. Changes commit in about id order; one that committed after a larger id is the only
    gap, the same window a read already has for a passage deleted after the walk found it."""
    top = await conn.scalar(_TOP)
    return int(top or 0) >= held.watermark


async def refresh(engine: AsyncEngine, held: MemoryGraph) -> MemoryGraph:
    """``held`` brought up to a new exact snapshot by the changes since its watermark (itself
    when nothing changed). Nothing committed above the held watermark is seen without the
    exact snapshot's brief lock (every id at or below it was committed when it was taken, so
    a later change has a larger id): an idle graph costs its writers nothing."""
    async with engine.connect() as conn:
        top = await conn.scalar(_TOP)
    if top is None or int(top) <= held.watermark:
        return held
    async with graph_snapshot(engine) as (conn, watermark):
        if watermark == held.watermark:
            return held
        rows = (await conn.execute(_CHANGES, {"since": held.watermark, "until": watermark})).all()
        nodes = _ids(sorted({int(r[1]) for r in rows if r[0] == "node"}))
        changed_edges = _ids(sorted({int(r[1]) for r in rows if r[0] == "edge"}))
        edges, counts = held.edges, held.entity_counts
        if nodes.size:
            fresh = await conn.execute(_PASSAGE_EDGES_OF, {"ids": nodes.tolist()})
            edges = edges.replaced(nodes, fresh.all())
            rows_of = (await conn.execute(_ENTITIES_OF, {"ids": nodes.tolist()})).all()
            counts = counts.replaced(nodes, rows_of)
        relationships = held.relationships
        if changed_edges.size:
            ids = {"ids": changed_edges.tolist()}
            fresh_rels = (await conn.execute(_RELATIONSHIPS_OF, ids)).all()
            relationships = relationships.replaced(changed_edges, fresh_rels)
        return MemoryGraph(watermark, edges, counts, relationships)
