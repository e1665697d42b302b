"""Stale community reports of the published snapshot: a report is stale when its community's
facts changed since it was written, i.e. the fingerprint of its (old) members and their internal
relationships, computed over the graph as it is now, differs from the one stored with it (the
same fingerprint the recompute reuses reports by). A deleted member, a changed member
description, or an added, removed or changed relationship between two members all count."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from services.communities import loader
from services.communities.fingerprint import Fingerprinter
from services.communities.graph import Graph, build_graph
from services.communities.structure import PreviousSnapshot
from services.core.db.snapshots import graph_snapshot


@dataclass(frozen=True)
class Staleness:
    """Of the published snapshot: communities, stale ones, and the stale ones per level."""

    snapshot_id: int | None
    communities: int
    stale: int
    stale_by_level: dict[int, int]

    def to_json(self) -> dict[str, object]:
        return {
            "snapshot_id": self.snapshot_id,
            "communities": self.communities,
            "stale": self.stale,
            "stale_by_level": self.stale_by_level,
        }


def stale_flags(graph: Graph, previous: PreviousSnapshot) -> list[bool]:
    """Per community of ``previous`` (in its order): does its fingerprint over ``graph``
    differ from the stored one?"""
    printer = Fingerprinter(graph)
    idx = np.searchsorted(graph.node_ids, previous.member_entity)
    idx = np.minimum(idx, max(graph.n - 1, 0))
    alive = graph.node_ids[idx] == previous.member_entity if graph.n else idx < 0
    flags = [False] * len(previous.community_ids)
    for level in np.unique(previous.community_levels).tolist():
        positions = np.flatnonzero(previous.community_levels == level)
        ids = previous.community_ids[positions]
        order = np.argsort(ids)  # labels are positions in ``ids``
        where = np.searchsorted(ids[order], previous.member_community)
        where = np.minimum(where, len(ids) - 1)
        mine = alive & (ids[order][where] == previous.member_community)
        labels = np.full(graph.n, -1, dtype=np.int64)
        labels[idx[mine]] = order[where[mine]]
        prints = printer.level(labels, len(ids))
        for label, position in enumerate(positions.tolist()):
            flags[position] = prints[label] != previous.community_fingerprints[position]
    return flags


async def staleness(engine: AsyncEngine) -> Staleness:
    """Count the published snapshot's stale reports against the live graph."""
    async with graph_snapshot(engine) as (conn, _):
        rows = await loader.load_graph_rows(conn)
        previous = await loader.load_previous(conn)
    if previous is None:
        return Staleness(None, 0, 0, {})
    old = previous.structure
    flags = stale_flags(build_graph(rows), old)
    by_level: dict[int, int] = {}
    for level, stale in zip(old.community_levels.tolist(), flags, strict=True):
        if stale:
            by_level[int(level)] = by_level.get(int(level), 0) + 1
    return Staleness(previous.snapshot_id, len(flags), sum(flags), dict(sorted(by_level.items())))
