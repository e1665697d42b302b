"""The graph local and path modes walk, held in memory (issue 32, step 2; first part: the
state and how it is kept current; the modes do not read it yet).

What it holds, as numpy arrays (no Python object per row):
- **passage edges**: each (entity, chunk) pair some mention makes, sorted by entity then chunk;
- **relationships**: id, source, target, weight (float32) and type, sorted by id.

How it is built and kept current: one bulk read in an exact snapshot
(services/core/db/snapshots.py ``graph_snapshot``: every ``graph_changes`` id at or below its
watermark is in what it reads, every later change above it), then, at each refresh, the changes
between the held watermark and a new exact one: the passage edges of each changed entity and
each changed relationship are read again as that snapshot shows them and replace the held ones.
A refresh returns a new state; the old one stays whole for the queries reading it (one
consistent state per query).

Tested by tests/integration/test_graph_memory.py (after any sequence of document events with
refreshes in between, the held state equals one built from the database) and by the curation
property of tests/integration/test_curations.py (the same through curations, undos and the
re-resolution of stored documents they cause)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.db.snapshots import fetch_packed, graph_snapshot

Ids = NDArray[np.int64]

_PASSAGE_EDGES = "SELECT entity_id, chunk_id FROM mentions"
_GROUPED = " GROUP BY entity_id, chunk_id"
_RELATIONSHIPS = "SELECT id, source_id, target_id, weight, type FROM relationships"
_PASSAGE_EDGES_OF = text(_PASSAGE_EDGES + " WHERE entity_id = ANY(:ids)" + _GROUPED)
# The bulk reads, packed (big-endian, as int8send / float4send / int4send write them), one
# bytea per group of at most 2^20 keys; a relationship's type as its index in _TYPES.
_EDGE_ROW = np.dtype([("entity", ">i8"), ("chunk", ">i8")])
_REL_ROW = np.dtype(
    [("id", ">i8"), ("src", ">i8"), ("dst", ">i8"), ("weight", ">f4"), ("type", ">i4")]
)
_PACKED_PASSAGE_EDGES = (
    "SELECT count(*), string_agg(int8send(entity_id) || int8send(chunk_id), ''::bytea)"  # noqa: S608 - constants
    " FROM (" + _PASSAGE_EDGES + _GROUPED + ") m GROUP BY entity_id >> 20"
)
_TYPES = text("SELECT array_agg(DISTINCT type ORDER BY type) FROM relationships")
# The codes are positions in the types just read (bound, so the two reads cannot disagree).
_PACKED_RELATIONSHIPS = (
    "WITH t AS (SELECT type, (n - 1)::int AS code"
    " FROM unnest(%s::text[]) WITH ORDINALITY AS u(type, n))"
    " SELECT count(*), string_agg(int8send(r.id) || int8send(r.source_id)"
    " || int8send(r.target_id) || float4send(r.weight::real) || int4send(t.code), ''::bytea)"
    " FROM relationships r JOIN t USING (type) GROUP BY r.id >> 20"
)
_RELATIONSHIPS_OF = text(_RELATIONSHIPS + " WHERE id = ANY(:ids)")
_CHANGES = text(
    "SELECT kind, ref_id FROM graph_changes WHERE id > :since AND id <= :until"
    " AND kind IN ('node', 'edge')"
)


@dataclass(frozen=True)
class Relationships:
    """Relationships as parallel arrays, sorted by id; a type as its index in ``vocabulary``
    (int32: an LLM may name many types)."""

    ids: Ids
    sources: Ids
    targets: Ids
    weights: NDArray[np.float32]
    types: NDArray[np.int32]
    vocabulary: tuple[str, ...]

    @classmethod
    def of(cls, rows: Sequence[Any]) -> Relationships:
        rows = sorted(rows, key=lambda r: int(r[0]))
        vocabulary = tuple(sorted({str(r[4]) for r in rows}))
        code = {t: i for i, t in enumerate(vocabulary)}
        return cls(
            np.array([int(r[0]) for r in rows], dtype=np.int64),
            np.array([int(r[1]) for r in rows], dtype=np.int64),
            np.array([int(r[2]) for r in rows], dtype=np.int64),
            np.array([float(r[3]) for r in rows], dtype=np.float32),
            np.array([code[str(r[4])] for r in rows], dtype=np.int32),
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
            vocabulary,
        ).sorted_by_id()

    def type_names(self) -> list[str]:
        return [self.vocabulary[int(c)] for c in self.types]


@dataclass(frozen=True)
class MemoryGraph:
    """One consistent state of the walked graph, as of ``watermark``."""

    watermark: int
    entities: Ids  # passage edges: entity ids, sorted (then by chunk)
    chunks: Ids  # ... and their chunk ids
    relationships: Relationships

    def passages(self, entity_id: int) -> Ids:
        """The chunks that mention the entity, sorted."""
        lo, hi = np.searchsorted(self.entities, [entity_id, entity_id + 1])
        return self.chunks[lo:hi]

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays and of the type names."""
        r = self.relationships
        arrays = (self.entities, self.chunks, r.ids, r.sources, r.targets, r.weights, r.types)
        return sum(a.nbytes for a in arrays) + sum(len(t) for t in r.vocabulary)

    def canonical(self) -> dict[str, list[tuple[Any, ...]]]:
        """The state as comparable data (tests)."""
        r = self.relationships
        return {
            "passage_edges": list(zip(self.entities.tolist(), self.chunks.tolist(), strict=True)),
            "relationships": [
                (i, s, t, round(float(w), 4), str(k))
                for i, s, t, w, k in zip(
                    r.ids.tolist(),
                    r.sources.tolist(),
                    r.targets.tolist(),
                    r.weights.tolist(),
                    r.type_names(),
                    strict=True,
                )
            ],
        }


