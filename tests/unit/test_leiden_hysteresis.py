"""Hysteresis of warm-started splits (services/communities/leiden.py, issue 21 deliverable 6):
a parent keeps its previous children, repaired for new members, unless Leiden's new split is
better by the margin; the quality compared is the one the splits optimise."""

from __future__ import annotations

import numpy as np

from services.communities.leiden import (
    Fixed,
    LeidenConfig,
    _quality,
    _repaired,
    hierarchical_leiden,
)

INT = np.int64


def test_a_new_member_joins_the_previous_child_it_is_most_tied_to() -> None:
    # parent 0: nodes 0-4; old children {0, 1} and {2, 3}; node 4 is new, tied to 2 and 3
    old = np.array([5, 5, 7, 7, -1], dtype=INT)
    parent = np.zeros(5, dtype=INT)
    s = np.array([0, 2, 1, 3], dtype=INT)
    d = np.array([1, 3, 4, 4], dtype=INT)
    w = np.array([1.0, 1.0, 0.5, 2.0])
    labels = _repaired(old, parent, s, d, w)
    assert labels[0] == labels[1] != labels[2]
    assert labels[4] == labels[2] == labels[3]  # 2.0 to child {2, 3} beats 0.5 to {0, 1}


def test_a_member_with_no_ties_stays_alone_and_children_never_cross_parents() -> None:
    old = np.array([1, 1, -1, 1], dtype=INT)
    parent = np.array([0, 0, 0, 1], dtype=INT)  # node 3 had child 1 too, under another parent
    s, d, w = np.array([0], dtype=INT), np.array([1], dtype=INT), np.array([1.0])
    labels = _repaired(old, parent, s, d, w)
    assert labels[0] == labels[1]
    assert len({labels[1], labels[2], labels[3]}) == 3


def test_quality_is_twice_the_inside_weight_less_the_squared_node_weights() -> None:
    part = np.array([0, 0, 1, 2], dtype=INT)
    parent = np.array([0, 0, 0, 1], dtype=INT)
    s, d, w = np.array([0, 1], dtype=INT), np.array([1, 2], dtype=INT), np.array([3.0, 1.0])
    node_weights = np.array([1.0, 2.0, 0.5, 1.0])
    q = _quality(part, parent, (s, d, w), node_weights, 0.5)
    assert np.allclose(q, [2 * 3.0 - 0.5 * ((1 + 2) ** 2 + 0.5**2), -0.5 * 1.0])


def _planted(rng: np.random.Generator, groups: int, size: int) -> set[tuple[int, int]]:
    edges = set()
    for g in range(groups):
        nodes = range(g * size, (g + 1) * size)
        edges |= {(a, b) for a in nodes for b in nodes if a < b and rng.random() < 0.3}
    n = groups * size
    for _ in range(groups * 5):
        a, b = sorted(int(x) for x in rng.choice(n, 2, replace=False))
        edges.add((a, b))
    return edges


class _Guide:
    def __init__(self, labels: list[np.ndarray]) -> None:
        self.labels = labels

    def level0_start(self) -> np.ndarray:
        return self.labels[0]

    def split_start(self, level: int) -> np.ndarray | None:
        return self.labels[level] if level < len(self.labels) else None

    def fixed(self, level: int, parent_labels: np.ndarray, parents: int) -> Fixed | None:  # noqa: ARG002
        return None


def _run(edges: set[tuple[int, int]], n: int, config: LeidenConfig, guide: _Guide | None):  # type: ignore[no-untyped-def]
    pairs = np.array(sorted(edges), dtype=INT)
    return hierarchical_leiden(
        n, pairs[:, 0], pairs[:, 1], np.ones(len(pairs)), config=config, guide=guide
    )


def _kept_together(before: np.ndarray, after: np.ndarray) -> float:
    """Of the node pairs in one child before, the share still in one child after."""
    same = (before[:, None] == before[None, :]) & (before[:, None] >= 0)
    np.fill_diagonal(same, False)
    return float(((after[:, None] == after[None, :]) & same).sum() / max(same.sum(), 1))


def test_hysteresis_keeps_the_deeper_levels_that_plain_warm_starts_reshuffle() -> None:
    rng = np.random.default_rng(3)
    n = 4 * 40
    edges = _planted(rng, 4, 40)
    config = LeidenConfig(max_sizes=(10,), seed=42)
    first = _run(edges, n, config, None)
    assert first.levels >= 2
    churned = {e for e in edges if rng.random() > 0.1}
    for _ in range(60):
        a, b = sorted(int(x) for x in rng.choice(40, 2, replace=False))
        churned.add((a, b))
    guide = _Guide(first.labels)
    warm = _run(churned, n, config, guide)
    keep = _run(churned, n, LeidenConfig(max_sizes=(10,), seed=42, resplit_margin=1e9), guide)
    for level in range(1, min(warm.levels, keep.levels, first.levels)):
        assert _kept_together(first.labels[level], keep.labels[level]) >= _kept_together(
            first.labels[level], warm.labels[level]
        )
    # an infinite margin keeps every previous split its parent still holds
    assert _kept_together(first.labels[1], keep.labels[1]) > 0.9
