"""Community fingerprints: members, their name+description digests and internal
relationships decide them; row order, outside edges and other communities do not."""

from __future__ import annotations

import dataclasses

import numpy as np

from services.communities.fingerprint import _EDGE, edge_order, level_fingerprints
from services.communities.graph import GraphRows, build_graph
from tests.unit.test_communities_leiden import planted, shuffled

LABELS = np.repeat(np.arange(3, dtype=np.int64), 8)  # 3 communities of 8 entities


def prints(rows: GraphRows) -> list[str]:
    return level_fingerprints(build_graph(rows), LABELS, 3)


def digest(byte: bytes) -> np.void:
    value: np.void = np.frombuffer(byte * 16, dtype="V16")[0]
    return value


def test_row_order_does_not_matter() -> None:
    rows = planted(3, 8, 0.6, 0.1)
    assert prints(rows) == prints(shuffled(rows))


def test_a_member_description_changes_only_its_community() -> None:
    rows = planted(3, 8, 0.6, 0.1)
    digests = rows.entity_digests.copy()
    digests[9] = digest(b"z")  # entity 9 is in community 1
    after = prints(dataclasses.replace(rows, entity_digests=digests))
    before = prints(rows)
    assert [a == b for a, b in zip(before, after, strict=True)] == [True, False, True]


def test_internal_edge_weight_counts_outside_edges_do_not() -> None:
    rows = planted(3, 8, 0.6, 0.1)
    src, dst = rows.rel_src // 10 - 1, rows.rel_dst // 10 - 1
    inside = np.flatnonzero((LABELS[src] == LABELS[dst]) & (LABELS[src] == 2))[0]
    outside = np.flatnonzero(LABELS[src] != LABELS[dst])[0]
    before = prints(rows)
    heavier = rows.rel_weight.copy()
    heavier[outside] += 5
    assert prints(dataclasses.replace(rows, rel_weight=heavier)) == before
    heavier[inside] += 5
    after = prints(dataclasses.replace(rows, rel_weight=heavier))
    assert after[2] != before[2]
    assert after[:2] == before[:2]


def test_relationship_type_change_counts() -> None:
    rows = planted(3, 8, 0.6, 0.0)
    digests = rows.rel_digests.copy()
    digests[0] = digest(b"t")
    assert prints(dataclasses.replace(rows, rel_digests=digests)) != prints(rows)


def test_membership_changes_the_fingerprint_and_equal_facts_give_equal_prints() -> None:
    rows = planted(3, 8, 0.6, 0.1)
    graph = build_graph(rows)
    moved = LABELS.copy()
    moved[0] = 1
    a = level_fingerprints(graph, LABELS, 3)
    b = level_fingerprints(graph, moved, 3)
    assert a[0] != b[0]
    assert a[1] != b[1]
    assert a[2] == b[2]
    assert level_fingerprints(graph, LABELS, 3) == a


def test_edge_order_is_the_full_lexicographic_order() -> None:
    # Few endpoint pairs, weights and digests: many partial and complete ties.
    rng = np.random.default_rng(3)
    m, n = 2000, 6
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    edges = np.empty(m, dtype=_EDGE)
    edges["src"], edges["dst"] = src * 10, dst * 10
    edges["weight"] = rng.integers(1, 3, m).astype(np.float64)
    two = np.frombuffer(b"a" * 16 + b"b" * 16, dtype="V16")
    edges["digest"] = two[rng.integers(0, 2, m)]
    words = edges["digest"].copy().view("<u8").reshape(-1, 2)
    full = np.lexsort((words[:, 1], words[:, 0], edges["weight"], edges["dst"], edges["src"]))
    assert edge_order(n, src, dst, edges).tolist() == full.tolist()
    distinct = np.arange(m, dtype=np.int64)  # no ties: the argsort alone
    assert edge_order(m, distinct, distinct[::-1].copy(), edges).tolist() == distinct.tolist()
