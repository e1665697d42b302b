"""Typed graph plans executed (services/retrieval/plans.py says what a plan is): statements
written here, values bound, every read as the caller may see it (services/retrieval/
visibility.py: an entity through a mention in a visible document, a relationship through
visible evidence with both ends visible, names, types and counts rebuilt from visible
mentions), so a count counts only what the caller can see.

Bounds: a plan reaches at most MAX_REACHED entities (a step that would reach more is refused
with what to narrow), and runs within a time budget (PostgreSQL's statement_timeout for each
statement, and the whole plan under the same deadline); both are refused as ``Invalid`` with
the reason. Round trips: one per name list, one per hop, one for the facts of what is kept, one
for the page's evidence (and one for a rank's values or a group's related entities)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.core.extraction import CO_OCCURS
from services.core.normalize import entity_key
from services.retrieval.errors import Invalid
from services.retrieval.graph_memory import MemoryGraph
from services.retrieval.graph_walk import MemoryGraphReads
from services.retrieval.plans import (
    Comparison,
    Direction,
    Evidence,
    Group,
    Plan,
    PlanAnswer,
    Related,
    Row,
    Side,
    Step,
    Where,
)
from services.retrieval.visibility import (
    DOC_VISIBLE,
    EntityFacts,
    Filtered,
    alias_visible,
    entity_facts,
    entity_kinds,
    relationship_visible,
)

MAX_REACHED = 10_000  # entities one plan may hold; past it the plan is refused as too broad
GROUP_MEMBERS = 20  # members a group lists (its count counts them all)
EVIDENCE_PER_ROW = 2  # sentences a row shows
DESCRIPTION_CHARS = 500  # of an entity's description in a comparison
NONE_KEY = "(none)"  # the group of entities related to nothing through the grouping step

_NAMED = Filtered.of(
    "SELECT e.key, e.id FROM entities e WHERE e.key = ANY(:k)"
    " UNION SELECT a.alias_key, a.entity_id FROM aliases a WHERE a.alias_key = ANY(:k)",
    # a restricted caller finds an entity by the names its visible documents use
    "SELECT a.alias_key, a.entity_id FROM aliases a WHERE a.alias_key = ANY(:k) AND "  # noqa: S608 - visibility fragments are constants
    + alias_visible("a"),
)
# Candidates of a type: the stored type for the operator; for a restricted caller, entities
# with a visible mention of the type (a superset: its type is the commonest visible one,
# checked exactly on the facts read afterwards).
_OF_TYPE = Filtered.of(
    "SELECT e.id FROM entities e WHERE e.type = ANY(:t) ORDER BY e.id LIMIT :n",
    "SELECT DISTINCT m.entity_id FROM mentions m JOIN documents d ON d.doc_id = m.doc_id"  # noqa: S608 - DOC_VISIBLE is a constant
    " WHERE m.type = ANY(:t) AND " + DOC_VISIBLE + " ORDER BY 1 LIMIT :n",
)
_ENDS = {
    "out": ("r.source_id", "r.target_id"),
    "in": ("r.target_id", "r.source_id"),
}


def _step_sql(direction: str, visible: bool) -> str:
    """(from, to, relationship id) of one step from the entities ``:f`` along relationships
    of the types ``:t`` (any when ``:any``)."""
    return _step_rows(direction, visible) + " LIMIT :n"  # ordered in Python: past :n, refused


def _degree_sql(direction: str, visible: bool) -> str:
    """(entity, its distinct neighbours one such step away) for the entities ``:f``: counted
    by the database, so a hub's degree costs no rows."""
    rows = _step_rows(direction, visible)
    return f"SELECT here, count(DISTINCT there) FROM ({rows}) s(here, there, rid) GROUP BY here"  # noqa: S608 - constants


def _step_rows(direction: str, visible: bool) -> str:
    parts = []
    for way in ("out", "in") if direction == "both" else (direction,):
        here, there = _ENDS[way]
        where = (
            f"{here} = ANY(:f) AND (CAST(:any AS boolean) OR r.type = ANY(:t))"
            f" AND (NOT CAST(:typed AS boolean) OR r.type <> '{CO_OCCURS}')"
        )
        if visible:
            where += " AND " + relationship_visible("r.id", "r.source_id", "r.target_id")
        parts.append(f"SELECT {here}, {there}, r.id FROM relationships r WHERE {where}")  # noqa: S608 - constants
    return " UNION ALL ".join(parts)


