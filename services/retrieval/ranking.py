"""Pure ranking functions for local retrieval (no I/O, deterministic): personalised PageRank
over the passage-entity graph, the seeds' path formula, and z-score fusion of signals."""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from scipy import sparse  # type: ignore[import-untyped]

PPR_DAMPING = 0.85
HOP_DECAY = 0.9

Node = tuple[str, int]  # ("e", entity id) or ("c", chunk id)
K = TypeVar("K", bound=Hashable)


def personalised_pagerank(
    edges: Iterable[tuple[Node, Node, float]],
    seeds: Mapping[int, float],
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> dict[int, float]:
    """PPR (damping 0.85) from the seed entities over the undirected weighted graph given as
    edges (a repeated pair keeps its largest weight); returns every passage node's score.
    Same iteration as networkx.pagerank, vectorised: nodes are coded as 2·id (entity) and
    2·id + 1 (passage) so the whole graph lives in numpy arrays."""
    listed = list(edges)
    return pagerank_coded(
        np.array([_code(a) for a, _, _ in listed], dtype=np.int64),
        np.array([_code(b) for _, b, _ in listed], dtype=np.int64),
        np.array([w for _, _, w in listed], dtype=np.float64),
        seeds,
        max_iter=max_iter,
        tol=tol,
    )


def pagerank_coded(
    a: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    seeds: Mapping[int, float],
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> dict[int, float]:
    """personalised_pagerank on coded edge arrays (entity 2·id, passage 2·id + 1)."""
    if not len(a):
        return {}
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    keep = lo != hi
    lo, hi, weight = lo[keep], hi[keep], weights[keep]
    order = np.lexsort((weight, hi, lo))  # per pair, the largest weight comes last
    lo, hi, weight = lo[order], hi[order], weight[order]
    last = np.ones(len(lo), dtype=bool)
    last[:-1] = (lo[1:] != lo[:-1]) | (hi[1:] != hi[:-1])
    lo, hi, weight = lo[last], hi[last], weight[last]
    codes, inverse = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    n, m = len(codes), len(lo)
    p = np.zeros(n)
    for e, w in seeds.items():
        at = np.searchsorted(codes, 2 * e)
        if w > 0 and at < n and codes[at] == 2 * e:
            p[at] = w
    if not p.sum():
        return {}
    p /= p.sum()
    rows = np.concatenate([inverse[:m], inverse[m:]])
    cols = np.concatenate([inverse[m:], inverse[:m]])
    adjacency = sparse.csr_array((np.concatenate([weight, weight]), (rows, cols)), shape=(n, n))
    strength = np.asarray(adjacency.sum(axis=1)).ravel()
    dangling = strength == 0
    inverse_strength = np.divide(1.0, strength, out=np.zeros(n), where=~dangling)
    transition = sparse.diags_array(inverse_strength) @ adjacency
    x = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        previous = x
        x = PPR_DAMPING * (x @ transition + x[dangling].sum() * p) + (1 - PPR_DAMPING) * p
        if np.abs(x - previous).sum() < n * tol:
            break
    is_passage = codes % 2 == 1
    return dict(zip((codes[is_passage] // 2).tolist(), x[is_passage].tolist(), strict=True))


def mention_weight(passages: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Hub damping of a passage-entity edge: 1 / ln(1 + df), df = the passages that mention
    the entity (an IDF-like discount; the +1 keeps a once-mentioned entity finite)."""
    return 1.0 / np.log1p(np.maximum(passages, 1).astype(np.float64))


def code_entities(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Entity ids as node codes."""
    return 2 * ids


def code_passages(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Chunk ids as node codes."""
    return 2 * ids + 1


def _code(node: Node) -> int:
    return 2 * node[1] + (1 if node[0] == "c" else 0)


def edge_strength(weight: float) -> float:
    """A relationship weight (sum of evidence strengths, unbounded) mapped into (0, 1)."""
    return weight / (1.0 + weight) if weight > 0 else 0.0


def best_paths(
    edges: Iterable[tuple[int, int, float]],
    seeds: Mapping[int, float],
    importance: Mapping[int, float],
    max_hops: int = 2,
) -> dict[int, float]:
    """Entity -> best score over paths from a seed of at most ``max_hops`` relationships:
    seed weight × Π edge strength × Π importance of the entities on the path × 0.9^hops
    (the seeds' formula). Max-product search, so every score is the best path's."""
    adjacency: dict[int, list[tuple[int, float]]] = {}
    for s, t, w in sorted(edges):
        strength = edge_strength(w)
        if strength > 0 and s != t:
            adjacency.setdefault(s, []).append((t, strength))
            adjacency.setdefault(t, []).append((s, strength))
    top = max(seeds.values(), default=0.0)
    best: dict[int, float] = {}
    heap: list[tuple[float, int, int]] = []
    for e, w in sorted(seeds.items()):
        if w > 0:
            score = (w / top) * importance.get(e, 0.0)
            heapq.heappush(heap, (-score, 0, e))
    while heap:
        neg, hops, e = heapq.heappop(heap)
        if e in best:
            continue
        best[e] = -neg
        if hops == max_hops:
            continue
        for nxt, strength in adjacency.get(e, ()):
            if nxt not in best:
                score = -neg * strength * importance.get(nxt, 0.0) * HOP_DECAY
                if score > 0:
                    heapq.heappush(heap, (-score, hops + 1, nxt))
    return best


def passage_path_scores(
    entity_scores: Mapping[int, float], mentions: Iterable[tuple[int, int]]
) -> dict[int, float]:
    """Chunk -> sum of the path scores of the entities it mentions ((entity, chunk) pairs)."""
    out: dict[int, float] = {}
    for entity, chunk in set(mentions):
        score = entity_scores.get(entity, 0.0)
        if score > 0:
            out[chunk] = out.get(chunk, 0.0) + score
    return out


def normalised_importance(values: Mapping[int, float]) -> dict[int, float]:
    """Importance in (0, 1]: each value over the largest (floored so nothing is exactly 0)."""
    top = max(values.values(), default=0.0)
    if top <= 0:
        return dict.fromkeys(values, 1.0)
    return {k: max(v / top, 1e-3) for k, v in values.items()}


def zscores(values: Mapping[K, float]) -> dict[K, float]:
    """Standard scores by key (zscores_array's rule)."""
    column = np.fromiter(values.values(), np.float64, len(values))
    return dict(zip(values, zscores_array(column).tolist(), strict=True))


def zscores_array(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Standard scores (population deviation); all zeros when the values do not vary or one
    is NaN (a zero vector's cosine). Fusion and the chains' relevance score thousands of
    candidates a step this way."""
    if not len(values):
        return values
    sd = float(values.std())
    if not sd > 1e-12:  # flat, or NaN somewhere (a zero vector's cosine): as zscores, all 0
        return np.zeros_like(values)
    centred: npt.NDArray[np.float64] = (values - values.mean()) / sd
    return centred


@dataclass(frozen=True)
class GraphSignal:
    """A walk's passage scores, ordered once: fusion reads them again at every chain step
    while the walk stays the same."""

    scores: Mapping[int, float]
    order: tuple[int, ...]  # passages, best first (ties by id)

    @classmethod
    def of(cls, scores: Mapping[int, float]) -> GraphSignal:
        return cls(scores, tuple(sorted(scores, key=lambda c: (-scores[c], c))))

    def over(self, candidates: Iterable[int]) -> dict[int, float]:
        """log1p(score / the candidates' median positive score) per candidate (0 without
        graph support): the graph scores span orders of magnitude, the log keeps one hub
        passage from dominating. The scale is the candidates' own, as the z-scores that fuse
        them are: the median over the whole walk fell as the walked neighbourhood grew with
        the corpus, which stretched the weakest support's logs and squeezed the strong
        (docs/retrieval.md, "Quality as the corpus grows")."""
        scored = {c: self.scores.get(c, 0.0) for c in candidates}
        positive = sorted(v for v in scored.values() if v > 0)
        median = positive[len(positive) // 2] if positive else 1.0
        return {c: math.log1p(v / median) for c, v in scored.items()}


def fuse(
    signals: Mapping[str, Mapping[int, float]],
    weights: Mapping[str, float],
    candidates: Iterable[int],
) -> dict[int, float]:
    """Σ weight·z(signal) over the candidates; a candidate a signal did not score gets that
    signal's minimum (it ranked below the signal's cut-off; measured better than 0)."""
    pool = sorted(set(candidates))
    fused = np.zeros(len(pool))
    for name, weight in weights.items():
        values = signals.get(name, {})
        if weight == 0 or not values:
            continue
        floor = min(values.values())
        column = np.fromiter((values.get(c, floor) for c in pool), np.float64, len(pool))
        fused += weight * zscores_array(column)
    return dict(zip(pool, fused.tolist(), strict=True))
