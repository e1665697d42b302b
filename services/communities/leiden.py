"""Hierarchical Leiden (igraph's C implementation), deterministic for a given input and seed.

Level 0 optimises modularity over the whole graph, optionally warm-started from a previous
membership. Every community larger than the level's size bound is split again on its own induced
subgraph, giving level 1, and so on; a warm-started split keeps the parent's previous children
unless the new split is better by ``LeidenConfig.resplit_margin`` (hysteresis). All the splits of
one level run as one igraph call on the disjoint union of the induced subgraphs, using CPM with
node weight ``k_i / sqrt(2 m_c)`` (``k_i`` the strength inside parent ``c``, ``m_c`` the parent's
internal weight): for pairs inside one parent that is exactly the modularity of the parent's
induced subgraph, and a pair across parents has no edge and a positive penalty, so it is never
merged. One call per level instead of one per community keeps the hierarchy fast at a million
edges.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import igraph as ig
import numpy as np
import numpy.typing as npt

from services.communities.graph import F64, I64, to_igraph

# igraph draws from one process-wide generator: serialise runs so each starts from its seed.
_RNG_LOCK = threading.Lock()


@dataclass(frozen=True)
class LeidenConfig:
    """Size bound and resolution per level (the last value repeats), depth, iterations, seed."""

    max_sizes: Sequence[int] = (10,)
    resolutions: Sequence[float] = (1.0,)
    max_levels: int = 5
    iterations: int = 3  # level 0, at most: enough for a warm start to keep an unchanged graph
    split_iterations: int = 1
    seed: int = 42
    # Hysteresis of warm-started splits: a parent keeps its previous children (repaired: new
    # nodes join the child they are most tied to) unless the new split raises the parent's
    # quality by more than this share of it (KGSTREAM_COMMUNITIES_RESPLIT_MARGIN). None: every
    # split is taken as Leiden gives it (a first build has no previous children anyway).
    resplit_margin: float | None = None

    def max_size(self, level: int) -> int:
        return self.max_sizes[min(level, len(self.max_sizes) - 1)]

    def resolution(self, level: int) -> float:
        return self.resolutions[min(level, len(self.resolutions) - 1)]


@dataclass(frozen=True)
class Hierarchy:
    """``labels[l][i]``: node i's community at level l (0..k_l-1, or -1 when node i is not in
    a level-l community: isolated, or its community was small enough not to split).
    ``parents[l][c]``: the level l-1 community containing level-l community c (-1 at level 0).
    Labels are numbered by each community's smallest node index, so they do not depend on
    igraph's internal order."""

    labels: list[I64]
    parents: list[I64]

    @property
    def levels(self) -> int:
        return len(self.labels)

    def sizes(self, level: int) -> I64:
        lab = self.labels[level]
        return np.bincount(lab[lab >= 0], minlength=len(self.parents[level])).astype(np.int64)


@dataclass(frozen=True)
class Fixed:
    """Children taken as they are: ``parents[c]`` marks parent labels not to run Leiden on,
    ``child[i]`` is node i's preset child key (-1: none; keys distinct across parents)."""

    parents: npt.NDArray[np.bool_]
    child: I64


class SplitGuide(Protocol):
    """What a previous run tells the next one (see structure.py); without one, all is cold."""

    def level0_start(self) -> I64 | None:
        """Warm start for level 0 (any non-negative ints per node) or None."""
        ...

    def split_start(self, level: int) -> I64 | None:
        """Warm start per node for the splits making ``level`` (-1 = none) or None."""
        ...

    def fixed(self, level: int, parent_labels: I64, parents: int) -> Fixed | None:
        """Children to take as they are when making ``level``, or None."""
        ...


