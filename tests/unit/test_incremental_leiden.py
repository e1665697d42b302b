"""The leidenalg incremental update measured by bench/bench_stability.py: nodes away from a change
keep their community, a local change moves only nearby nodes, a seed gives one answer, and the
service's own path is untouched outside the context."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from services.communities import leiden
from services.communities.graph import GraphRows
from services.communities.leiden import LeidenConfig
from services.communities.structure import Structure, compute_structure
from tests.unit.test_communities_leiden import planted

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # as the benches run
from incremental_leiden import Incremental, near, node_ids, previous_of

# leidenalg is a declared dependency (pyproject.toml): a missing one fails here, not skips.

CONFIG = LeidenConfig(max_sizes=(10,), seed=42)


def with_edges(rows: GraphRows, pairs: list[tuple[int, int]], weight: float) -> GraphRows:
    """``rows`` plus one relationship per (node index, node index) pair."""
    ids = rows.entity_ids
    src = np.array([ids[a] for a, _ in pairs], dtype=np.int64)
    dst = np.array([ids[b] for _, b in pairs], dtype=np.int64)
    start = int(rows.rel_ids.max()) + 1
    return GraphRows(
        rows.entity_ids,
        rows.entity_digests,
        np.concatenate([rows.rel_ids, np.arange(start, start + len(pairs), dtype=np.int64)]),
        np.concatenate([rows.rel_src, src]),
        np.concatenate([rows.rel_dst, dst]),
        np.concatenate([rows.rel_weight, np.full(len(pairs), weight)]),
        np.concatenate([rows.rel_digests, np.zeros(len(pairs), dtype="V16")]),
    )


def incremental(
    old: Structure, rows: GraphRows, touched: list[int], radius: int, *, splits: bool = True
) -> tuple[Structure, np.ndarray]:
    """The incremental recompute of ``rows`` from ``old``; returns it and the moving mask."""
    first = compute_structure(rows, None, CONFIG, 0.3, 1)  # only for its graph's edges
    graph = first.graph
    seeds = np.isin(np.arange(graph.n), touched)
    moving = near(graph.src, graph.dst, seeds, radius)
    old_at = [node_ids(old, level) for level in range(len(old.levels))]
    next_id = max(int(level.ids.max()) for level in old.levels) + 1
    with Incremental(old_at, moving, splits=splits, seed=CONFIG.seed):
        new = compute_structure(rows, previous_of(old), CONFIG, 0.3, next_id)
    return new, moving


def local_change() -> tuple[Structure, GraphRows, list[int]]:
    """Eight groups of 25; then nodes 0-4 (group 0) tied strongly to nodes 25-29 (group 1)."""
    rows = planted(8, 25, 0.3, 0.01, seed=1)
    old = compute_structure(rows, None, CONFIG, 0.3, 1)
    pairs = [(a, b) for a in range(5) for b in range(25, 30)]
    return old, with_edges(rows, pairs, 5.0), sorted({n for pair in pairs for n in pair})


def test_near_grows_by_hops() -> None:
    src, dst = np.arange(5, dtype=np.int64), np.arange(1, 6, dtype=np.int64)  # a path 0-5
    seeds = np.zeros(6, dtype=bool)
    seeds[0] = True
    assert np.flatnonzero(near(src, dst, seeds, 0)).tolist() == [0]
    assert np.flatnonzero(near(src, dst, seeds, 2)).tolist() == [0, 1, 2]


def test_fixed_nodes_keep_their_level0_community() -> None:
    old, rows, touched = local_change()
    new, moving = incremental(old, rows, touched, radius=0)
    before, after = node_ids(old, 0), node_ids(new, 0)
    fixed = ~moving & (before >= 0)
    assert fixed.sum() == 200 - len(touched)
    assert np.array_equal(before[fixed], after[fixed])


def test_a_local_change_moves_only_nearby_nodes() -> None:
    old, rows, touched = local_change()
    for radius in (0, 1):
        new, moving = incremental(old, rows, touched, radius=radius)
        for level in range(min(len(old.levels), len(new.levels))):
            changed = node_ids(old, level) != node_ids(new, level)
            if level == 0:
                assert not (changed & ~moving).any(), radius
            # Deeper levels: ids may follow their parent, but far nodes do not move.
            far = ~near(new.graph.src, new.graph.dst, moving, 1)
            assert not (changed & far & (node_ids(old, level) >= 0)).any(), (radius, level)


def test_the_change_is_taken_up() -> None:
    """The strongly tied nodes end up together (the update is not a no-op)."""
    old, rows, touched = local_change()
    new, _ = incremental(old, rows, touched, radius=1)
    after = node_ids(new, 0)
    assert len(set(after[touched].tolist())) == 1


def test_same_seed_same_answer() -> None:
    old, rows, touched = local_change()
    a, _ = incremental(old, rows, touched, radius=1)
    b, _ = incremental(old, rows, touched, radius=1)
    assert len(a.levels) == len(b.levels)
    for x, y in zip(a.levels, b.levels, strict=True):
        assert np.array_equal(x.labels, y.labels)
        assert np.array_equal(x.ids, y.ids)


def test_the_service_path_is_restored_after_the_context() -> None:
    original = leiden._leiden
    old, rows, touched = local_change()
    incremental(old, rows, touched, radius=0)
    assert leiden._leiden is original
    again = compute_structure(rows, previous_of(old), CONFIG, 0.3, 10_000)
    repeat = compute_structure(rows, previous_of(old), CONFIG, 0.3, 10_000)
    assert np.array_equal(again.levels[0].labels, repeat.levels[0].labels)