_STEPS = {
    direction: Filtered.of(_step_sql(direction, False), _step_sql(direction, True))
    for direction in ("out", "in", "both")
}
_DEGREES = {
    direction: Filtered.of(_degree_sql(direction, False), _degree_sql(direction, True))
    for direction in ("out", "in", "both")
}
_EVIDENCE = Filtered.of(
    "SELECT DISTINCT ON (ev.relationship_id) ev.relationship_id, ev.doc_id, ev.sentence,"
    " s.name || ' ' || r.type || ' ' || t.name FROM relationship_evidence ev"
    " JOIN relationships r ON r.id = ev.relationship_id JOIN entities s ON s.id = r.source_id"
    " JOIN entities t ON t.id = r.target_id WHERE ev.relationship_id = ANY(:r)"
    " ORDER BY ev.relationship_id, ev.strength DESC, ev.id",
    # names as stored are not shown to a restricted caller: the relationship reads by type, and
    # the row's own name is its visible one
    "SELECT DISTINCT ON (ev.relationship_id) ev.relationship_id, ev.doc_id, ev.sentence,"  # noqa: S608 - DOC_VISIBLE is a constant
    " r.type FROM relationship_evidence ev JOIN relationships r ON r.id = ev.relationship_id"
    " JOIN documents d ON d.doc_id = ev.doc_id WHERE ev.relationship_id = ANY(:r) AND "
    + DOC_VISIBLE
    + " ORDER BY ev.relationship_id, ev.strength DESC, ev.id",
)
_MENTIONED = Filtered.of(
    "SELECT DISTINCT ON (m.entity_id) m.entity_id, m.doc_id, m.sentence FROM mentions m"
    " WHERE m.entity_id = ANY(:e) ORDER BY m.entity_id, m.id",
    "SELECT DISTINCT ON (m.entity_id) m.entity_id, m.doc_id, m.sentence FROM mentions m"  # noqa: S608 - DOC_VISIBLE is a constant
    " JOIN documents d ON d.doc_id = m.doc_id WHERE m.entity_id = ANY(:e) AND "
    + DOC_VISIBLE
    + " ORDER BY m.entity_id, m.id",
)
_PAGERANK = text(
    "SELECT entity_id, pagerank FROM snapshot_entities WHERE snapshot_id = :s"
    " AND entity_id = ANY(:e)"
)


@dataclass
class _Run:
    """One plan's execution: its connection, caller, the held graph its steps walk (None: the
    database) and the round trips taken."""

    conn: AsyncConnection
    caller: Caller
    memory: MemoryGraphReads | None = None
    statements: int = 0
    notes: list[str] = field(default_factory=list)

    async def rows(self, form: Filtered, values: dict[str, object]) -> Sequence[Any]:
        self.statements += 1
        return (await self.conn.execute(*form.bind(self.caller, values))).all()

    async def step(
        self, entities: Sequence[int], step: Step | Related, direction: Direction
    ) -> Sequence[Any]:
        """(from, to, relationship id) of one step from ``entities`` (at most one row past
        MAX_REACHED: the caller refuses past it)."""
        if self.memory is None:
            return await self.rows(_STEPS[direction], _bounded(_along(entities, step)))
        here, there, rels = self.memory.steps(entities, direction, step.relationships, step.typed)
        n = MAX_REACHED + 1
        return list(zip(here[:n].tolist(), there[:n].tolist(), rels[:n].tolist(), strict=True))

    async def degrees(self, entities: Sequence[int], related: Related) -> dict[int, float]:
        """Each entity's distinct neighbours one ``related`` step away (absent: none)."""
        if self.memory is None:
            rows = await self.rows(_DEGREES[related.direction], _along(entities, related))
            return {int(e): float(n) for e, n in rows}
        here, there, _ = self.memory.steps(
            entities, related.direction, related.relationships, related.typed
        )
        if not here.size:
            return {}
        pairs = np.unique(np.stack([here, there]), axis=1)
        found, counts = np.unique(pairs[0], return_counts=True)
        return dict(zip(found.tolist(), counts.astype(float).tolist(), strict=True))


