"""Local mode's graph reads on the graph held in memory (graph_memory.py), for a caller who
reads without a per-document filter (``Caller.unfiltered``): the same answers as the database
statements of neighbourhood.py and chain_search.py give such a caller, from numpy lookups
instead of round trips (issue 32, step 3). What memory does not hold (entity names,
relationship descriptions) is read once, at the end, for the hops a result shows.

The rules are those of the statements they replace: relationships of the seeds by weight then
id; hubs (more than HUB_MENTIONS mentions) are not expanded; a bridge takes the other entities
of the passages, rarest first while their mention counts add up to MAX_BRIDGE_MENTIONS. Tested
against those statements by tests/integration/test_graph_walk.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.retrieval import neighbourhood
from services.retrieval.graph_memory import Ids, MemoryGraph
from services.retrieval.neighbourhood import LocalGraph, Relation

# Names of the shown hops' ends and their relationships' descriptions, in one round trip.
_SHOWN = text(
    "SELECT 'r', id, description FROM relationships WHERE id = ANY(:r)"
    " UNION ALL SELECT 'e', id, name FROM entities WHERE id = ANY(:e)"
)


def _unique(values: Sequence[int] | Ids) -> Ids:
    return np.unique(np.asarray(values, dtype=np.int64))


def _pairs(entities: Ids, chunks: Ids) -> list[tuple[int, int]]:
    return list(zip(entities.tolist(), chunks.tolist(), strict=True))


class MemoryGraphReads:
    """neighbourhood.GraphReads on one held state (``graph``); ``conn`` only for what is shown."""

    holds_topics = True

    def __init__(self, graph: MemoryGraph, conn: AsyncConnection) -> None:
        self.graph, self._conn = graph, conn

    async def relations(
        self, seeds: Sequence[int], hide_weak: bool, limit: int
    ) -> tuple[list[Relation], list[int]]:
        rel = self.graph.relationships
        rows = rel.touching(_unique(seeds))
        if hide_weak:
            rows = rows[~rel.weak[rows]]
        rows = rows[np.lexsort((rel.ids[rows], -rel.weights[rows]))][:limit]
        names = rel.vocabulary
        relations = [
            (s, t, names[k], w, "")
            for s, t, k, w in zip(
                rel.sources[rows].tolist(),
                rel.targets[rows].tolist(),
                rel.types[rows].tolist(),
                rel.weights[rows].tolist(),
                strict=True,
            )
        ]
        return relations, rel.ids[rows].tolist()

    async def not_hubs(self, entities: Sequence[int]) -> list[tuple[int, int]]:
        ids, counts = self._not_hubs(_unique(entities))
        return list(zip(ids.tolist(), counts.tolist(), strict=True))

    def _not_hubs(self, entities: Ids) -> tuple[Ids, NDArray[np.int32]]:
        """(ids, mention counts) of the non-hubs among ``entities``, rarest first."""
        ids, counts = self.graph.entity_counts.of(entities)
        keep = counts <= neighbourhood.HUB_MENTIONS
        ids, counts = ids[keep], counts[keep]
        order = np.lexsort((ids, counts))
        return ids[order], counts[order]

    async def mentions_of(self, entities: Sequence[int] | Ids) -> list[tuple[int, int]]:
        edges = self.graph.edges
        at = edges.of_entities(_unique(entities))
        return _pairs(edges.entities[at], edges.chunks[at])

    async def bridge_step(
        self, chunks: Sequence[int], known: Sequence[int]
    ) -> list[tuple[int, int]]:
        if not len(chunks):
            return []
        edges = self.graph.edges
        others = np.unique(edges.entities[edges.of_chunks(_unique(chunks))])
        others = others[~np.isin(others, _unique(known))]
        ids, counts = self._not_hubs(others)
        links = np.cumsum(counts, dtype=np.int64)  # rarest first: a prefix stays in budget
        return await self.mentions_of(ids[links <= neighbourhood.MAX_BRIDGE_MENTIONS])

    async def about(self, chunks: Sequence[int]) -> list[tuple[int, int]]:
        if not len(chunks):
            return []
        edges = self.graph.edges
        at = edges.of_chunks(_unique(chunks))
        at = at[edges.topics[at]]
        return list(zip(edges.chunks[at].tolist(), edges.entities[at].tolist(), strict=True))

    async def names_of(self, entities: Sequence[int]) -> tuple[dict[int, str], dict[int, int]]:
        ids, counts = self.graph.entity_counts.of(_unique(entities))
        listed = ids.tolist()
        return dict.fromkeys(listed, ""), dict(zip(listed, counts.tolist(), strict=True))

    async def describe(self, hood: LocalGraph, shown: int) -> None:
        """Names of the first ``shown`` relations' ends and their descriptions, read now."""
        ids = hood.relation_ids[:shown]
        if not ids:
            return
        ends = sorted({e for s, t, *_ in hood.relations[:shown] for e in (s, t)})
        found = (await self._conn.execute(_SHOWN, {"r": ids, "e": ends})).all()
        described = {int(i): str(d or "") for kind, i, d in found if kind == "r"}
        hood.names.update({int(i): str(n) for kind, i, n in found if kind == "e"})
        hood.relations[:shown] = [
            (s, t, y, w, described.get(i, ""))
            for (s, t, y, w, _), i in zip(hood.relations[:shown], ids, strict=True)
        ]
