"""A published snapshot's community summary embeddings, held in memory as one matrix per level:
snapshots are immutable, so global mode ranks them with one matrix product instead of reading
every community's vector from the table on every query (25.5 ms a query for 5,491 communities
at 10k documents, docs/BENCHMARKS.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

K = TypeVar("K")
V = TypeVar("V")

# :l is a level, or NULL for the leaves (as in global_mode).
_VECTORS = text(
    "SELECT id, CAST(embedding AS real[]) FROM communities WHERE snapshot_id = :s"
    " AND embedding IS NOT NULL AND (level = CAST(:l AS integer) OR (CAST(:l AS integer) IS NULL"
    " AND id NOT IN (SELECT parent_id FROM communities WHERE snapshot_id = :s"
    " AND parent_id IS NOT NULL)))"
)


@dataclass(frozen=True)
class LevelVectors:
    """The ids and unit-length embeddings of one level's communities (rows in id order)."""

    ids: npt.NDArray[np.int64]
    unit: npt.NDArray[np.float32]

    def top(
        self, embedding: Sequence[float], n: int, exclude: Sequence[int] = ()
    ) -> list[tuple[int, float]]:
        """(id, cosine) of the n closest, closest first; ties by id, as the SQL ranking. The
        ``exclude``d ids (communities withheld since the snapshot) are never among them."""
        if not len(self.ids) or n <= 0:
            return []
        q = np.asarray(embedding, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        cos = self.unit @ (q / norm if norm else q)
        order = np.lexsort((self.ids, -cos))
        if len(exclude):
            order = order[~np.isin(self.ids[order], np.asarray(exclude, dtype=np.int64))]
        return [(int(self.ids[i]), float(cos[i])) for i in order[:n]]


_LEVELS = text("SELECT DISTINCT level FROM communities WHERE snapshot_id = :s ORDER BY level")


async def snapshot_levels(conn: AsyncConnection, snapshot_id: int) -> list[int]:
    """Levels of the snapshot that have communities (a scan of its communities)."""
    return [int(r[0]) for r in (await conn.execute(_LEVELS, {"s": snapshot_id})).all()]


@dataclass
class NewestSnapshot(Generic[K, V]):
    """Values by key for the newest snapshot asked about: storing a newer snapshot's value
    drops the older one's, and an older snapshot's value is not stored (a reader still inside
    it reads it again). Snapshots are immutable, so a held value never goes stale."""

    snapshot: int = -1
    values: dict[K, V] = field(default_factory=dict)

    def get(self, snapshot_id: int, key: K) -> V | None:
        return self.values.get(key) if snapshot_id == self.snapshot else None

    def put(self, snapshot_id: int, key: K, value: V) -> None:
        if snapshot_id > self.snapshot:
            self.snapshot, self.values = snapshot_id, {}
        if snapshot_id == self.snapshot:
            self.values[key] = value


@dataclass
class CommunityVectors:
    """Per level matrices of the newest snapshot asked about, and its level list."""

    _vectors: NewestSnapshot[int | None, LevelVectors] = field(default_factory=NewestSnapshot)
    _levels: NewestSnapshot[None, tuple[int, ...]] = field(default_factory=NewestSnapshot)

    async def levels(self, conn: AsyncConnection, snapshot_id: int) -> list[int]:
        """The snapshot's levels that have communities, read the first time they are asked for
        (counting them scanned every community on every global query: 149 ms a query at 1M
        entities, docs/BENCHMARKS.md "Scale by bulk build")."""
        held = self._levels.get(snapshot_id, None)
        if held is None:
            held = tuple(await snapshot_levels(conn, snapshot_id))
            self._levels.put(snapshot_id, None, held)
        return list(held)

    async def level(
        self, conn: AsyncConnection, snapshot_id: int, level: int | None
    ) -> LevelVectors:
        """The level's vectors, read from ``conn`` the first time they are asked for."""
        found = self._vectors.get(snapshot_id, level)
        if found is None:
            found_rows = (await conn.execute(_VECTORS, {"s": snapshot_id, "l": level})).all()
            rows = sorted(found_rows, key=lambda r: int(r[0]))
            ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
            width = len(rows[0][1]) if rows else 0
            matrix = np.array([r[1] for r in rows], dtype=np.float32).reshape(len(rows), width)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
            found = LevelVectors(ids, unit)
            self._vectors.put(snapshot_id, level, found)
        return found