@dataclass(frozen=True)
class _Reached:
    """Entities a walk reached: hops from the start and the relationship that first reached
    each (None for a start entity), and those its last step arrived at (the start entities
    when it has no step)."""

    hops: dict[int, int]
    via: dict[int, int | None]
    last: set[int]


async def execute(
    conn: AsyncConnection,
    plan: Plan,
    caller: Caller,
    *,
    snapshot_id: int | None,
    budget_s: float,
    memory: MemoryGraph | None = None,
) -> PlanAnswer:
    """The plan's answer from what the caller can see, within ``budget_s`` seconds; its steps
    walk ``memory`` (the held graph, when this read may: QueryService.walkable) unless the
    caller reads through a document scope (filters), which the held graph does not hold."""
    await conn.execute(text(f"SET LOCAL statement_timeout = {max(1, int(budget_s * 1000))}"))
    walked = memory if caller.scope is None else None
    run = _Run(conn, caller, None if walked is None else MemoryGraphReads(walked, conn, caller))
    try:
        async with asyncio.timeout(budget_s):
            return await _answer(run, plan, snapshot_id)
    except (TimeoutError, DBAPIError) as exc:
        if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) != "57014":
            raise
        raise Invalid(
            "Plan ran too long",
            f"the plan did not finish within {budget_s:g} s; start from fewer entities, name "
            "relationship types, or lower the depth",
        ) from None


async def _answer(run: _Run, plan: Plan, snapshot_id: int | None) -> PlanAnswer:
    if plan.result.op == "compare":
        return await _compare(run, plan, snapshot_id)
    start_ids = await _start(run, plan)
    facts = await entity_kinds(run.conn, run.caller, sorted(start_ids))
    run.statements += 1
    if plan.start.types:
        wanted = set(plan.start.types)
        start_ids = [e for e in start_ids if e in facts and facts[e].type in wanted]
    start_ids = [e for e in start_ids if e in facts]
    started = [_row(e, facts[e], 0) for e in sorted(start_ids, key=lambda e: _order(e, facts))]
    reached = await _walk(run, plan.follow, start_ids)
    kept = set(reached.last)
    if plan.exclude is not None:
        excluded = _all(await _named(run, plan.exclude.names, "exclude"))
        kept -= set(excluded)
        step = Step(relationships=plan.exclude.relationships, direction=plan.exclude.direction)
        kept -= set((await _walk(run, [step], excluded)).hops)
    more = sorted(kept - facts.keys())
    if more:
        facts |= await entity_kinds(run.conn, run.caller, more)
        run.statements += 1
    kept = {e for e in kept if e in facts}
    if plan.where is not None:
        kept = await _kept(run, plan.where, kept, facts, start_ids)
    answer = PlanAnswer(plan=plan, snapshot_id=snapshot_id, started_from=started, count=len(kept))
    op = plan.result
    if op.op == "count":
        rows: list[Row] = []
    elif op.op == "group":
        groups = await _groups(run, plan, kept, facts)
        answer = answer.model_copy(update={"groups": groups})
        rows = []
    else:
        ordered = sorted(kept, key=lambda e: _order(e, facts))
        values: dict[int, float] = {}
        if op.op == "rank":
            values = await _rank_values(run, plan, ordered, facts, snapshot_id)
            ordered.sort(key=lambda e: (-values.get(e, 0.0), *_order(e, facts)))
        page = ordered[op.offset : op.offset + op.limit]
        rows = await _with_evidence(run, page, reached, facts, values)
    done = {"rows": rows, "statements": run.statements, "notes": run.notes}
    return answer.model_copy(update=done)