def _passage_edges(rows: Sequence[Any]) -> tuple[Ids, Ids]:
    pairs = np.array([(int(e), int(c)) for e, c in rows], dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _sorted_edges(entities: Ids, chunks: Ids) -> tuple[Ids, Ids]:
    order = np.lexsort((chunks, entities))
    return entities[order], chunks[order]


async def _read_all(conn: AsyncConnection, watermark: int) -> MemoryGraph:
    """Every passage edge and relationship, packed by the server into fixed-width binary
    records (services/core/db/snapshots.py ``fetch_packed``: no Python object per row)."""
    edges = await fetch_packed(conn, _PACKED_PASSAGE_EDGES, _EDGE_ROW)
    types = [str(t) for t in (await conn.scalar(_TYPES)) or []]
    rels = await fetch_packed(conn, _PACKED_RELATIONSHIPS, _REL_ROW, (types,))
    relationships = Relationships(
        rels["id"].astype(np.int64),
        rels["src"].astype(np.int64),
        rels["dst"].astype(np.int64),
        rels["weight"].astype(np.float32),
        rels["type"].astype(np.int32),
        tuple(types),
    ).sorted_by_id()
    entities, chunks = _sorted_edges(
        edges["entity"].astype(np.int64), edges["chunk"].astype(np.int64)
    )
    return MemoryGraph(watermark, entities, chunks, relationships)


async def build(engine: AsyncEngine) -> MemoryGraph:
    """The whole walked graph in one bulk read of an exact snapshot."""
    async with graph_snapshot(engine) as (conn, watermark):
        return await _read_all(conn, watermark)


async def refresh(engine: AsyncEngine, held: MemoryGraph) -> MemoryGraph:
    """``held`` brought up to a new exact snapshot by the changes since its watermark (itself
    when nothing changed)."""
    async with graph_snapshot(engine) as (conn, watermark):
        if watermark == held.watermark:
            return held
        rows = (await conn.execute(_CHANGES, {"since": held.watermark, "until": watermark})).all()
        nodes = np.array(sorted({int(r[1]) for r in rows if r[0] == "node"}), dtype=np.int64)
        edges = np.array(sorted({int(r[1]) for r in rows if r[0] == "edge"}), dtype=np.int64)
        entities, chunks = held.entities, held.chunks
        if nodes.size:
            keep = ~np.isin(entities, nodes)
            fresh = (await conn.execute(_PASSAGE_EDGES_OF, {"ids": nodes.tolist()})).all()
            new_entities, new_chunks = _passage_edges(fresh)
            entities, chunks = _sorted_edges(
                np.concatenate([entities[keep], new_entities]),
                np.concatenate([chunks[keep], new_chunks]),
            )
        relationships = held.relationships
        if edges.size:
            fresh = (await conn.execute(_RELATIONSHIPS_OF, {"ids": edges.tolist()})).all()
            relationships = relationships.without(edges).merged(Relationships.of(fresh))
        return MemoryGraph(watermark, entities, chunks, relationships)
