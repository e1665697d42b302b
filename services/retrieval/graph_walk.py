"""Local mode's graph reads on the graph held in memory (graph_memory.py): the same answers as
the database statements of neighbourhood.py and chain_search.py give the caller, from numpy
lookups instead of round trips (issue 32, step 3). What memory does not hold (entity names,
relationship descriptions) is read once, at the end, for the hops a result shows.

A caller who reads without a per-document filter (``Caller.unfiltered``) walks every edge. A
restricted caller (issue 32, step 4) walks what docs/access-control.md lets it see, by its
mask of visible access classes (``AccessClasses.visible_to``): passage edges in visible
documents; relationships with evidence in a visible document and both ends visible, weighed
by that evidence alone (a co-occurrence is weak on the evidence it sees); mention counts of
visible mentions; names and descriptions rebuilt from visible mentions and evidence when
shown. The hub rule and the bridge budget count every mention, as the statements do. A query
with a document scope (filters) walks the database.

The rules are those of the statements they replace: relationships of the seeds by weight then
id; hubs (more than HUB_MENTIONS mentions) are not expanded; a bridge takes the other entities
of the passages, rarest first while their mention counts add up to MAX_BRIDGE_MENTIONS. Tested
against those statements by tests/integration/test_graph_walk.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval import neighbourhood
from services.retrieval.graph_memory import Flags, Ids, MemoryGraph
from services.retrieval.neighbourhood import CO_OCCURS, LocalGraph, Relation
from services.retrieval.visibility import Filtered, entity_names, visible_evidence

# Names of the shown hops' ends and their relationships' descriptions, in one round trip.
_SHOWN = text(
    "SELECT 'r', id, description FROM relationships WHERE id = ANY(:r)"
    " UNION ALL SELECT 'e', id, name FROM entities WHERE id = ANY(:e)"
)
# A restricted caller's descriptions: from the evidence it can see (names: entity_names).
_DESCRIBED = Filtered.of(
    "SELECT r.id, r.description FROM relationships r WHERE r.id = ANY(:r)",
    "SELECT r.id, v.x FROM relationships r CROSS JOIN LATERAL "  # noqa: S608 - visibility fragments are constants
    + visible_evidence("r.id")
    + " v WHERE r.id = ANY(:r)",
)


def _unique(values: Sequence[int] | Ids) -> Ids:
    return np.unique(np.asarray(values, dtype=np.int64))


def _pairs(entities: Ids, chunks: Ids) -> list[tuple[int, int]]:
    return list(zip(entities.tolist(), chunks.tolist(), strict=True))


class MemoryGraphReads:
    """neighbourhood.GraphReads on one held state (``graph``) as ``caller`` may see it (every
    edge when None or unfiltered); ``conn`` only for what is shown."""

    holds_topics = True

    def __init__(
        self, graph: MemoryGraph, conn: AsyncConnection, caller: Caller | None = None
    ) -> None:
        self.graph, self._conn = graph, conn
        self._caller = caller if caller is not None and not caller.unfiltered else None
        # which access classes the caller sees (None: all)
        self._seen: Flags | None = (
            None if self._caller is None else graph.classes.visible_to(self._caller)
        )

    def _visible(self, at: NDArray[Any]) -> NDArray[Any]:
        """Those of the passage edges at ``at`` the caller sees."""
        if self._seen is None:
            return at
        kept: NDArray[Any] = at[self._seen[self.graph.edges.classes[at]]]
        return kept

    def _visible_mentions(self, entities: Ids) -> NDArray[np.int64]:
        """How many mentions each of ``entities`` (sorted, distinct) has in visible
        documents."""
        edges = self.graph.edges
        at = self._visible(edges.of_entities(entities))
        group = np.searchsorted(entities, edges.entities[at])
        counts = np.bincount(group, weights=edges.mentions[at], minlength=len(entities))
        return counts.astype(np.int64)

    async def relations(
        self, seeds: Sequence[int], hide_weak: bool, limit: int
    ) -> tuple[list[Relation], list[int]]:
        rel = self.graph.relationships
        rows = rel.touching(_unique(seeds))
        if self._seen is None:
            if hide_weak:
                rows = rows[~rel.weak[rows]]
            rank = rel.weights[rows]
        else:
            rank, count = self.graph.evidence.visible(rel.ids[rows], self._seen)
            keep = count > 0
            if hide_weak:
                co_occurs = rel.vocabulary.index(CO_OCCURS) if CO_OCCURS in rel.vocabulary else -1
                keep &= ~((rel.types[rows] == co_occurs) & (count <= 1))
            rows, rank = rows[keep], rank[keep]
            ends = _unique(np.concatenate([rel.sources[rows], rel.targets[rows]]))
            shown = ends[self._visible_mentions(ends) > 0]
            keep = np.isin(rel.sources[rows], shown) & np.isin(rel.targets[rows], shown)
            rows, rank = rows[keep], rank[keep]
        chosen = np.lexsort((rel.ids[rows], -rank))[:limit]
        rows, rank = rows[chosen], rank[chosen]
        names = rel.vocabulary
        relations = [
            (s, t, names[k], w, "")
            for s, t, k, w in zip(
                rel.sources[rows].tolist(),
                rel.targets[rows].tolist(),
                rel.types[rows].tolist(),
                rank.tolist(),
                strict=True,
            )
        ]
        return relations, rel.ids[rows].tolist()

    def steps(
        self, entities: Sequence[int], direction: str, types: Sequence[str], typed: bool
    ) -> tuple[Ids, Ids, Ids]:
        """(from, to, relationship id) arrays of one typed-plan step from ``entities`` along
        relationships of ``types`` (any when empty; ``typed``: but co-occurrence), ``out``,
        ``in`` or ``both`` (a relationship between two of them once each way), as the caller
        sees relationships: the rows of plan_exec's statements, from memory."""
        rel, ids = self.graph.relationships, _unique(entities)
        parts: list[tuple[Ids, Ids, Ids]] = []
        for way in ("out", "in") if direction == "both" else (direction,):
            at = rel.leaving(ids) if way == "out" else rel.entering(ids)
            at = self._of_types(at, types, typed)
            if self._seen is not None and at.size:
                at = at[self._relationship_visible(at)]
            here, there = (rel.sources, rel.targets) if way == "out" else (rel.targets, rel.sources)
            parts.append((here[at], there[at], rel.ids[at]))
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )

    def _of_types(self, at: NDArray[Any], types: Sequence[str], typed: bool) -> NDArray[Any]:
        """Those of the relationships at ``at`` of ``types`` (any when empty), co-occurrences
        dropped when ``typed``."""
        rel = self.graph.relationships
        vocabulary = rel.vocabulary
        if types:
            at = at[np.isin(rel.types[at], [vocabulary.index(t) for t in types if t in vocabulary])]
        if typed and CO_OCCURS in vocabulary:
            at = at[rel.types[at] != vocabulary.index(CO_OCCURS)]
        return at

    def _relationship_visible(self, at: NDArray[Any]) -> NDArray[np.bool_]:
        """Which of the relationships at ``at`` the restricted caller sees: some evidence in a
        visible class, and both ends with a visible mention."""
        rel = self.graph.relationships
        assert self._seen is not None  # noqa: S101 - restricted callers only
        ids = rel.ids[at]
        distinct = _unique(ids)
        _, count = self.graph.evidence.visible(distinct, self._seen)
        evidenced = np.isin(ids, distinct[count > 0])
        ends = _unique(np.concatenate([rel.sources[at], rel.targets[at]]))
        shown = ends[self._visible_mentions(ends) > 0]
        both: NDArray[np.bool_] = (
            evidenced & np.isin(rel.sources[at], shown) & np.isin(rel.targets[at], shown)
        )
        return both

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
        at = self._visible(edges.of_entities(_unique(entities)))
        return _pairs(edges.entities[at], edges.chunks[at])

    async def bridge_step(
        self, chunks: Sequence[int], known: Sequence[int]
    ) -> list[tuple[int, int]]:
        if not len(chunks):
            return []
        edges = self.graph.edges
        others = np.unique(edges.entities[self._visible(edges.of_chunks(_unique(chunks)))])
        others = others[~np.isin(others, _unique(known))]
        ids, counts = self._not_hubs(others)
        links = np.cumsum(counts, dtype=np.int64)  # rarest first: a prefix stays in budget
        return await self.mentions_of(ids[links <= neighbourhood.MAX_BRIDGE_MENTIONS])

    async def about(self, chunks: Sequence[int]) -> list[tuple[int, int]]:
        if not len(chunks):
            return []
        edges = self.graph.edges
        at = self._visible(edges.of_chunks(_unique(chunks)))
        at = at[edges.topics[at]]
        return list(zip(edges.chunks[at].tolist(), edges.entities[at].tolist(), strict=True))

    async def names_of(self, entities: Sequence[int]) -> tuple[dict[int, str], dict[int, int]]:
        ids, counts = self.graph.entity_counts.of(_unique(entities))
        listed, numbers = ids.tolist(), counts.tolist()
        if self._seen is not None:  # visible mentions only, and entities that have some
            seen = self._visible_mentions(ids)
            listed, numbers = ids[seen > 0].tolist(), seen[seen > 0].tolist()
        return dict.fromkeys(listed, ""), dict(zip(listed, numbers, strict=True))

    async def describe(self, hood: LocalGraph, shown: int) -> None:
        """Names of the first ``shown`` relations' ends and their descriptions, read now."""
        ids = hood.relation_ids[:shown]
        if not ids:
            return
        ends = sorted({e for s, t, *_ in hood.relations[:shown] for e in (s, t)})
        if self._caller is None:
            found = (await self._conn.execute(_SHOWN, {"r": ids, "e": ends})).all()
            described = {int(i): str(d or "") for kind, i, d in found if kind == "r"}
            hood.names.update({int(i): str(n) for kind, i, n in found if kind == "e"})
        else:
            statement = _DESCRIBED.bind(self._caller, {"r": ids})
            rows = (await self._conn.execute(*statement)).all()
            described = {int(i): str(d or "") for i, d in rows}
            names = await entity_names(self._conn, self._caller, ends)
            hood.names.update({e: name for e, (name, _) in names.items()})
        hood.relations[:shown] = [
            (s, t, y, w, described.get(i, ""))
            for (s, t, y, w, _), i in zip(hood.relations[:shown], ids, strict=True)
        ]