async def _kept(
    run: _Run,
    where: Where,
    kept: set[int],
    facts: dict[int, EntityFacts],
    start_ids: Sequence[int],
) -> set[int]:
    """The entities ``where`` keeps: of its types (or the start's), with (``has``) or without
    (``lacks``) a relationship of its step, as the caller sees relationships."""
    if where.types or where.like_start:
        types = set(where.types)
        if where.like_start:
            types |= {facts[e].type for e in start_ids}
        kept = {e for e in kept if facts[e].type in types}
    for step, wanted in ((where.has, True), (where.lacks, False)):
        if step is not None and kept:
            degrees = await _degrees(run, step, sorted(kept), facts)
            kept = {e for e in kept if (degrees.get(e, 0.0) > 0) == wanted}
    return kept


def _order(entity: int, facts: dict[int, EntityFacts]) -> tuple[str, int]:
    """Rows list by name, then id (one order, whoever asks)."""
    return (facts[entity].name.casefold(), entity)


def _row(entity: int, facts: EntityFacts, hops: int, value: float | None = None) -> Row:
    return Row(id=entity, name=facts.name, type=facts.type, hops=hops, value=value)


async def _start(run: _Run, plan: Plan) -> list[int]:
    """The start entities: the named ones, or candidates of the start types."""
    if plan.start.names:
        return _all(await _named(run, plan.start.names, "start"))
    found = [int(r[0]) for r in await run.rows(_OF_TYPE, _bounded({"t": plan.start.types}))]
    _check_breadth(len(found), "the start types")
    return found


async def _named(run: _Run, names: Sequence[str], part: str) -> dict[str, list[int]]:
    """The entities each name names (exact name or alias, as the resolver keys them); a note
    per name that names none the caller can see."""
    keys = {name: entity_key(name) for name in names}
    rows = await run.rows(_NAMED, {"k": sorted(set(keys.values()))})
    by_key: dict[str, set[int]] = {}
    for key, entity in rows:
        by_key.setdefault(str(key), set()).add(int(entity))
    for name, key in keys.items():
        if key not in by_key:
            run.notes.append(f"{part}: {name!r} names no entity you can see")
    return {name: sorted(by_key.get(key, ())) for name, key in keys.items()}


def _all(named: dict[str, list[int]]) -> list[int]:
    return sorted({e for found in named.values() for e in found})


def _along(entities: Sequence[int], step: Step | Related) -> dict[str, object]:
    """The bound values of a step's statement from these entities (``_step_sql``)."""
    return {
        "f": list(entities),
        "t": list(step.relationships),
        "any": not step.relationships,
        "typed": step.typed,
    }


def _bounded(values: dict[str, object]) -> dict[str, object]:
    """Values with the row bound: one more row than a plan may hold, to tell it went past."""
    return {**values, "n": MAX_REACHED + 1}


def _check_breadth(found: int, what: str) -> None:
    if found > MAX_REACHED:
        raise Invalid(
            "Plan too broad",
            f"{what} reach more than {MAX_REACHED:,} entities; name start entities, "
            "relationship types or entity types to narrow it",
        )


async def _walk(run: _Run, steps: Sequence[Step], start: Sequence[int]) -> _Reached:
    """Every entity within the steps from the start (a step of depth d: its hop repeated d
    times, each from the entities the last hop reached first); the next step starts from all
    a step arrived at, and an entity counts once, at its first arrival (so the last step's
    entities are those the walk had not reached before: "who else supplies X's customers"
    does not list X)."""
    hops: dict[int, int] = dict.fromkeys(start, 0)
    via: dict[int, int | None] = dict.fromkeys(start, None)
    frontier = sorted(start)
    last: set[int] = set(start)
    level = 0
    for number, step in enumerate(steps, 1):
        arrived: set[int] = set()
        for _ in range(step.depth):
            if not frontier:
                break
            level += 1
            rows = await run.step(frontier, step, step.direction)
            _check_breadth(len(rows), f"step {number}")
            fresh: list[int] = []
            for _, there, rel in sorted(rows, key=lambda r: int(r[2])):  # first by id reaches
                other = int(there)
                if other not in hops:
                    hops[other], via[other] = level, int(rel)
                    fresh.append(other)
            _check_breadth(len(hops), f"step {number}")
            arrived.update(fresh)
            frontier = sorted(set(fresh))
        frontier, last = sorted(arrived), arrived  # the next step starts where this one arrived
    return _Reached(hops, via, last)


