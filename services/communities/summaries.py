"""Writing the planned reports: the facts (and the passages the themes are read from) are read
in the recompute's database snapshot, then levels are written deepest first so a parent can be
written from its children's reports (new ones, or the reused reports of unchanged children),
and each new summary is embedded."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.communities.keyphrases import Corpus, keyphrases, terms
from services.communities.passages import NO_PASSAGES, Passages, load_passages
from services.communities.report_plan import ReportPlan
from services.communities.reports import (
    ChildSummary,
    EntityFact,
    RelationFact,
    Report,
    ReportInput,
    ReportWriter,
)
from services.communities.structure import Structure
from services.core.embedding import Embedder
from services.core.model_meter import NO_METER, ModelMeter, embed_metered


@dataclass(frozen=True)
class Facts:
    """Texts of the entities and relationships the planned reports mention."""

    entities: dict[int, tuple[str, str, str]]  # entity id -> name, type, description
    relations: dict[int, tuple[str, str]]  # relationship id -> type, description
    passages: Passages = field(default=NO_PASSAGES)  # for the writer's themes


@dataclass(frozen=True)
class Written:
    """A new report and the embedding of its title and summary (None without an embedder)."""

    report: Report
    embedding: list[float] | None


KEYPHRASES = 5  # per report: the title names the first few, the summary opens with all


async def load_facts(
    conn: AsyncConnection, structure: Structure, plan: ReportPlan, passages: int = 0
) -> Facts:
    """Read the texts in ``conn``'s snapshot (the one the structure was computed from), and up
    to ``passages`` passages per written community."""
    graph = structure.graph
    entity_ids = graph.node_ids[plan.entity_nodes()].tolist()
    rel_rows = plan.relationship_rows()
    entity_ids += graph.node_ids[graph.rel_src[rel_rows]].tolist()
    entity_ids += graph.node_ids[graph.rel_dst[rel_rows]].tolist()
    entities: dict[int, tuple[str, str, str]] = {}
    if entity_ids:
        rows = await conn.execute(
            text("SELECT id, name, type, description FROM entities WHERE id = ANY(:ids)"),
            {"ids": sorted(set(entity_ids))},
        )
        entities = {r.id: (r.name, r.type, r.description) for r in rows}
    relations: dict[int, tuple[str, str]] = {}
    if len(rel_rows):
        rows = await conn.execute(
            text("SELECT id, type, description FROM relationships WHERE id = ANY(:ids)"),
            {"ids": graph.rel_ids[rel_rows].tolist()},
        )
        relations = {r.id: (r.type, r.description) for r in rows}
    return Facts(entities, relations, await load_passages(conn, structure, plan, passages))


async def write_reports(
    writer: ReportWriter,
    embedder: Embedder | None,
    *,
    structure: Structure,
    plan: ReportPlan,
    facts: Facts,
    reused: Mapping[str, tuple[str, str]],
    meter: ModelMeter = NO_METER,
) -> dict[tuple[int, int], Written]:
    """New reports by (level, label). ``reused`` maps fingerprints of reports kept from the
    published snapshot to their (title, summary), for parents written from children."""
    written: dict[tuple[int, int], Written] = {}
    counted: dict[int, Counter[str]] = {}  # chunk id -> its terms, shared by the levels
    for number in reversed(range(len(structure.levels))):
        labels = plan.levels[number].generate
        if not labels:
            continue
        kids = _children_index(structure, number)
        themes = await asyncio.to_thread(
            level_themes, facts.passages, number, labels, len(structure.levels[number].ids), counted
        )
        inputs = [
            _input(
                structure,
                plan,
                facts,
                (number, label),
                _children(structure, written, reused, number + 1, kids.get(label, [])),
                themes=themes.get(label, []),
            )
            for label in labels
        ]
        reports = await asyncio.to_thread(writer.write, inputs)
        _meter_reports(writer, meter, reports)
        vectors: list[list[float] | None] = [None] * len(reports)
        if embedder is not None:
            texts = [f"{r.title}\n{r.summary}" for r in reports]
            found = await asyncio.to_thread(embed_metered, embedder, meter, "embed_reports", texts)
            vectors = list(found)
        for label, report, vector in zip(labels, reports, vectors, strict=True):
            written[(number, label)] = Written(report, vector)
    return written


def level_themes(
    passages: Passages,
    number: int,
    labels: Sequence[int],
    communities: int,
    counted: dict[int, Counter[str]],
) -> dict[int, list[str]]:
    """Keyphrases of the written communities of level ``number`` (label -> phrases), weighed
    against the corpus sample plus these communities' passages for a level of ``communities``
    communities. ``counted`` memoises each passage's terms across levels."""

    def of(chunk_id: int) -> Counter[str]:
        if chunk_id not in counted:
            counted[chunk_id] = terms(passages.texts[chunk_id])
        return counted[chunk_id]

    own = {
        label: [c for c in passages.by_community.get((number, label), []) if c in passages.texts]
        for label in labels
    }
    if not any(own.values()):
        return {}
    pool = sorted(set(passages.sample) | {c for ids in own.values() for c in ids})
    corpus = Corpus.of_counts([of(c) for c in pool], communities)
    themes: dict[int, list[str]] = {}
    for label, ids in own.items():
        counts: Counter[str] = Counter()
        for chunk_id in ids:
            counts.update(of(chunk_id))
        themes[label] = keyphrases(counts, corpus, KEYPHRASES)
    return themes


