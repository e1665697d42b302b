"""Time-scoped facts (issue 31, step 2): which facts held during [a, b], and what an entity's
relationships were at a time t, from ``fact_times`` (alembic 0023).

A row of ``fact_times`` says when the facts of one sentence held; the facts are that
sentence's mentions (an entity's attributes: "born on 2 March 1911") and the relationships it
is evidence of, in the same chunk. Two reads, each driven by an index:

- **by entity**: the entity's mentions and the evidence of its relationships (optionally of
  one type) lead to their chunks' times (``mentions_entity``, ``relationships`` keys,
  ``fact_times_chunk``), then the window;
- **by time**: the window alone (``fact_times_holds``, GiST), optionally of one relationship
  type.

A window is a day (``at``: the facts whose span contains it) or days ``[from, to]`` (the facts
whose span meets them; an open side is unbounded). A span with an open side meets every window
on that side: a sentence that says only when something ended does not say it held before.

Under the visibility rule (docs/access-control.md): a fact is read through its document, which
the caller must see and which must be in the query's scope (``filters``); names come from the
caller's view of the entities (``entity_facts``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.access import Caller
from services.retrieval.schemas import FactEntity, FactRelationship, TimedFact
from services.retrieval.visibility import DOC_VISIBLE, Filtered, entity_facts

MAX_FACTS = 200

_COLUMNS = "t.id, t.chunk_id, t.doc_id, t.sentence, t.valid_from, t.valid_to, t.expression"
_WINDOW = (
    "(CAST(:at AS date) IS NULL OR t.holds @> CAST(:at AS date))"
    " AND (NOT :windowed OR t.holds && daterange(CAST(:lo AS date), CAST(:hi AS date), '[]'))"
)
_OF_TYPE = (
    "(CAST(:type AS text) IS NULL OR EXISTS (SELECT 1 FROM relationship_evidence ev"
    " JOIN relationships r ON r.id = ev.relationship_id WHERE ev.chunk_id = t.chunk_id"
    " AND ev.sentence = t.sentence AND r.type = CAST(:type AS text)"
    " AND (CAST(:e AS bigint) IS NULL OR :e IN (r.source_id, r.target_id))))"
)
# The narrowest spans first (the facts most specific to the window; an open side last), then
# the earliest.
_ORDER = (
    " ORDER BY t.valid_to - t.valid_from NULLS LAST, t.valid_from NULLS FIRST, t.valid_to,"
    " t.id LIMIT :n"
)
# The entity's sentences: the ones that mention it, and the evidence of its relationships.
_OF_ENTITY = (
    "SELECT t.id FROM mentions m JOIN fact_times t"
    "  ON t.chunk_id = m.chunk_id AND t.sentence = m.sentence WHERE m.entity_id = :e"
    " UNION SELECT t.id FROM relationships r"
    "  JOIN relationship_evidence ev ON ev.relationship_id = r.id"
    "  JOIN fact_times t ON t.chunk_id = ev.chunk_id AND t.sentence = ev.sentence"
    "  WHERE (r.source_id = :e OR r.target_id = :e)"
    "  AND (CAST(:type AS text) IS NULL OR r.type = CAST(:type AS text))"
)


def _read(where: str, restricted: bool) -> str:
    join = " JOIN documents d ON d.doc_id = t.doc_id" if restricted else ""
    visible = f" AND {DOC_VISIBLE}" if restricted else ""
    return f"SELECT {_COLUMNS} FROM fact_times t{join} WHERE {where}{visible}{_ORDER}"  # noqa: S608 - constants


_BY_ENTITY_WHERE = f"t.id IN ({_OF_ENTITY}) AND {_WINDOW} AND {_OF_TYPE}"
_BY_TIME_WHERE = f"{_WINDOW} AND {_OF_TYPE}"
BY_ENTITY = Filtered.of(_read(_BY_ENTITY_WHERE, False), _read(_BY_ENTITY_WHERE, True))
BY_TIME = Filtered.of(_read(_BY_TIME_WHERE, False), _read(_BY_TIME_WHERE, True))
_SENTENCE_ENTITIES = text(
    "SELECT DISTINCT m.chunk_id, m.sentence, m.entity_id FROM mentions m"
    " WHERE m.chunk_id = ANY(:c) ORDER BY m.entity_id"
)
_SENTENCE_RELATIONSHIPS = text(
    "SELECT ev.chunk_id, ev.sentence, r.id, r.source_id, r.target_id, r.type"
    " FROM relationship_evidence ev JOIN relationships r ON r.id = ev.relationship_id"
    " WHERE ev.chunk_id = ANY(:c) ORDER BY r.weight DESC, r.id"
)


@dataclass(frozen=True)
class Window:
    """A day (``at``), or days ``[lo, hi]`` with open sides as None; neither: any time."""

    at: date | None = None
    lo: date | None = None
    hi: date | None = None

    def __post_init__(self) -> None:
        if self.at is not None and (self.lo is not None or self.hi is not None):
            raise ValueError("a window is a day (at) or days (from, to), not both")
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise ValueError(f"from {self.lo} is after to {self.hi}")

    @property
    def open(self) -> bool:
        """Whether it admits any time."""
        return self.at is None and self.lo is None and self.hi is None

    def values(self) -> dict[str, object]:
        """Its bound values."""
        windowed = self.lo is not None or self.hi is not None
        return {"at": self.at, "lo": self.lo, "hi": self.hi, "windowed": windowed}


async def read_facts(
    conn: AsyncConnection,
    caller: Caller,
    *,
    entity_id: int | None,
    window: Window,
    rel_type: str | None = None,
    limit: int = 50,
) -> list[TimedFact]:
    """The time-scoped facts of an entity (or of the whole graph) in ``window``, the
    narrowest spans first, each with the entities and relationships its sentence states."""
    values = {**window.values(), "e": entity_id, "type": rel_type, "n": min(limit, MAX_FACTS)}
    read = BY_TIME if entity_id is None else BY_ENTITY
    rows = (await conn.execute(*read.bind(caller, values))).all()
    if not rows:
        return []
    chunks = sorted({int(r.chunk_id) for r in rows})
    wanted = {(int(r.chunk_id), str(r.sentence)) for r in rows}
    named: dict[tuple[int, str], list[int]] = defaultdict(list)
    for c, s, e in (await conn.execute(_SENTENCE_ENTITIES, {"c": chunks})).all():
        if (c, s) in wanted:
            named[(c, s)].append(int(e))
    related: dict[tuple[int, str], list[tuple[int, int, int, str]]] = defaultdict(list)
    for c, s, rid, src, tgt, typ in (
        await conn.execute(_SENTENCE_RELATIONSHIPS, {"c": chunks})
    ).all():
        if (c, s) in wanted:
            related[(c, s)].append((int(rid), int(src), int(tgt), str(typ)))
    ids = {e for es in named.values() for e in es}
    ids |= {end for rs in related.values() for _, a, b, _ in rs for end in (a, b)}
    seen = await entity_facts(conn, caller, sorted(ids))
    facts = []
    for r in rows:
        key = (int(r.chunk_id), str(r.sentence))
        facts.append(
            TimedFact(
                valid_from=None if r.valid_from is None else r.valid_from.isoformat(),
                valid_to=None if r.valid_to is None else r.valid_to.isoformat(),
                expression=str(r.expression),
                sentence=str(r.sentence),
                doc_id=str(r.doc_id),
                entities=[FactEntity(id=e, name=seen[e].name) for e in named[key] if e in seen],
                relationships=[
                    FactRelationship(
                        id=rid,
                        source_id=a,
                        source=seen[a].name,
                        target_id=b,
                        target=seen[b].name,
                        type=typ,
                    )
                    for rid, a, b, typ in related[key]
                    if a in seen and b in seen
                ],
            )
        )
    return facts