async def _with_evidence(
    run: _Run,
    page: Sequence[int],
    reached: _Reached,
    facts: dict[int, EntityFacts],
    values: dict[int, float],
) -> list[Row]:
    """The page's rows, each with the sentence of the relationship that reached it (or one
    naming it, for a start entity)."""
    rels = sorted({r for e in page if (r := reached.via.get(e)) is not None})
    starts = sorted(e for e in page if reached.via.get(e) is None)
    said: dict[int, Evidence] = {}
    if rels:
        for rel, doc, sentence, label in await run.rows(_EVIDENCE, {"r": rels}):
            said[int(rel)] = Evidence(
                doc_id=str(doc), sentence=str(sentence), relationship=str(label)
            )
    named: dict[int, Evidence] = {}
    if starts:
        for entity, doc, sentence in await run.rows(_MENTIONED, {"e": starts}):
            named[int(entity)] = Evidence(doc_id=str(doc), sentence=str(sentence))
    rows = []
    for e in page:
        rel = reached.via.get(e)
        found = said.get(rel) if rel is not None else named.get(e)
        rows.append(
            _row(e, facts[e], reached.hops.get(e, 0), values.get(e)).model_copy(
                update={"evidence": [found] if found else []}
            )
        )
    return rows


async def _related(
    run: _Run, related: Related, entities: Sequence[int], facts: dict[int, EntityFacts]
) -> dict[int, set[int]]:
    """The entities one step from each (by the step's types and direction; of its
    ``to_types`` only, as the caller sees their types), their facts added to ``facts``."""
    if not entities:
        return {}
    rows = await run.step(sorted(entities), related, related.direction)
    _check_breadth(len(rows), "the related step")
    out: dict[int, set[int]] = {}
    for here, there, _ in rows:
        out.setdefault(int(here), set()).add(int(there))
    more = sorted({o for others in out.values() for o in others} - facts.keys())
    if more:
        facts |= await entity_kinds(run.conn, run.caller, more)
        run.statements += 1
    wanted = set(related.to_types)
    kept = {
        e: {o for o in others if o in facts and (not wanted or facts[o].type in wanted)}
        for e, others in out.items()
    }
    return {e: others for e, others in kept.items() if others}


async def _rank_values(
    run: _Run,
    plan: Plan,
    ordered: Sequence[int],
    facts: dict[int, EntityFacts],
    snapshot_id: int | None,
) -> dict[int, float]:
    """Each entity's rank value: relationships of the ``related`` step (degree, any type in
    both directions by default), visible mentions, or the published snapshot's PageRank."""
    by = plan.result.rank_by
    if by == "mentions":
        return {e: float(facts[e].mentions) for e in ordered}
    if by == "pagerank":
        if not (run.caller.admin and run.caller.scope is None):
            raise Invalid(
                "Rank not available",
                "PageRank is computed over the whole graph, documents deleted since included; "
                "other callers rank by degree or mentions",
            )
        if snapshot_id is None:
            raise Invalid("Rank not available", "no community snapshot is published yet")
        run.statements += 1
        rows = await run.conn.execute(_PAGERANK, {"s": snapshot_id, "e": list(ordered)})
        return {int(e): float(p) for e, p in rows.all()}
    related = plan.result.related or Related(direction="both")
    degrees = await _degrees(run, related, ordered, facts)
    return {e: degrees.get(e, 0.0) for e in ordered}


async def _degrees(
    run: _Run, related: Related, entities: Sequence[int], facts: dict[int, EntityFacts]
) -> dict[int, float]:
    """Each entity's distinct neighbours one ``related`` step away (absent: none), counted by
    the database as the caller sees relationships (read and typed here when the step keeps
    neighbours of ``to_types`` only)."""
    if related.to_types:
        return {
            e: float(len(o)) for e, o in (await _related(run, related, entities, facts)).items()
        }
    return await run.degrees(list(entities), related)