def _meter_reports(writer: ReportWriter, meter: ModelMeter, reports: Sequence[Report]) -> None:
    """A writer with a model (the LLM one) made one call per report; extractive ones none."""
    model = getattr(writer, "model", None)
    if isinstance(model, str) and reports:
        meter.model_call(
            "report",
            model,
            inputs=len(reports),
            calls=len(reports),
            prompt_tokens=sum(r.usage[0] for r in reports),
            completion_tokens=sum(r.usage[1] for r in reports),
        )


def _input(
    structure: Structure,
    plan: ReportPlan,
    facts: Facts,
    community: tuple[int, int],
    children: list[ChildSummary],
    *,
    themes: Sequence[str] = (),
) -> ReportInput:
    number, label = community
    graph, level, level_plan = structure.graph, structure.levels[number], plan.levels[number]
    entities = []
    for node in level_plan.top_nodes.get(label, np.zeros(0, dtype=np.int64)).tolist():
        name, kind, description = facts.entities.get(int(graph.node_ids[node]), ("?", "", ""))
        entities.append(EntityFact(name, kind, description, float(structure.pagerank[node])))
    relations = []
    for row in level_plan.top_rels.get(label, np.zeros(0, dtype=np.int64)).tolist():
        kind, description = facts.relations.get(int(graph.rel_ids[row]), ("RELATED_TO", ""))
        source = facts.entities.get(int(graph.node_ids[graph.rel_src[row]]), ("?", "", ""))[0]
        target = facts.entities.get(int(graph.node_ids[graph.rel_dst[row]]), ("?", "", ""))[0]
        relations.append(
            RelationFact(source, target, kind, description, float(graph.rel_weight[row]))
        )
    return ReportInput(
        community_id=int(level.ids[label]),
        level=number,
        size=int(level.sizes[label]),
        internal_weight=float(level_plan.internal_weight[label]),
        max_weight=float(level_plan.internal_weight.max(initial=0.0)),
        entities=entities,
        relations=relations,
        children=children,
        keyphrases=tuple(themes),
    )


def _children_index(structure: Structure, number: int) -> dict[int, list[int]]:
    """Level ``number`` label -> its children's labels at the level below."""
    if number + 1 >= len(structure.levels):
        return {}
    parent_label = {int(i): c for c, i in enumerate(structure.levels[number].ids.tolist())}
    index: dict[int, list[int]] = {}
    for child, parent_id in enumerate(structure.levels[number + 1].parent_ids.tolist()):
        index.setdefault(parent_label[parent_id], []).append(child)
    return index


def _children(
    structure: Structure,
    written: Mapping[tuple[int, int], Written],
    reused: Mapping[str, tuple[str, str]],
    child_level: int,
    labels: list[int],
) -> list[ChildSummary]:
    if not labels:
        return []
    below = structure.levels[child_level]
    out: list[ChildSummary] = []
    for child in labels:
        mine = written.get((child_level, child))
        title, summary = (
            (mine.report.title, mine.report.summary)
            if mine is not None
            else reused.get(below.fingerprints[child], ("", ""))
        )
        out.append(ChildSummary(title, summary, int(below.sizes[child])))
    out.sort(key=lambda c: -c.size)
    return out
