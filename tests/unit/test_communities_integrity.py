"""The whole-structure check that replaced the snapshot tables' foreign keys (migration 0009):
a real hierarchy passes; each kind of row that would not fit is refused before any write."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from services.communities.integrity import InconsistentSnapshot, check_structure
from services.communities.leiden import LeidenConfig
from services.communities.structure import Level, Structure, compute_structure
from tests.unit.test_communities_leiden import planted


@pytest.fixture(scope="module")
def structure() -> Structure:
    built = compute_structure(
        planted(8, 25, 0.35, 0.01), None, LeidenConfig(max_sizes=(12, 5)), 0.3, next_id=1
    )
    assert len(built.levels) >= 2
    return built


def with_level(structure: Structure, number: int, **changes: object) -> Structure:
    levels = list(structure.levels)
    levels[number] = dataclasses.replace(levels[number], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(structure, levels=levels)


def test_a_computed_hierarchy_passes(structure: Structure) -> None:
    check_structure(structure)
    check_structure(dataclasses.replace(structure, levels=[]))


def test_a_membership_naming_no_community_is_refused(structure: Structure) -> None:
    level: Level = structure.levels[0]
    labels = level.labels.copy()
    labels[np.flatnonzero(labels >= 0)[0]] = len(level.ids)  # one past the last community
    with pytest.raises(InconsistentSnapshot, match="names no community"):
        check_structure(with_level(structure, 0, labels=labels))


def test_a_community_id_used_twice_is_refused(structure: Structure) -> None:
    ids = structure.levels[1].ids.copy()
    ids[0] = structure.levels[0].ids[0]
    with pytest.raises(InconsistentSnapshot, match="unique"):
        check_structure(with_level(structure, 1, ids=ids))


def test_a_parent_that_is_not_one_level_up_is_refused(structure: Structure) -> None:
    parents = structure.levels[1].parent_ids.copy()
    parents[0] = structure.levels[1].ids[0]
    with pytest.raises(InconsistentSnapshot, match="parent is not on level 0"):
        check_structure(with_level(structure, 1, parent_ids=parents))


def test_members_outside_their_parent_are_refused(structure: Structure) -> None:
    level = structure.levels[1]
    first_parent = level.parent_ids[0]
    other = next(p for p in structure.levels[0].ids if p != first_parent)
    parents = level.parent_ids.copy()
    parents[0] = other  # a real level-0 community, but not the one its members are in
    with pytest.raises(InconsistentSnapshot, match="members are not in the parent"):
        check_structure(with_level(structure, 1, parent_ids=parents))


def test_sizes_must_match_the_memberships(structure: Structure) -> None:
    sizes = structure.levels[0].sizes.copy()
    sizes[0] += 1
    with pytest.raises(InconsistentSnapshot, match="sizes"):
        check_structure(with_level(structure, 0, sizes=sizes))
