"""Which reports a recompute writes and from which facts (pure). A community whose
fingerprint the published snapshot had, written by the same writer, reuses that report; every
other one is generated from its top entities by PageRank and heaviest internal relationships."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from services.communities.graph import F64, I64
from services.communities.structure import Structure


@dataclass(frozen=True)
class LevelPlan:
    """One level: labels to generate, and for each of them the facts to use."""

    generate: list[int]
    top_nodes: dict[int, I64]  # label -> node indices, most important first
    top_rels: dict[int, I64]  # label -> relationship row indices, heaviest first
    internal_weight: F64  # per label


@dataclass(frozen=True)
class ReportPlan:
    """Per level (index = level); ``reused`` counts communities keeping their old report."""

    levels: list[LevelPlan]
    reused: int

    @property
    def generated(self) -> int:
        return sum(len(level.generate) for level in self.levels)

    def entity_nodes(self) -> I64:
        """Every node index a generated report mentions (members and relationship ends)."""
        parts = [n for level in self.levels for n in level.top_nodes.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def relationship_rows(self) -> I64:
        """Every relationship row index a generated report mentions."""
        parts = [r for level in self.levels for r in level.top_rels.values()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def plan_reports(
    structure: Structure,
    previous_writers: Mapping[str, str],
    writer: str,
    max_entities: int,
    max_relations: int,
) -> ReportPlan:
    """``previous_writers`` maps the published snapshot's fingerprints to their writer."""
    graph = structure.graph
    levels: list[LevelPlan] = []
    reused = 0
    for level in structure.levels:
        count = len(level.ids)
        generate = [
            c for c, fp in enumerate(level.fingerprints) if previous_writers.get(fp) != writer
        ]
        reused += count - len(generate)
        wanted = np.zeros(count, dtype=bool)
        wanted[generate] = True
        src_label, dst_label = level.labels[graph.rel_src], level.labels[graph.rel_dst]
        internal = np.flatnonzero((src_label == dst_label) & (src_label >= 0))
        weight = np.bincount(
            src_label[internal], weights=graph.rel_weight[internal], minlength=count
        ).astype(np.float64)
        members = np.flatnonzero(level.labels >= 0)
        members = members[wanted[level.labels[members]]]
        node_order = np.lexsort((members, -structure.pagerank[members], level.labels[members]))
        rels = internal[wanted[src_label[internal]]]
        rel_order = np.lexsort((rels, -graph.rel_weight[rels], src_label[rels]))
        levels.append(
            LevelPlan(
                generate=generate,
                top_nodes=_top(members[node_order], level.labels, max_entities),
                top_rels=_top(rels[rel_order], level.labels[graph.rel_src], max_relations),
                internal_weight=weight,
            )
        )
    return ReportPlan(levels=levels, reused=reused)


def _top(items: I64, label_of: I64, limit: int) -> dict[int, I64]:
    """The first ``limit`` items of each label; ``items`` are grouped by label already."""
    if len(items) == 0:
        return {}
    labels = label_of[items]
    starts = np.flatnonzero(np.r_[True, labels[1:] != labels[:-1]])
    ends = np.r_[starts[1:], len(items)]
    return {
        int(labels[s]): items[s : min(e, s + limit)]
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    }
