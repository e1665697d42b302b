"""The graph as the community engine sees it: entity ids in ascending order, relationship rows
mapped to node indices, and the undirected weighted edge list Leiden and PageRank run on.

Pure functions over numpy arrays: the same rows in any order give the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import igraph as ig
import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Digests = npt.NDArray[np.void]  # fixed-width content digests, one per row


@dataclass(frozen=True)
class GraphRows:
    """Entities and relationships as loaded, in any order (one consistent database snapshot)."""

    entity_ids: I64
    entity_digests: Digests  # hash of name + description, per entity
    rel_ids: I64
    rel_src: I64  # entity ids
    rel_dst: I64
    rel_weight: F64
    rel_digests: Digests  # hash of type + description, per relationship


@dataclass(frozen=True)
class Graph:
    """Node ``i`` is entity ``node_ids[i]``; ``src < dst`` edges sorted, weights summed over
    relationship types and directions, no self-loops. ``rel_*`` keep the rows (as indices) for
    fingerprints and reports."""

    node_ids: I64
    node_digests: Digests
    src: I64
    dst: I64
    weight: F64
    rel_ids: I64
    rel_src: I64
    rel_dst: I64
    rel_weight: F64
    rel_digests: Digests

    @property
    def n(self) -> int:
        return len(self.node_ids)


def build_graph(rows: GraphRows) -> Graph:
    """Sort, index and aggregate the rows (raises if a relationship names an unknown entity)."""
    order = np.argsort(rows.entity_ids, kind="stable")
    node_ids = rows.entity_ids[order]
    rel_order = np.argsort(rows.rel_ids, kind="stable")
    rel_src = _index_of(node_ids, rows.rel_src[rel_order])
    rel_dst = _index_of(node_ids, rows.rel_dst[rel_order])
    rel_weight = rows.rel_weight[rel_order].astype(np.float64)
    src, dst, weight = undirected_edges(len(node_ids), rel_src, rel_dst, rel_weight)
    return Graph(
        node_ids=node_ids,
        node_digests=rows.entity_digests[order],
        src=src,
        dst=dst,
        weight=weight,
        rel_ids=rows.rel_ids[rel_order],
        rel_src=rel_src,
        rel_dst=rel_dst,
        rel_weight=rel_weight,
        rel_digests=rows.rel_digests[rel_order],
    )


def undirected_edges(n: int, src: I64, dst: I64, weight: F64) -> tuple[I64, I64, F64]:
    """One edge per unordered pair, sorted by (src, dst), weights summed; self-loops dropped
    (they carry no community information and would only inflate degrees)."""
    a, b = np.minimum(src, dst), np.maximum(src, dst)
    keep = a != b
    key = a[keep].astype(np.int64) * max(n, 1) + b[keep]
    uniq, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, weights=weight[keep], minlength=len(uniq)).astype(np.float64)
    return uniq // max(n, 1), uniq % max(n, 1), summed


def to_igraph(n: int, src: I64, dst: I64) -> ig.Graph:
    """An undirected igraph Graph on ``n`` vertices (weights are passed per call)."""
    return ig.Graph(n=n, edges=list(zip(src.tolist(), dst.tolist(), strict=True)))


def pagerank(graph: Graph, base: ig.Graph | None = None, damping: float = 0.85) -> F64:
    """Weighted PageRank over the undirected graph; isolated entities get the teleport share.
    ``base`` is ``to_igraph`` of the graph when the caller already built it."""
    if graph.n == 0:
        return np.zeros(0, dtype=np.float64)
    g = base if base is not None else to_igraph(graph.n, graph.src, graph.dst)
    weights = graph.weight.tolist() if len(graph.weight) else None
    return np.asarray(g.pagerank(weights=weights, directed=False, damping=damping), np.float64)


def _index_of(sorted_ids: I64, ids: I64) -> I64:
    idx = np.searchsorted(sorted_ids, ids)
    idx = np.minimum(idx, max(len(sorted_ids) - 1, 0))
    if len(ids) and (len(sorted_ids) == 0 or np.any(sorted_ids[idx] != ids)):
        raise ValueError("a relationship refers to an entity that is not in the snapshot")
    return idx.astype(np.int64)
