"""Stable community ids (Jaccard, greedy) and the structure step that keeps unchanged regions
as they were: same graph, same communities, same ids, same fingerprints."""

from __future__ import annotations

import numpy as np

from services.communities.graph import GraphRows
from services.communities.leiden import LeidenConfig
from services.communities.stable_ids import OldLevel, match_level
from services.communities.structure import PreviousSnapshot, Structure, compute_structure
from tests.unit.test_communities_leiden import planted


def old_level(groups: dict[int, list[int]], sizes: dict[int, int] | None = None) -> OldLevel:
    nodes = [n for members in groups.values() for n in members]
    ids = [cid for cid, members in groups.items() for _ in members]
    keys = sorted(groups)
    return OldLevel(
        member_nodes=np.array(nodes, dtype=np.int64),
        member_ids=np.array(ids, dtype=np.int64),
        ids=np.array(keys, dtype=np.int64),
        sizes=np.array([(sizes or {}).get(k, len(groups[k])) for k in keys], dtype=np.int64),
    )


def test_unchanged_membership_keeps_ids_and_new_ones_count_up() -> None:
    labels = np.array([0, 0, 1, 1, 2, -1], dtype=np.int64)
    old = old_level({70: [0, 1], 71: [2, 3]})
    ids, next_id = match_level(labels, old, 0.3, next_id=100)
    assert ids.tolist() == [70, 71, 100]
    assert next_id == 101


def test_best_overlap_wins_and_each_old_id_is_used_once() -> None:
    # Old 50 = {0..5} split into {0..3} and {4, 5}: the larger part keeps the id.
    labels = np.array([0, 0, 0, 0, 1, 1], dtype=np.int64)
    ids, _ = match_level(labels, old_level({50: [0, 1, 2, 3, 4, 5]}), 0.3, next_id=9)
    assert ids.tolist() == [50, 9]


def test_departed_members_still_count_in_the_old_size() -> None:
    # Old 60 had 10 members; 2 remain: Jaccard 2/10 is below the bound, so a new id.
    labels = np.array([0, 0], dtype=np.int64)
    ids, _ = match_level(labels, old_level({60: [0, 1]}, sizes={60: 10}), 0.3, next_id=1)
    assert ids.tolist() == [1]
    ids, _ = match_level(labels, old_level({60: [0, 1]}, sizes={60: 10}), 0.2, next_id=1)
    assert ids.tolist() == [60]


def test_ties_are_broken_deterministically() -> None:
    labels = np.array([0, 0, 1, 1], dtype=np.int64)
    old = old_level({8: [0, 2], 9: [1, 3]})  # every pair overlaps by one member
    first, _ = match_level(labels, old, 0.3, next_id=20)
    again, _ = match_level(labels, old, 0.3, next_id=20)
    assert first.tolist() == again.tolist() == [8, 9]


def previous_of(structure: Structure) -> PreviousSnapshot:
    member_community, member_entity, ids, levels, sizes, parents, prints = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    for number, level in enumerate(structure.levels):
        nodes = np.flatnonzero(level.labels >= 0)
        member_community.append(level.ids[level.labels[nodes]])
        member_entity.append(structure.graph.node_ids[nodes])
        ids.append(level.ids)
        levels.append(np.full(len(level.ids), number))
        sizes.append(level.sizes)
        parents.append(level.parent_ids)
        prints += level.fingerprints

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64)

    return PreviousSnapshot(
        cat(member_community),
        cat(member_entity),
        cat(ids),
        cat(levels),
        cat(sizes),
        cat(parents),
        prints,
    )


CONFIG = LeidenConfig(max_sizes=(12, 5))


def test_recompute_of_an_unchanged_graph_changes_nothing() -> None:
    rows = planted(8, 25, 0.35, 0.01)
    first = compute_structure(rows, None, CONFIG, 0.3, next_id=1)
    assert len(first.levels) >= 2
    second = compute_structure(rows, previous_of(first), CONFIG, 0.3, next_id=1000)
    assert len(second.levels) == len(first.levels)
    for a, b in zip(first.levels, second.levels, strict=True):
        assert a.ids.tolist() == b.ids.tolist()
        assert a.fingerprints == b.fingerprints
        assert a.parent_ids.tolist() == b.parent_ids.tolist()


def test_a_local_change_keeps_the_other_communities() -> None:
    rows = planted(8, 25, 0.35, 0.01)
    first = compute_structure(rows, None, CONFIG, 0.3, next_id=1)
    # One entity of the first group gets a new description.
    digests = rows.entity_digests.copy()
    digests[3] = np.frombuffer(b"n" * 16, dtype="V16")[0]
    changed = GraphRows(
        rows.entity_ids,
        digests,
        rows.rel_ids,
        rows.rel_src,
        rows.rel_dst,
        rows.rel_weight,
        rows.rel_digests,
    )
    second = compute_structure(changed, previous_of(first), CONFIG, 0.3, next_id=1000)
    old = {fp for level in first.levels for fp in level.fingerprints}
    top = second.levels[0].labels == second.levels[0].labels[3]  # entity 3's top community
    assert top.sum() < 0.25 * len(top)
    for level in second.levels:
        for label, fp in enumerate(level.fingerprints):
            members = level.labels == label
            if fp not in old:  # regenerated: only inside the changed top community
                assert top[members].all()
            else:  # kept: it cannot hold the changed entity
                assert not members[3]
    # The top level keeps its ids (same members but one description: matched by overlap).
    assert second.levels[0].ids.tolist() == first.levels[0].ids.tolist()


def test_new_ids_do_not_collide_with_old_ones() -> None:
    rows = planted(4, 10, 0.8, 0.01)
    first = compute_structure(rows, None, CONFIG, 0.3, next_id=1)
    other = planted(3, 10, 0.8, 0.01, seed=9)
    second = compute_structure(other, previous_of(first), CONFIG, 0.9, next_id=500)
    all_ids = np.concatenate([lv.ids for lv in second.levels])
    assert len(np.unique(all_ids)) == len(all_ids)
    assert (
        (all_ids >= 500) | np.isin(all_ids, np.concatenate([lv.ids for lv in first.levels]))
    ).all()
