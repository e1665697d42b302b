"""What a typed graph plan's answer must hold, computed from the raw provenance rows in Python
(docs/access-control.md's visibility, services/retrieval/plans.py's rules), and drawn plans:
the reference the ACL properties compare POST /v1/graph/query with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.normalize import entity_key
from services.retrieval.plans import MAX_DEPTH


@dataclass(frozen=True)
class GraphRows:
    """The rows visibility is decided from."""

    keys: dict[int, str]  # entity: its stored key
    stored_types: dict[int, str]  # entity: its stored type
    aliases: list[tuple[int, str, str]]  # entity, alias, alias key
    mentions: list[tuple[int, str, str, str]]  # entity, document, surface, type
    evidence: list[tuple[int, int, int, str, str]]  # relationship, source, target, type, document

    @property
    def surfaces(self) -> list[str]:
        return sorted({s for _, _, s, _ in self.mentions})

    @property
    def types(self) -> list[str]:
        return sorted({y for _, _, _, y, _ in self.evidence})

    @property
    def entity_types(self) -> list[str]:
        return sorted(set(self.stored_types.values()))

    def type_seen(self, docs: set[str] | None) -> dict[int, str]:
        """Each visible entity's type: stored, or for a restricted caller the commonest type
        of its visible mentions (the first in order on a tie, as PostgreSQL's mode() picks)."""
        if docs is None:
            return dict(self.stored_types)
        counts: dict[int, dict[str, int]] = {}
        for e, d, _, y in self.mentions:
            if d in docs:
                counts.setdefault(e, {})[y] = counts.setdefault(e, {}).get(y, 0) + 1
        return {e: min(c, key=lambda y: (-c[y], y)) for e, c in counts.items()}


async def read_rows(conn: AsyncConnection) -> GraphRows:
    """The rows, read once."""

    async def rows(sql: str) -> list[Any]:
        return list((await conn.execute(text(sql))).all())

    return GraphRows(
        keys={int(e): str(k) for e, k in await rows("SELECT id, key FROM entities")},
        stored_types={int(e): str(y) for e, y in await rows("SELECT id, type FROM entities")},
        aliases=[
            (int(e), str(a), str(k))
            for e, a, k in await rows("SELECT entity_id, alias, alias_key FROM aliases")
        ],
        mentions=[
            (int(e), str(d), str(s), str(y))
            for e, d, s, y in await rows("SELECT entity_id, doc_id, surface, type FROM mentions")
        ],
        evidence=[
            (int(r), int(s), int(t), str(y), str(d))
            for r, s, t, y, d in await rows(
                "SELECT ev.relationship_id, r.source_id, r.target_id, r.type, ev.doc_id"
                " FROM relationship_evidence ev JOIN relationships r ON r.id = ev.relationship_id"
            )
        ],
    )


def plan_answer(rows: GraphRows, docs: set[str] | None, plan: dict[str, Any]) -> set[int]:
    """The entities a plan's answer holds for a caller who reads ``docs`` (None: every
    document, as an admin or a whole-corpus caller): named by a stored key or alias (a
    restricted caller: an alias that is the surface of a mention in a readable document),
    walked along relationships with evidence in a readable document and both ends visible."""
    surfaces: dict[int, set[str]] = {}
    for e, d, s, _ in rows.mentions:
        if docs is None or d in docs:
            surfaces.setdefault(e, set()).add(s)
    visible = set(rows.keys) if docs is None else set(surfaces)
    edges = {
        (s, t, y)
        for _, s, t, y, d in rows.evidence
        if docs is None or (d in docs and s in visible and t in visible)
    }

    def named(names: list[str]) -> set[int]:
        keys = {entity_key(n) for n in names}
        found = {e for e, k in rows.keys.items() if docs is None and k in keys}
        found |= {
            e
            for e, alias, k in rows.aliases
            if k in keys and (docs is None or alias in surfaces.get(e, set()))
        }
        return found & visible

    def hop(frontier: set[int], types: list[str], direction: str) -> set[int]:
        out = set()
        for s, t, y in edges:
            if types and y not in types:
                continue
            if direction in ("out", "both") and s in frontier:
                out.add(t)
            if direction in ("in", "both") and t in frontier:
                out.add(s)
        return out

    seen = named(plan["start"]["names"])
    last = set(seen)
    for step in plan.get("follow", []):
        arrived: set[int] = set()
        frontier = set(last)
        for _ in range(step.get("depth", 1)):
            fresh = hop(frontier, step.get("relationships", []), step.get("direction", "out"))
            fresh -= seen
            seen |= fresh
            arrived |= fresh
            frontier = fresh
        last = arrived
    if "exclude" in plan:
        spec = plan["exclude"]
        gone = named(spec["names"])
        last -= gone | hop(gone, spec.get("relationships", []), spec.get("direction", "both"))
    typed = rows.type_seen(docs)
    for key, wanted in (("has", True), ("lacks", False)):
        spec = (plan.get("where") or {}).get(key)
        if spec is not None:
            types, way = spec.get("relationships", []), spec.get("direction", "out")
            ends = set(spec.get("to_types", []))
            last = {
                e
                for e in last
                if any(not ends or typed.get(o) in ends for o in hop({e}, types, way)) == wanted
            }
    return last & visible


def _within_depth(steps: list[dict[str, Any]]) -> bool:
    return sum(int(x["depth"]) for x in steps) <= MAX_DEPTH


@st.composite
def plans(
    draw: st.DrawFn, names: list[str], types: list[str], kinds: list[str] | None = None
) -> dict[str, Any]:
    """A plan from these names, relationship types and entity types (``kinds``): one or two
    start names, up to two steps (three hops in all), a relationship had or lacked (to
    entities of a type) or not, a negation or none, a count or a whole list."""
    named = st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)
    step = st.fixed_dictionaries(
        {
            "relationships": st.lists(st.sampled_from(types), max_size=1),
            "direction": st.sampled_from(["out", "in", "both"]),
            "depth": st.integers(1, 2),
        }
    )
    steps: st.SearchStrategy[list[dict[str, Any]]] = st.lists(step, max_size=2).filter(
        _within_depth
    )
    plan: dict[str, Any] = {
        "start": {"names": draw(named, "start")},
        "follow": draw(steps, "follow"),
        "result": {"op": draw(st.sampled_from(["count", "list"]), "op"), "limit": 200},
    }
    if draw(st.booleans(), "a relationship had or lacked"):
        key = draw(st.sampled_from(["has", "lacks"]), "which")
        plan["where"] = {
            key: {
                "relationships": draw(st.lists(st.sampled_from(types), max_size=1), "of"),
                "direction": draw(st.sampled_from(["out", "in", "both"]), "way"),
                "to_types": draw(st.lists(st.sampled_from(kinds), max_size=1), "to")
                if kinds
                else [],
            }
        }
    if draw(st.booleans(), "negation"):
        plan["exclude"] = {
            "names": draw(named, "exclude"),
            "relationships": draw(st.lists(st.sampled_from(types), max_size=1), "excluded"),
            "direction": draw(st.sampled_from(["out", "in", "both"]), "away"),
        }
    return plan
