"""The CPU-heavy part of a recompute as one pure function (run in a worker process): graph,
hierarchical Leiden, PageRank, stable ids, fingerprints. Input and output are plain picklable
arrays.

Unchanged regions keep their communities: level 0 is warm-started from the previous level-0
membership; a community whose fingerprint equals an old community's keeps that community's
children as they were (the split of an unchanged induced subgraph is not re-rolled); other
splits are warm-started from the old membership one level down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from services.communities.fingerprint import Fingerprinter
from services.communities.graph import (
    F64,
    I64,
    Graph,
    GraphRows,
    build_graph,
    pagerank,
    to_igraph,
)
from services.communities.leiden import Fixed, LeidenConfig, hierarchical_leiden
from services.communities.stable_ids import OldLevel, match_level


@dataclass(frozen=True)
class PreviousSnapshot:
    """The published snapshot's communities: membership rows and one row per community."""

    member_community: I64
    member_entity: I64
    community_ids: I64
    community_levels: I64
    community_sizes: I64
    community_parents: I64  # -1 at level 0
    community_fingerprints: list[str]


@dataclass(frozen=True)
class Level:
    """One level of the new hierarchy; arrays are indexed by the level's label."""

    labels: I64  # per node, -1 = not in a community at this level
    ids: I64
    parent_ids: I64  # -1 at level 0
    sizes: I64
    fingerprints: list[str]


@dataclass(frozen=True)
class Structure:
    """Everything a snapshot stores except the reports."""

    graph: Graph
    pagerank: F64
    levels: list[Level]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def community_count(self) -> int:
        return sum(len(level.ids) for level in self.levels)


@dataclass(frozen=True)
class _Old:
    at: list[I64]  # per old level: node -> old community id, or -1
    levels: list[OldLevel]
    by_fingerprint: dict[str, tuple[int, bool]]  # fingerprint -> (old level, has children)


def compute_structure(
    rows: GraphRows,
    previous: PreviousSnapshot | None,
    config: LeidenConfig,
    min_jaccard: float,
    next_id: int,
) -> Structure:
    """Build the graph and its community hierarchy with ids stable against ``previous``."""
    t0 = time.perf_counter()
    graph = build_graph(rows)
    old = _old(graph, previous)
    t1 = time.perf_counter()
    guide = _Guide(graph, old)
    base = to_igraph(graph.n, graph.src, graph.dst)
    hierarchy = hierarchical_leiden(
        graph.n, graph.src, graph.dst, graph.weight, config=config, guide=guide, base=base
    )
    t2 = time.perf_counter()
    ranks = pagerank(graph, base)
    t3 = time.perf_counter()
    levels: list[Level] = []
    for number, lab in enumerate(hierarchy.labels):
        count = len(hierarchy.parents[number])
        old_level = old.levels[number] if number < len(old.levels) else None
        ids, next_id = match_level(lab, old_level, min_jaccard, next_id)
        parents = hierarchy.parents[number]
        parent_ids = levels[-1].ids[parents] if number else np.full(count, -1, dtype=np.int64)
        prints = guide.level_fingerprints(number, lab, count)
        levels.append(Level(lab, ids, parent_ids, hierarchy.sizes(number), prints))
    t4 = time.perf_counter()
    timings = {"graph_s": t1 - t0, "leiden_s": t2 - t1, "pagerank_s": t3 - t2, "ids_s": t4 - t3}
    return Structure(graph=graph, pagerank=ranks, levels=levels, timings=timings)


class _Guide:
    """Warm starts and reused splits from the previous snapshot; caches the fingerprints."""

    def __init__(self, graph: Graph, old: _Old) -> None:
        self.printer = Fingerprinter(graph)
        self.old = old
        self.fingerprints: dict[int, list[str]] = {}

    def level_fingerprints(self, level: int, labels: I64, count: int) -> list[str]:
        if level not in self.fingerprints:
            self.fingerprints[level] = self.printer.level(labels, count)
        return self.fingerprints[level]

    def level0_start(self) -> I64 | None:
        if not self.old.at:
            return None
        start = self.old.at[0].copy()  # nodes without an old community start alone
        fresh = np.flatnonzero(start < 0)
        base = int(start.max()) + 1 if len(start) else 0
        start[fresh] = base + np.arange(len(fresh))
        return start

    def split_start(self, level: int) -> I64 | None:
        return self.old.at[level] if level < len(self.old.at) else None

    def fixed(self, level: int, parent_labels: I64, parents: int) -> Fixed | None:
        """Parents whose fingerprint an old community had keep that community's children."""
        prints = self.level_fingerprints(level - 1, parent_labels, parents)
        by_fp = self.old.by_fingerprint
        reused = [(c, by_fp[f]) for c, f in enumerate(prints) if f in by_fp]
        if not reused:
            return None
        keep = np.zeros(parents, dtype=bool)
        child = np.full(len(parent_labels), -1, dtype=np.int64)
        order = np.argsort(parent_labels, kind="stable")
        bounds = np.searchsorted(parent_labels[order], np.arange(parents + 1))
        for c, (old_level, has_children) in reused:
            keep[c] = True
            if has_children:
                nodes = order[bounds[c] : bounds[c + 1]]
                child[nodes] = self.old.at[old_level + 1][nodes]
        return Fixed(parents=keep, child=child)


def _old(graph: Graph, previous: PreviousSnapshot | None) -> _Old:
    if previous is None or len(previous.community_ids) == 0:
        return _Old(at=[], levels=[], by_fingerprint={})
    order = np.argsort(previous.community_ids, kind="stable")
    ids, levels = previous.community_ids[order], previous.community_levels[order]
    sizes = previous.community_sizes[order]
    member_level = levels[np.searchsorted(ids, previous.member_community)]
    idx = np.searchsorted(graph.node_ids, previous.member_entity)
    idx = np.minimum(idx, max(graph.n - 1, 0))
    alive = graph.node_ids[idx] == previous.member_entity if graph.n else idx < 0
    at: list[I64] = []
    old_levels: list[OldLevel] = []
    for number in range(int(levels.max()) + 1):
        mine = alive & (member_level == number)
        node_map = np.full(graph.n, -1, dtype=np.int64)
        node_map[idx[mine]] = previous.member_community[mine]
        at.append(node_map)
        in_level = levels == number
        old_levels.append(
            OldLevel(idx[mine], previous.member_community[mine], ids[in_level], sizes[in_level])
        )
    with_children = set(previous.community_parents[previous.community_parents >= 0].tolist())
    by_fingerprint = {
        fp: (int(level), int(cid) in with_children)
        for cid, level, fp in zip(
            previous.community_ids.tolist(),
            previous.community_levels.tolist(),
            previous.community_fingerprints,
            strict=True,
        )
    }
    return _Old(at=at, levels=old_levels, by_fingerprint=by_fingerprint)
