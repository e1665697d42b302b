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
    (int32: an LLM may name many types). ``by_source`` / ``by_target``: the row order by
    source (by target), for the walk's lookups."""

    ids: Ids
    sources: Ids
    targets: Ids
    weights: NDArray[np.float64]
    types: NDArray[np.int32]
    weak: Flags
    vocabulary: tuple[str, ...]
    by_source: Ids = field(init=False, repr=False, compare=False)
    by_target: Ids = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_source", np.argsort(self.sources, kind="stable"))
        object.__setattr__(self, "by_target", np.argsort(self.targets, kind="stable"))

    @classmethod
    def of(cls, rows: Sequence[Any]) -> Relationships:
        rows = sorted(rows, key=lambda r: int(r[0]))
        vocabulary = tuple(sorted({str(r[4]) for r in rows}))
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
        return self._rows(order)

    def without(self, ids: Ids) -> Relationships:
        return self._rows(~np.isin(self.ids, ids))

    def _rows(self, which: NDArray[Any]) -> Relationships:
        return Relationships(
            self.ids[which],
            self.sources[which],
            self.targets[which],
            self.weights[which],
            self.types[which],
            self.weak[which],
            self.vocabulary,
        )

    def merged(self, other: Relationships) -> Relationships:
        """Both sets of rows, sorted by id; ``other``'s types recoded into this vocabulary
        (extended by the types it did not have)."""
        extra = tuple(t for t in other.vocabulary if t not in self.vocabulary)
        vocabulary = self.vocabulary + extra
        code = {t: i for i, t in enumerate(vocabulary)}
        recode = np.array([code[t] for t in other.vocabulary], dtype=np.int32)
        types = recode[other.types] if other.types.size else other.types
        return Relationships(
            np.concatenate([self.ids, other.ids]),
            np.concatenate([self.sources, other.sources]),
            np.concatenate([self.targets, other.targets]),
            np.concatenate([self.weights, other.weights]),
            np.concatenate([self.types, types]),
            np.concatenate([self.weak, other.weak]),
            vocabulary,
        ).sorted_by_id()

    def type_names(self) -> list[str]:
        return [self.vocabulary[int(c)] for c in self.types]

    def touching(self, entities: Ids) -> Ids:
        """Rows (positions) whose source or target is one of ``entities``, each once, sorted."""
        out = [_matching(self.sources, self.by_source, entities)]
        out.append(_matching(self.targets, self.by_target, entities))
        return np.unique(np.concatenate(out))

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.sources, self.targets, self.weights, self.types, self.weak)
        index = self.by_source.nbytes + self.by_target.nbytes
        return sum(a.nbytes for a in arrays) + index + sum(len(t) for t in self.vocabulary)


def _matching(keys: Ids, order: Ids, wanted: Ids) -> Ids:
    """Positions of the rows whose key (``keys``, sorted through ``order``) is in ``wanted``."""
    sorted_keys = keys[order]
    lo = np.searchsorted(sorted_keys, wanted, side="left")
    hi = np.searchsorted(sorted_keys, wanted, side="right")
    if not len(lo):
        return np.zeros(0, dtype=np.int64)
    spans = [order[a:b] for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]
    return np.concatenate(spans) if spans else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class PassageEdges:
    """(entity, chunk) pairs with their title flag, sorted by entity then chunk; ``by_chunk``
    holds the positions in chunk-then-entity order."""

    entities: Ids
    chunks: Ids
    topics: Flags
    by_chunk: Ids = field(init=False, repr=False, compare=False)
    chunk_keys: Ids = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_chunk", np.lexsort((self.entities, self.chunks)))
        object.__setattr__(self, "chunk_keys", self.chunks[self.by_chunk])

    @classmethod
    def sorted_of(cls, entities: Ids, chunks: Ids, topics: Flags) -> PassageEdges:
        order = np.lexsort((chunks, entities))
        return cls(entities[order], chunks[order], topics[order])

    def of_entities(self, entities: Ids) -> Ids:
        """Positions of the edges of these entities (sorted, each once)."""
        lo = np.searchsorted(self.entities, entities, side="left")
        hi = np.searchsorted(self.entities, entities, side="right")
        return _spans(lo, hi)

    def of_chunks(self, chunks: Ids) -> Ids:
        """Positions (in entity order) of the edges of these chunks."""
        lo = np.searchsorted(self.chunk_keys, chunks, side="left")
        hi = np.searchsorted(self.chunk_keys, chunks, side="right")
        return self.by_chunk[_spans(lo, hi)]

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
        at = np.searchsorted(self.ids, entities)
        at = np.minimum(at, max(len(self.ids) - 1, 0))
        found = (self.ids[at] == entities) if len(self.ids) else np.zeros(len(entities), bool)
        return entities[found], self.mentions[at[found]]

    def replaced(self, changed: Ids, rows: Sequence[Any]) -> EntityCounts:
        keep = ~np.isin(self.ids, changed)
        ids = np.concatenate([self.ids[keep], _ids([int(r[0]) for r in rows])])
        counts = np.concatenate(
            [self.mentions[keep], np.array([int(r[1]) for r in rows], dtype=np.int32)]
        )
        order = np.argsort(ids, kind="stable")
        return EntityCounts(ids[order], counts[order])


@dataclass(frozen=True)
class MemoryGraph:
    """One consistent state of the walked graph, as of ``watermark``."""

    watermark: int
    edges: PassageEdges
    entity_counts: EntityCounts
    relationships: Relationships

    @property
    def entities(self) -> Ids:
        """The passage edges' entity ids (sorted, then by chunk)."""
        return self.edges.entities

    @property
    def chunks(self) -> Ids:
        """The passage edges' chunk ids."""
        return self.edges.chunks

    def passages(self, entity_id: int) -> Ids:
        """The chunks that mention the entity, sorted."""
        lo, hi = np.searchsorted(self.edges.entities, [entity_id, entity_id + 1])
        return self.edges.chunks[lo:hi]

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
            keep = ~np.isin(edges.entities, nodes)
            fresh = await conn.execute(_PASSAGE_EDGES_OF, {"ids": nodes.tolist()})
            new_entities, new_chunks, new_topics = _edge_rows(fresh.all())
            edges = PassageEdges.sorted_of(
                np.concatenate([edges.entities[keep], new_entities]),
                np.concatenate([edges.chunks[keep], new_chunks]),
                np.concatenate([edges.topics[keep], new_topics]),
            )
            rows_of = (await conn.execute(_ENTITIES_OF, {"ids": nodes.tolist()})).all()
            counts = counts.replaced(nodes, rows_of)
        relationships = held.relationships
        if changed_edges.size:
            ids = {"ids": changed_edges.tolist()}
            fresh_rels = (await conn.execute(_RELATIONSHIPS_OF, ids)).all()
            relationships = relationships.without(changed_edges).merged(
                Relationships.of(fresh_rels)
            )
        return MemoryGraph(watermark, edges, counts, relationships)