async def _groups(
    run: _Run, plan: Plan, kept: set[int], facts: dict[int, EntityFacts]
) -> list[Group]:
    """Groups by type, or by the entities each is related to (an entity in each of its
    groups; a group per related entity, its key the entity's name, with its id when two
    share the name), largest first, then by key."""
    members: dict[str, list[int]] = {}
    if plan.result.group_by == "type":
        for e in kept:
            members.setdefault(facts[e].type, []).append(e)
    else:
        assert plan.result.related is not None  # noqa: S101 - the model requires it
        related = await _related(run, plan.result.related, sorted(kept), facts)
        keys = _group_keys({o for others in related.values() for o in others}, facts)
        for e in kept:
            for key in sorted({keys[o] for o in related.get(e, ())}) or [NONE_KEY]:
                members.setdefault(key, []).append(e)
    groups = [
        Group(
            key=key,
            count=len(ids),
            members=[facts[e].name for e in sorted(ids, key=lambda e: _order(e, facts))][
                :GROUP_MEMBERS
            ],
        )
        for key, ids in members.items()
    ]
    groups.sort(key=lambda g: (-g.count, g.key))
    page = plan.result
    return groups[page.offset : page.offset + page.limit]


def _group_keys(entities: set[int], facts: dict[int, EntityFacts]) -> dict[int, str]:
    """Each entity's group key: its name, and its id too when another shares the name (two
    entities are two groups, whatever they are called)."""
    named: dict[str, list[int]] = {}
    for e in entities:
        named.setdefault(facts[e].name, []).append(e)
    return {
        e: name if len(ids) == 1 else f"{name} (#{e})" for name, ids in named.items() for e in ids
    }


async def _compare(run: _Run, plan: Plan, snapshot_id: int | None) -> PlanAnswer:
    """Two named entities side by side: facts, and neighbours as "TYPE direction: Name". A
    name that names several entities stands for the one with the most (visible) mentions."""
    named = await _named(run, plan.start.names, "compare")
    facts = await entity_facts(run.conn, run.caller, _all(named))
    run.statements += 1
    sides = []
    for name, found in named.items():
        seen = [e for e in found if e in facts]
        if not seen:
            raise Invalid("Nothing to compare", f"{name!r} names no entity you can see")
        sides.append(max(seen, key=lambda e: (facts[e].mentions, -e)))
    a, b = sides
    if a == b:
        raise Invalid("Nothing to compare", "both names are the same entity")
    rels: dict[int, list[tuple[str, int]]] = {a: [], b: []}
    for direction in ("out", "in"):
        rows = await run.step([a, b], Related(), direction)
        _check_breadth(len(rows), "the comparison's neighbours")
        types = await _relationship_types(run, [int(r) for _, _, r in rows])
        for here, there, rel in rows:
            rels[int(here)].append((f"{types[int(rel)]} {direction}", int(there)))
    others = sorted({o for pairs in rels.values() for _, o in pairs} - facts.keys())
    if others:
        facts |= await entity_kinds(run.conn, run.caller, others)
        run.statements += 1
    labels = {
        side: {f"{kind}: {facts[o].name}" for kind, o in pairs if o in facts}
        for side, pairs in rels.items()
    }

    comparison = Comparison(
        a=_side(a, facts[a]),
        b=_side(b, facts[b]),
        shared=sorted(labels[a] & labels[b]),
        only_a=sorted(labels[a] - labels[b]),
        only_b=sorted(labels[b] - labels[a]),
    )
    return PlanAnswer(
        plan=plan,
        snapshot_id=snapshot_id,
        started_from=[_row(e, facts[e], 0) for e in (a, b)],
        count=2,
        comparison=comparison,
        statements=run.statements,
        notes=run.notes,
    )


def _side(entity: int, facts: EntityFacts) -> Side:
    return Side(
        entity=_row(entity, facts, 0),
        aliases=facts.aliases,
        description=facts.description[:DESCRIPTION_CHARS],
        mentions=facts.mentions,
    )


_TYPES = text("SELECT id, type FROM relationships WHERE id = ANY(:r)")


async def _relationship_types(run: _Run, rels: Sequence[int]) -> dict[int, str]:
    """Relationship types by id (of relationships the caller's statements already admitted)."""
    if not rels:
        return {}
    run.statements += 1
    rows = await run.conn.execute(_TYPES, {"r": sorted(set(rels))})
    return {int(r): str(t) for r, t in rows.all()}
