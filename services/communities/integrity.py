"""What the dropped foreign keys of a snapshot's rows used to guarantee (migration 0009), and
more, checked once over the whole structure with numpy before anything is written: community
ids are unique in the snapshot, every membership names a community of its level, every parent
is a community one level up, and members nest (a node in a community is in its parent).

Memberships and per-entity rows are derived from the same labels as the communities, so this
holds by construction; the check keeps it so if the engine changes."""

from __future__ import annotations

import numpy as np

from services.communities.structure import Structure


class InconsistentSnapshot(ValueError):
    """The structure would write rows that do not fit together; nothing was written."""


def check_structure(structure: Structure) -> None:
    """Raise ``InconsistentSnapshot`` if the rows built from ``structure`` would not fit."""
    n = structure.graph.n
    all_ids = [level.ids for level in structure.levels]
    ids = np.concatenate(all_ids) if all_ids else np.zeros(0, dtype=np.int64)
    if len(np.unique(ids)) != len(ids) or (len(ids) and ids.min() < 0):
        raise InconsistentSnapshot("community ids are not unique and non-negative")
    if len(structure.pagerank) != n:
        raise InconsistentSnapshot("PageRank is not given for every entity")
    for number, level in enumerate(structure.levels):
        count = len(level.ids)
        if len(level.labels) != n or len(level.parent_ids) != count:
            raise InconsistentSnapshot(f"level {number}: arrays of the wrong length")
        if len(level.sizes) != count or len(level.fingerprints) != count:
            raise InconsistentSnapshot(f"level {number}: arrays of the wrong length")
        labels = level.labels
        if len(labels) and (labels.min() < -1 or labels.max() >= count):
            raise InconsistentSnapshot(f"level {number}: a membership names no community")
        if not np.array_equal(np.bincount(labels[labels >= 0], minlength=count), level.sizes):
            raise InconsistentSnapshot(f"level {number}: sizes differ from the memberships")
        if number == 0:
            if np.any(level.parent_ids != -1):
                raise InconsistentSnapshot("level 0 communities have parents")
            continue
        above = structure.levels[number - 1]
        if not np.all(np.isin(level.parent_ids, above.ids)):
            raise InconsistentSnapshot(f"level {number}: a parent is not on level {number - 1}")
        members = np.flatnonzero(labels >= 0)
        parent_labels = above.labels[members]
        if np.any(parent_labels < 0) or not np.array_equal(
            above.ids[parent_labels], level.parent_ids[labels[members]]
        ):
            raise InconsistentSnapshot(f"level {number}: members are not in the parent")
