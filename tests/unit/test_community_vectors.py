"""In-memory ranking of a snapshot's community embeddings (pure part)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from services.retrieval.community_vectors import CommunityVectors, LevelVectors


def vectors(rows: dict[int, list[float]]) -> LevelVectors:
    ids = np.array(sorted(rows), dtype=np.int64)
    matrix = np.array([rows[i] for i in sorted(rows)], dtype=np.float32)
    return LevelVectors(ids, matrix / np.linalg.norm(matrix, axis=1, keepdims=True))


def test_closest_first_by_cosine_ties_by_id() -> None:
    v = vectors({7: [1.0, 0.0], 3: [2.0, 0.0], 5: [0.0, 1.0], 9: [1.0, 1.0]})
    best = v.top([3.0, 0.0], 3)  # the query's length does not matter
    assert [i for i, _ in best] == [3, 7, 9]  # 3 and 7 tie at cosine 1: the lower id first
    assert best[0][1] == pytest.approx(1.0)
    assert best[2][1] == pytest.approx(1 / np.sqrt(2))
    assert v.top([0.0, 1.0], 10)[0][0] == 5
    assert len(v.top([0.0, 1.0], 10)) == 4


def test_empty_level_and_zero_query() -> None:
    empty = LevelVectors(np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.float32))
    assert empty.top([1.0, 0.0], 5) == []
    v = vectors({1: [1.0, 0.0]})
    assert v.top([0.0, 0.0], 1) == [(1, 0.0)]
    assert v.top([1.0, 0.0], 0) == []


def test_withheld_communities_are_never_ranked_and_the_next_fill_in() -> None:
    v = vectors({7: [1.0, 0.0], 3: [2.0, 0.0], 5: [0.0, 1.0], 9: [1.0, 1.0]})
    assert [i for i, _ in v.top([1.0, 0.0], 2, exclude=[3])] == [7, 9]
    assert [i for i, _ in v.top([1.0, 0.0], 9, exclude=[3, 7, 42])] == [9, 5]
    assert v.top([1.0, 0.0], 2, exclude=[3, 5, 7, 9]) == []


class _Rows:
    def __init__(self, rows: list[tuple[int]]) -> None:
        self._rows = rows

    def all(self) -> list[tuple[int]]:
        return self._rows


class _LevelsConn:
    """Answers the levels statement from a dict of snapshot -> levels, counting the reads."""

    def __init__(self, levels: dict[int, list[int]]) -> None:
        self.levels = levels
        self.reads = 0

    async def execute(self, _statement: object, values: dict[str, int]) -> _Rows:
        self.reads += 1
        return _Rows([(level,) for level in self.levels[values["s"]]])


async def test_levels_are_read_once_per_snapshot_and_a_newer_one_replaces_them() -> None:
    conn = _LevelsConn({1: [0, 1, 2], 2: [0, 1]})
    held = CommunityVectors()
    db = cast(AsyncConnection, conn)
    assert await held.levels(db, 1) == [0, 1, 2]
    assert await held.levels(db, 1) == [0, 1, 2]
    assert conn.reads == 1  # an immutable snapshot's levels, read once
    assert await held.levels(db, 2) == [0, 1]
    assert await held.levels(db, 1) == [0, 1, 2]  # a reader still inside the old one: read again
    assert await held.levels(db, 2) == [0, 1]  # the newest stays held
    assert conn.reads == 3
