"""Stable community ids: a new community inherits the id of the old community (same level) it
overlaps most, by Jaccard similarity of members, matched greedily best-first; the rest get new
ids. Pure and deterministic (ties broken by overlap, then by label and id)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.communities.graph import I64


@dataclass(frozen=True)
class OldLevel:
    """One level of the previous snapshot: membership pairs restricted to entities that still
    exist (as node indices), and every old community's full size (departed members count)."""

    member_nodes: I64
    member_ids: I64
    ids: I64
    sizes: I64


def match_level(
    labels: I64, old: OldLevel | None, min_jaccard: float, next_id: int
) -> tuple[I64, int]:
    """Ids for the level's communities (indexed by label) and the next unused id."""
    count = int(labels.max()) + 1 if len(labels) and labels.max() >= 0 else 0
    ids = np.full(count, -1, dtype=np.int64)
    if count and old is not None and len(old.ids):
        for label, old_id in _greedy_pairs(labels, count, old, min_jaccard):
            ids[label] = old_id
    fresh = np.flatnonzero(ids < 0)
    ids[fresh] = np.arange(next_id, next_id + len(fresh), dtype=np.int64)
    return ids, next_id + len(fresh)


def _greedy_pairs(
    labels: I64, count: int, old: OldLevel, min_jaccard: float
) -> list[tuple[int, int]]:
    new_sizes = np.bincount(labels[labels >= 0], minlength=count)
    old_order = np.argsort(old.ids, kind="stable")
    old_ids, old_sizes = old.ids[old_order], old.sizes[old_order]
    new_label = labels[old.member_nodes]
    keep = new_label >= 0
    old_index = np.searchsorted(old_ids, old.member_ids[keep])
    key = new_label[keep] * len(old_ids) + old_index
    pair_keys, inter = np.unique(key, return_counts=True)
    pair_new, pair_old = pair_keys // len(old_ids), pair_keys % len(old_ids)
    jaccard = inter / (new_sizes[pair_new] + old_sizes[pair_old] - inter)
    ok = jaccard >= min_jaccard
    pair_new, pair_old, inter, jaccard = pair_new[ok], pair_old[ok], inter[ok], jaccard[ok]
    order = np.lexsort((old_ids[pair_old], pair_new, -inter, -jaccard))
    taken_new: set[int] = set()
    taken_old: set[int] = set()
    matched: list[tuple[int, int]] = []
    for i in order.tolist():
        new, old_i = int(pair_new[i]), int(pair_old[i])
        if new in taken_new or old_i in taken_old:
            continue
        taken_new.add(new)
        taken_old.add(old_i)
        matched.append((new, int(old_ids[old_i])))
    return matched
