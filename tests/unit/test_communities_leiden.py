"""Hierarchical Leiden and the graph it runs on: deterministic, order-independent, nested,
bounded in size, and warm-startable."""

from __future__ import annotations

import numpy as np
import pytest

from services.communities.graph import GraphRows, build_graph, pagerank, undirected_edges
from services.communities.leiden import LeidenConfig, canonical, hierarchical_leiden


def planted(groups: int, size: int, p_in: float, p_out: float, seed: int = 1) -> GraphRows:
    """Entities 10, 20, ... in ``groups`` dense groups with sparse links between them."""
    rng = np.random.default_rng(seed)
    n = groups * size
    a, b = np.triu_indices(n, 1)
    same = a // size == b // size
    keep = rng.random(len(a)) < np.where(same, p_in, p_out)
    a, b = a[keep], b[keep]
    ids = (np.arange(n, dtype=np.int64) + 1) * 10
    return GraphRows(
        entity_ids=ids,
        entity_digests=np.frombuffer(rng.bytes(16 * n), dtype="V16"),
        rel_ids=np.arange(1, len(a) + 1, dtype=np.int64),
        rel_src=ids[a],
        rel_dst=ids[b],
        rel_weight=rng.integers(1, 4, len(a)).astype(np.float64),
        rel_digests=np.frombuffer(rng.bytes(16 * len(a)), dtype="V16"),
    )


def shuffled(rows: GraphRows, seed: int = 2) -> GraphRows:
    rng = np.random.default_rng(seed)
    e, r = rng.permutation(len(rows.entity_ids)), rng.permutation(len(rows.rel_ids))
    return GraphRows(
        rows.entity_ids[e],
        rows.entity_digests[e],
        rows.rel_ids[r],
        rows.rel_src[r],
        rows.rel_dst[r],
        rows.rel_weight[r],
        rows.rel_digests[r],
    )


def run(rows: GraphRows, **config: object) -> list[np.ndarray]:
    g = build_graph(rows)
    h = hierarchical_leiden(g.n, g.src, g.dst, g.weight, config=LeidenConfig(**config))  # type: ignore[arg-type]
    return h.labels


def test_undirected_edges_merge_directions_and_types_and_drop_loops() -> None:
    src = np.array([0, 1, 0, 2, 2], dtype=np.int64)
    dst = np.array([1, 0, 1, 2, 0], dtype=np.int64)
    w = np.array([1.0, 2.0, 0.5, 9.0, 1.0])
    s, d, weight = undirected_edges(3, src, dst, w)
    assert s.tolist() == [0, 0]
    assert d.tolist() == [1, 2]
    assert weight.tolist() == [3.5, 1.0]


def test_unknown_entity_in_a_relationship_is_an_error() -> None:
    rows = planted(2, 5, 0.9, 0.0)
    bad = GraphRows(
        rows.entity_ids[:-1],
        rows.entity_digests[:-1],
        rows.rel_ids,
        rows.rel_src,
        rows.rel_dst,
        rows.rel_weight,
        rows.rel_digests,
    )
    with pytest.raises(ValueError, match="not in the snapshot"):
        build_graph(bad)


def test_planted_groups_are_found_at_level_0() -> None:
    labels = run(planted(4, 12, 0.8, 0.01), max_sizes=(100,))
    assert len(labels) == 1  # nothing above the size bound: no second level
    groups = [set(labels[0][i * 12 : (i + 1) * 12].tolist()) for i in range(4)]
    assert all(len(g) == 1 for g in groups)
    assert len(set().union(*groups)) == 4


def test_same_input_in_any_order_gives_the_same_hierarchy() -> None:
    rows = planted(6, 20, 0.4, 0.02)
    first = run(rows, max_sizes=(8,))
    again = run(shuffled(rows), max_sizes=(8,))
    assert len(first) == len(again) >= 2
    for a, b in zip(first, again, strict=True):
        assert a.tolist() == b.tolist()


def test_seed_is_the_only_source_of_randomness() -> None:
    rows = planted(6, 20, 0.3, 0.05)
    assert [x.tolist() for x in run(rows, seed=7)] == [x.tolist() for x in run(rows, seed=7)]


def test_levels_nest_and_respect_the_size_bound() -> None:
    rows = planted(5, 30, 0.3, 0.02)
    g = build_graph(rows)
    h = hierarchical_leiden(g.n, g.src, g.dst, g.weight, config=LeidenConfig(max_sizes=(20, 6)))
    assert h.levels >= 3
    for level in range(1, h.levels):
        child, parent = h.labels[level], h.labels[level - 1]
        members = child >= 0
        assert (parent[members] >= 0).all()  # children live inside parents
        assert (h.parents[level][child[members]] == parent[members]).all()
        sizes = np.bincount(parent[parent >= 0])
        split = set(np.unique(parent[members]).tolist())
        bound = (20, 6)[min(level - 1, 1)]
        # Only communities above the bound split, and each splits into at least two.
        assert all(sizes[c] > bound for c in split)
        for c in split:
            assert len(np.unique(child[parent == c])) >= 2


def test_isolated_entities_belong_to_no_community() -> None:
    rows = planted(2, 6, 1.0, 0.0)
    extra = GraphRows(
        np.append(rows.entity_ids, 999),
        np.append(rows.entity_digests, np.frombuffer(b"x" * 16, dtype="V16")),
        rows.rel_ids,
        rows.rel_src,
        rows.rel_dst,
        rows.rel_weight,
        rows.rel_digests,
    )
    labels = run(extra)
    assert labels[0][-1] == -1
    assert (labels[0][:-1] >= 0).all()


def test_labels_are_numbered_by_first_member() -> None:
    assert canonical(np.array([5, 5, -1, 2, 9, 2])).tolist() == [0, 0, -1, 1, 2, 1]


def test_warm_start_from_a_good_partition_keeps_it() -> None:
    rows = planted(5, 15, 0.7, 0.02)
    g = build_graph(rows)
    truth = np.repeat(np.arange(5), 15)
    h = hierarchical_leiden(
        g.n, g.src, g.dst, g.weight, config=LeidenConfig(max_sizes=(100,)), guide=_Start(truth)
    )
    assert canonical(truth).tolist() == h.labels[0].tolist()


def test_pagerank_sums_to_one_and_favours_hubs() -> None:
    ids = np.arange(1, 6, dtype=np.int64)
    star = GraphRows(
        ids,
        np.frombuffer(b"d" * 80, dtype="V16"),
        np.arange(1, 5, dtype=np.int64),
        np.ones(4, dtype=np.int64),
        ids[1:],
        np.ones(4),
        np.frombuffer(b"r" * 64, dtype="V16"),
    )
    ranks = pagerank(build_graph(star))
    assert ranks.sum() == pytest.approx(1.0)
    assert ranks.argmax() == 0


class _Start:
    def __init__(self, membership: np.ndarray) -> None:
        self.membership = membership

    def level0_start(self) -> np.ndarray:
        return self.membership

    def split_start(self, _level: int) -> None:
        return None

    def fixed(self, _level: int, _parent_labels: np.ndarray, _parents: int) -> None:
        return None
