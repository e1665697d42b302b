"""leidenalg's fixed-membership Leiden as an incremental recompute: the candidate that
bench/bench_stability.py measures against the service's igraph warm start. Not used by the
service (docs/BENCHMARKS.md, "Community stability (issue 10, deliverable 6)" says why).

``Incremental`` is a context manager: while it is active, ``compute_structure`` runs its Leiden
calls through leidenalg with ``is_membership_fixed``. Nodes farther than ``radius`` hops from a
touched node (an endpoint of a removed or added edge) that had a community at that level in the
previous snapshot keep it; the others are optimised as igraph would (same quality functions:
modularity at level 0, CPM with node weights for the splits). ``splits=False`` applies this to
level 0 only and leaves the splits to igraph's warm start.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import igraph as ig
import numpy as np
import numpy.typing as npt

from services.communities import graph as graph_module
from services.communities import leiden, structure
from services.communities.graph import I64
from services.communities.structure import PreviousSnapshot, Structure

Mask = npt.NDArray[np.bool_]
_SIZE_SCALE = 10_000.0  # leidenalg's node sizes are integers: weights x scale, resolution / scale^2


def near(src: I64, dst: I64, seeds: Mask, radius: int) -> Mask:
    """Nodes within ``radius`` hops of a seed over the edges ``src``-``dst`` (radius 0: seeds)."""
    out = seeds.copy()
    for _ in range(radius):
        grown = out.copy()
        grown[dst[out[src]]] = True
        grown[src[out[dst]]] = True
        if np.array_equal(grown, out):
            break
        out = grown
    return out


def node_ids(structure: Structure, number: int, ids: I64 | None = None) -> I64:
    """Per node, its community id at level ``number`` (-1: none)."""
    n = structure.graph.n
    if number >= len(structure.levels):
        return np.full(n, -1, dtype=np.int64)
    level = structure.levels[number]
    table = level.ids if ids is None else ids
    out = np.full(n, -1, dtype=np.int64)
    member = level.labels >= 0
    out[member] = table[level.labels[member]]
    return out


def previous_of(structure: Structure) -> PreviousSnapshot:
    """The snapshot rows ``structure`` would publish, as the next recompute loads them."""
    communities, entities, ids, levels, sizes, parents = [], [], [], [], [], []
    prints: list[str] = []
    for number, level in enumerate(structure.levels):
        nodes = np.flatnonzero(level.labels >= 0)
        communities.append(level.ids[level.labels[nodes]])
        entities.append(structure.graph.node_ids[nodes])
        ids.append(level.ids)
        levels.append(np.full(len(level.ids), number, dtype=np.int64))
        sizes.append(level.sizes)
        parents.append(level.parent_ids)
        prints.extend(level.fingerprints)
    return PreviousSnapshot(
        np.concatenate(communities),
        np.concatenate(entities),
        np.concatenate(ids),
        np.concatenate(levels),
        np.concatenate(sizes),
        np.concatenate(parents),
        prints,
    )


class Incremental:
    """``old_at[l]``: per node, its community at level l in the previous snapshot (-1: none);
    ``moving``: nodes free to move (``near(touched, radius)``); node indices as in the graph
    compute_structure builds (entity ids in ascending order)."""

    def __init__(self, old_at: list[I64], moving: Mask, *, splits: bool, seed: int = 42) -> None:
        self.old_at = old_at
        self.moving = moving
        self.splits = splits
        self.seed = seed
        self.level = 0
        self._saved: list[tuple[Any, str, Any]] = []

    def keep(self, level: int) -> Mask | None:
        """Nodes fixed when making ``level``, or None (igraph runs as usual)."""
        if level >= len(self.old_at) or (level > 0 and not self.splits):
            return None
        return (self.old_at[level] >= 0) & ~self.moving

    def __enter__(self) -> Incremental:
        original_leiden = leiden._leiden
        original_split = leiden.split
        original_to_igraph = graph_module.to_igraph

        def to_igraph(n: int, src: I64, dst: I64) -> ig.Graph:
            graph = original_to_igraph(n, src, dst)
            graph.vs["node"] = list(range(n))  # survives subgraph_edges: maps splits back
            return graph

        def split(*args: Any, **kwargs: Any) -> Any:
            self.level = int(kwargs["level"])
            return original_split(*args, **kwargs)

        def run(graph: ig.Graph, weights: list[float], **kwargs: Any) -> I64:
            level = 0 if kwargs["modularity"] else self.level
            keep = self.keep(level)
            if kwargs["initial"] is None or keep is None:
                return original_leiden(graph, weights, **kwargs)
            nodes = graph.vs["node"] if "node" in graph.vs.attributes() else slice(None)
            return self._leidenalg(graph, weights, keep[nodes], **kwargs)

        self._patch(structure, "to_igraph", to_igraph)
        self._patch(leiden, "to_igraph", to_igraph)
        self._patch(leiden, "split", split)
        self._patch(leiden, "_leiden", run)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for module, name, value in reversed(self._saved):
            setattr(module, name, value)
        self._saved.clear()

    def _patch(self, module: Any, name: str, value: Callable[..., Any]) -> None:
        self._saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def _leidenalg(
        self,
        graph: ig.Graph,
        weights: list[float],
        fixed: Mask,
        *,
        resolution: float,
        modularity: bool,
        initial: I64,
        node_weights: list[float] | None = None,
        iterations: int = 1,
    ) -> I64:
        """One ``_leiden`` call through leidenalg, the ``fixed`` nodes kept where they start."""
        import leidenalg  # only here: the helpers above work without it

        start = np.unique(initial, return_inverse=True)[1].tolist()
        partition: Any
        if modularity:
            partition = leidenalg.RBConfigurationVertexPartition(
                graph, initial_membership=start, weights=weights, resolution_parameter=resolution
            )
        else:
            sizes = np.rint(np.asarray(node_weights) * _SIZE_SCALE).astype(np.int64)
            partition = leidenalg.CPMVertexPartition(
                graph,
                initial_membership=start,
                weights=weights,
                node_sizes=sizes.tolist(),
                resolution_parameter=resolution / _SIZE_SCALE**2,
            )
        optimiser = leidenalg.Optimiser()
        optimiser.set_rng_seed(self.seed)
        optimiser.optimise_partition(
            partition, n_iterations=iterations, is_membership_fixed=fixed.tolist()
        )
        return np.asarray(partition.membership, dtype=np.int64)