def hierarchical_leiden(
    n: int,
    src: I64,
    dst: I64,
    weight: F64,
    *,
    config: LeidenConfig,
    guide: SplitGuide | None = None,
    base: ig.Graph | None = None,
) -> Hierarchy:
    """Communities of the undirected graph (``src < dst`` edges, sorted) at every level.
    ``base`` is that graph as igraph builds it (``to_igraph``), when the caller has it."""
    if n == 0 or len(src) == 0:
        return Hierarchy(labels=[], parents=[])
    graph = base if base is not None else to_igraph(n, src, dst)
    with seeded(config.seed):
        start = guide.level0_start() if guide else None
        first = level0(graph, src, dst, weight, config=config, initial=start)
        if not (first >= 0).any():
            return Hierarchy(labels=[], parents=[])
        labels, parents = [first], [np.full(int(first.max()) + 1, -1, dtype=np.int64)]
        while len(labels) < config.max_levels:
            number = len(labels)
            child = split(
                labels[-1],
                graph,
                (src, dst, weight),
                config=config,
                level=number,
                initial=guide.split_start(number) if guide else None,
                fixed=guide.fixed(number, labels[-1], len(parents[-1])) if guide else None,
            )
            if child is None:
                break
            labels.append(child[0])
            parents.append(child[1])
    return Hierarchy(labels=labels, parents=parents)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run igraph calls from a fresh generator seeded with ``seed`` (one run at a time)."""
    with _RNG_LOCK:
        ig.set_random_number_generator(random.Random(seed))  # noqa: S311 - not crypto
        try:
            yield
        finally:
            ig.set_random_number_generator(random)


def level0(
    graph: ig.Graph, src: I64, dst: I64, weight: F64, *, config: LeidenConfig, initial: I64 | None
) -> I64:
    """Level-0 labels (canonical; isolated nodes -1) by modularity over the whole graph. One
    Leiden iteration at a time, up to ``config.iterations``, stopping when an iteration changes
    nothing: a warm start on an unchanged graph costs one iteration and keeps its partition."""
    n = graph.vcount()
    weights = weight.tolist()
    resolution = config.resolution(0)
    membership = None if initial is None else _compact(initial)
    for _ in range(max(config.iterations, 1)):
        again = _leiden(graph, weights, resolution=resolution, modularity=True, initial=membership)
        settled = membership is not None and _same_partition(again, membership)
        membership = again
        if settled:
            break
    labels = np.zeros(n, dtype=np.int64) if membership is None else membership.copy()
    degree = np.bincount(src, minlength=n) + np.bincount(dst, minlength=n)
    labels[degree == 0] = -1  # isolated entities form no community
    return canonical(labels)


def split(
    lab: I64,
    graph: ig.Graph,
    edges: tuple[I64, I64, F64],
    *,
    config: LeidenConfig,
    level: int,
    initial: I64 | None = None,
    fixed: Fixed | None = None,
) -> tuple[I64, I64] | None:
    """Level ``level`` from level ``level - 1`` labels ``lab``: communities above the size
    bound split on their induced subgraphs; None when nothing splits. ``initial`` (per node,
    -1 = none) warm-starts the splits; ``fixed`` presets the children of some parents."""
    present = lab >= 0
    sizes = np.bincount(lab[present])
    splits = sizes > config.max_size(level - 1)
    if fixed is not None:
        splits &= ~fixed.parents
    run = np.zeros(len(lab), dtype=bool)
    run[present] = splits[lab[present]]
    sub = np.full(len(lab), -1, dtype=np.int64)
    if run.any():
        sub[run] = _cpm_split(lab, run, graph, edges, config=config, level=level, initial=initial)
    if fixed is not None:
        sub[fixed.child >= 0] = fixed.child[fixed.child >= 0]
    member = sub >= 0
    if not member.any():
        return None
    # A child is a (parent, sub-community) pair, so a child never crosses parents.
    pair = lab[member] * (int(sub.max()) + 1) + sub[member]
    uniq, pair_label = np.unique(pair, return_inverse=True)
    kids = np.bincount(uniq // (int(sub.max()) + 1), minlength=len(sizes))
    alone = kids[lab[member]] <= 1  # a parent Leiden could not split stays a leaf
    child = np.full(len(lab), -1, dtype=np.int64)
    child[np.flatnonzero(member)[~alone]] = pair_label[~alone]
    if not (child >= 0).any():
        return None
    child = canonical(child)
    child_parents = np.full(int(child.max()) + 1, -1, dtype=np.int64)
    child_parents[child[child >= 0]] = lab[child >= 0]
    return child, child_parents


def _cpm_split(
    lab: I64,
    run: npt.NDArray[np.bool_],
    graph: ig.Graph,
    edges: tuple[I64, I64, F64],
    *,
    config: LeidenConfig,
    level: int,
    initial: I64 | None,
) -> I64:
    """Sub-community per node of ``run`` (the nodes of the parents to split)."""
    src, dst, weight = edges
    inside = np.flatnonzero((lab[src] == lab[dst]) & run[src])
    # Vertices of the subgraph: the endpoints of its edges, in the whole graph's order.
    sub = graph.subgraph_edges(inside.tolist(), delete_vertices=True)
    kept = np.unique(np.concatenate([src[inside], dst[inside]]))
    s, d, w = np.searchsorted(kept, src[inside]), np.searchsorted(kept, dst[inside]), weight[inside]
    strength = np.bincount(s, w, len(kept)) + np.bincount(d, w, len(kept))
    parent = lab[kept]
    two_m = np.bincount(parent, strength)[parent]
    node_weights = np.divide(strength, np.sqrt(two_m), out=np.zeros_like(strength), where=two_m > 0)
    start = None
    if initial is not None:
        seed_labels = initial[kept].copy()
        loose = np.flatnonzero(seed_labels < 0)
        seed_labels[loose] = int(seed_labels.max()) + 1 + np.arange(len(loose))
        start = _compact(parent * (int(seed_labels.max()) + 1) + seed_labels)
    membership = _leiden(
        sub,
        w.tolist(),
        node_weights=node_weights.tolist(),
        resolution=config.resolution(level),
        modularity=False,
        initial=start,
        iterations=config.split_iterations,
    )
    if initial is not None and config.resplit_margin is not None:
        old = _repaired(initial[kept], parent, s, d, w)
        new_q = _quality(membership, parent, (s, d, w), node_weights, config.resolution(level))
        old_q = _quality(old, parent, (s, d, w), node_weights, config.resolution(level))
        keep = new_q - old_q <= config.resplit_margin * np.abs(old_q)
        membership = np.where(keep[parent], old + int(membership.max(initial=-1)) + 1, membership)
        membership = _compact(membership)
    # A node of a split parent without an edge inside it (possible only after a warm start
    # left a community disconnected) becomes a community of its own.
    out = np.full(len(lab), -1, dtype=np.int64)
    out[kept] = membership
    nodes = np.flatnonzero(run)
    alone = nodes[out[nodes] < 0]
    out[alone] = int(membership.max(initial=-1)) + 1 + np.arange(len(alone))
    return out[nodes]


def _repaired(old: I64, parent: I64, s: I64, d: I64, w: F64) -> I64:
    """The previous split of each parent on today's subgraph (``old``: a node's previous
    child, -1 = none): a child is a (parent, previous child) pair. A node without one joins the
    child it has the most edge weight to inside its parent, repeatedly, so new members reach
    through other new members; what no previous child reaches is grouped by its connections
    (a new cluster becomes one child, not a set of singletons)."""
    known = old >= 0
    base = int(old.max(initial=-1)) + 1
    out = np.where(known, parent * (base + 1) + old, -1)
    a, b, ww = np.concatenate([s, d]), np.concatenate([d, s]), np.concatenate([w, w])
    while True:
        ties = (out[a] < 0) & (out[b] >= 0)
        if not ties.any():
            break
        pairs, inverse = np.unique(
            np.column_stack([a[ties], out[b[ties]]]), axis=0, return_inverse=True
        )
        totals = np.bincount(inverse.ravel(), ww[ties])
        best = np.lexsort((-totals, pairs[:, 0]))  # per node, heaviest tie first
        first = np.ones(len(best), dtype=bool)
        first[1:] = pairs[best[1:], 0] != pairs[best[:-1], 0]
        chosen = pairs[best[first]]
        out[chosen[:, 0]] = chosen[:, 1]
    loose = np.flatnonzero(out < 0)
    if len(loose):
        inner = (out[s] < 0) & (out[d] < 0)
        position = np.full(len(out), -1, dtype=np.int64)
        position[loose] = np.arange(len(loose))
        sub = ig.Graph(
            n=len(loose), edges=np.column_stack([position[s[inner]], position[d[inner]]]).tolist()
        )
        component = np.asarray(sub.connected_components().membership, dtype=np.int64)
        out[loose] = int(out.max(initial=-1)) + 1 + component
    return _compact(out)


def _quality(
    part: I64, parent: I64, edges: tuple[I64, I64, F64], node_weights: F64, resolution: float
) -> F64:
    """Per parent, the CPM quality the splits optimise (node weights as in ``_cpm_split``):
    2 x the weight inside children - resolution x the squared node weight of each child."""
    s, d, w = edges
    parents = int(parent.max(initial=-1)) + 1
    same = part[s] == part[d]
    inside = np.bincount(parent[s[same]], w[same], parents)
    children, inverse = np.unique(part, return_inverse=True)
    totals = np.bincount(inverse, node_weights, len(children))
    owner = np.zeros(len(children), dtype=np.int64)
    owner[inverse] = parent
    return np.asarray(2 * inside - resolution * np.bincount(owner, totals**2, parents))


def _leiden(
    graph: ig.Graph,
    weights: list[float],
    *,
    resolution: float,
    modularity: bool,
    initial: I64 | None,
    node_weights: list[float] | None = None,
    iterations: int = 1,
) -> I64:
    """igraph's Leiden without the VertexClustering wrapper (membership only)."""
    membership, _quality = ig.GraphBase.community_leiden(
        graph,
        edge_weights=weights,
        node_weights=node_weights,
        resolution=resolution,
        normalize_resolution=modularity,
        beta=0.01,
        initial_membership=None if initial is None else initial.tolist(),
        n_iterations=iterations,
    )
    return np.asarray(membership, dtype=np.int64)


def canonical(lab: I64) -> I64:
    """Renumber labels 0..k-1 in order of each community's smallest node index; -1 stays."""
    out = np.full(len(lab), -1, dtype=np.int64)
    present = np.flatnonzero(lab >= 0)
    if len(present) == 0:
        return out
    _, first = np.unique(lab[present], return_index=True)
    order = np.argsort(first, kind="stable")  # communities by first appearance
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    _, inverse = np.unique(lab[present], return_inverse=True)
    out[present] = rank[inverse]
    return out


def _same_partition(a: I64, b: I64) -> bool:
    return bool(np.array_equal(canonical(a), canonical(b)))


def _compact(values: I64) -> I64:
    _, inverse = np.unique(values, return_inverse=True)
    return inverse.astype(np.int64)
