"""Consolidation (issue 21, deliverable 1): duplicate entities the resolver left apart at
ingest, looked at again with the context gathered since, and merged by curations made by
"consolidation" (services/core/curations.py). A consolidation is therefore a rule like a
person's: applied to the stored documents by the indexer, kept at every later ingest, equal to
a rebuild under the rules, listed by `kgstream curate list` and undone exactly by `curate undo`
(an undone one is never proposed again).

The resolver keeps a short form in one document apart from the full name in another ("Kings"
and "Sacramento Kings"): one document gives no context to tell which is meant. The evidence
(docs/curation.md, "Consolidation", has the measurements that chose the rules):
- **name**: the shorter name is the longer one's last words ("Rockets" / "Houston Rockets",
  "Stafford" / "Henry Stafford"), and the two type groups are compatible;
- **graph**: the two share a document or a relationship neighbour;
- **context**: the sentences of their first mentions, with their titles: an LLM adjudicator
  reads them; their embeddings' cosine is reported (it orders the pairs for a person);
- **one reading**: no other longer name is merged with the same short one ("Williams" with two
  Williamses in the graph is left alone).

A pair that passes name and graph is in the band consolidation decides. Offline, nothing in
the graph decides it safely: measured on the development graphs, every rule of names, shared
context and context cosine merged another thing with the short name ("Jakarta" / "South
Jakarta", "Baum" the father / "Frank Joslyn Baum" the son) along with the duplicates. So with
no LLM configured, consolidation merges nothing and writes the band out for a person to judge
(``review_items``, then `kgstream review apply`); with one, the LLM decides each pair from both
sentences."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.curations import CurationError, create, load_rules
from services.core.embedding import Embedder
from services.core.llm.adjudicator import ContextAdjudicator
from services.maintenance.review import side

BY = "consolidation"

# Every (short, long) pair where the short entity's key is the long one's last words: the long
# key's proper word suffixes, each looked up by the key index; both of one tenant (entities are
# per tenant: services/indexer/scope.py). The rule a pair becomes is by name, and so applies
# within every tenant, as a person's does (docs/curation.md).
_PAIRS = text(
    "SELECT s.id AS short_id, s.key AS short_key, s.name AS short_name,"
    " s.type_group AS short_group, l.id AS long_id, l.key AS long_key, l.name AS long_name,"
    " l.type_group AS long_group"
    " FROM entities l CROSS JOIN LATERAL"
    "  generate_series(2, cardinality(string_to_array(l.key, ' '))) AS w(i)"
    " JOIN entities s ON s.key = array_to_string((string_to_array(l.key, ' '))[w.i:], ' ')"
    " WHERE s.id <> l.id AND s.tenant IS NOT DISTINCT FROM l.tenant ORDER BY s.id, l.id"
)
_SHARED = text(
    "SELECT EXISTS (SELECT 1 FROM mentions a JOIN mentions b ON b.doc_id = a.doc_id"
    "  AND b.entity_id = :l WHERE a.entity_id = :s)"
    " OR EXISTS (SELECT 1 FROM"
    "  (SELECT CASE WHEN source_id = :s THEN target_id ELSE source_id END AS n"
    "   FROM relationships WHERE source_id = :s OR target_id = :s) x"
    "  JOIN (SELECT CASE WHEN source_id = :l THEN target_id ELSE source_id END AS n"
    "   FROM relationships WHERE source_id = :l OR target_id = :l) y ON y.n = x.n"
    "  WHERE x.n <> :s AND x.n <> :l)"
)
_FIRST_CONTEXT = text(
    "SELECT d.title, m.sentence FROM mentions m JOIN documents d ON d.doc_id = m.doc_id"
    " WHERE m.entity_id = :e AND m.start_char >= 0 AND NOT d.deleted"
    " ORDER BY m.doc_id, m.start_char LIMIT 1"
)
_VERDICTS = text("SELECT key_short, key_long, same FROM consolidation_verdicts")
_REMEMBER = text(
    "INSERT INTO consolidation_verdicts (key_short, key_long, same) VALUES (:s, :l, :same)"
    " ON CONFLICT (key_short, key_long) DO UPDATE SET same = EXCLUDED.same, decided_at = now()"
)
_FORGET = text("DELETE FROM consolidation_verdicts")
# Pairs a person (or an earlier run) decided: a merge of them undone, in either direction.
_UNDONE = text(
    "SELECT key_a, key_b FROM curations WHERE kind IN ('merge', 'alias') AND undone_at IS NOT NULL"
)
_WILDCARD = "ANY"

Decision = Literal["adjudicated", "declined", "uncertain", "ambiguous", "ruled", "apart"]


@dataclass(frozen=True)
class Pair:
    """A candidate pair with its evidence and what consolidation decides: ``adjudicated`` /
    ``declined`` (the LLM's answer: merge or not), ``uncertain`` (in the band, no adjudicator),
    ``ambiguous`` (the LLM would merge another longer name with the short one too), ``ruled``
    (a rule or an undone merge decided it), or ``apart`` (no shared context)."""

    short_id: int
    long_id: int
    short_key: str
    long_key: str
    short: str
    long: str
    short_group: str
    long_group: str
    shared_context: bool  # a document or a relationship neighbour in common
    cosine: float  # of their first mentions' "title: sentence"
    decision: Decision
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        """For `--json` and logs."""
        return asdict(self) | {"cosine": round(self.cosine, 3)}


@dataclass(frozen=True)
class Report:
    """One run: the pairs looked at, and the curations made (ids) or refused (reasons)."""

    pairs: list[Pair]
    made: list[int]
    refused: list[str]
    dry_run: bool


def _compatible(a: str, b: str) -> bool:
    return a == b or _WILDCARD in (a, b)


async def find(
    conn: AsyncConnection,
    embedder: Embedder,
    adjudicate: ContextAdjudicator | None = None,
    *,
    remember: bool = False,
) -> list[Pair]:
    """Every candidate pair with its evidence and decision (``adjudicate`` asks an LLM about
    the band it has not answered before; ``remember`` keeps its answers, else nothing is
    written)."""
    rules = await load_rules(conn)
    undone = {frozenset((str(a), str(b))) for a, b in (await conn.execute(_UNDONE)).all()}
    rows = [
        r for r in (await conn.execute(_PAIRS)).all() if _compatible(r.short_group, r.long_group)
    ]
    seen: list[tuple[Any, bool]] = []
    contexts: dict[int, str] = {}
    for r in rows:
        shared = bool(await conn.scalar(_SHARED, {"s": r.short_id, "l": r.long_id}))
        seen.append((r, shared))
        if shared:
            for entity in (int(r.short_id), int(r.long_id)):
                if entity not in contexts:
                    first = (await conn.execute(_FIRST_CONTEXT, {"e": entity})).first()
                    contexts[entity] = "" if first is None else f"{first.title}: {first.sentence}"
    cosines = await _cosines(embedder, seen, contexts)
    verdicts = {(str(a), str(b)): bool(same) for a, b, same in (await conn.execute(_VERDICTS))}
    await conn.rollback()  # no transaction held while the model answers
    out: list[Pair] = []
    for (r, shared), cos in zip(seen, cosines, strict=True):
        keys = frozenset((str(r.short_key), str(r.long_key)))
        pair = Pair(
            int(r.short_id), int(r.long_id), str(r.short_key), str(r.long_key),
            str(r.short_name), str(r.long_name), str(r.short_group), str(r.long_group),
            shared, cos, "apart",
        )  # fmt: skip
        asked = verdicts.get((pair.short_key, pair.long_key))
        if rules.apart(*keys) or keys in undone or str(r.short_key) in rules.redirects:
            pair = replace(pair, decision="ruled", note="a rule or an undone merge decided it")
        elif shared and asked is not None:
            pair = replace(
                pair, decision="adjudicated" if asked else "declined", note="asked before"
            )
        elif shared and adjudicate is not None:
            same = await adjudicate(
                pair.short, contexts[pair.short_id], pair.long, contexts[pair.long_id],
                pair.long_group,
            )  # fmt: skip
            if remember:
                await conn.execute(
                    _REMEMBER, {"s": pair.short_key, "l": pair.long_key, "same": same}
                )
                await conn.commit()
            pair = replace(pair, decision="adjudicated" if same else "declined")
        elif shared:
            pair = replace(pair, decision="uncertain")
        out.append(pair)
    return _one_reading(out)


async def review_items(conn: AsyncConnection, pairs: Sequence[Pair]) -> list[dict[str, Any]]:
    """The uncertain pairs as review items (services/maintenance/review.py) for a person to
    judge; `kgstream review apply` turns the verdicts into curations."""
    items = []
    for p in pairs:
        if p.decision == "uncertain":
            a, b = await side(conn, p.long_id, None), await side(conn, p.short_id, None)
            if a["contexts"] and b["contexts"]:
                items.append({"kind": "candidate", "a": a, "b": b, "cosine": round(p.cosine, 3)})
    return items


async def _cosines(
    embedder: Embedder, seen: Sequence[tuple[Any, bool]], contexts: dict[int, str]
) -> list[float]:
    ids = [e for e, t in contexts.items() if t]
    vectors: dict[int, np.ndarray] = {}
    if ids:
        found = await asyncio.to_thread(embedder.embed, [contexts[e] for e in ids])
        for e, v in zip(ids, found, strict=True):
            vec = np.asarray(v, dtype=np.float64)
            norm = float(np.linalg.norm(vec))
            vectors[e] = vec / norm if norm else vec
    out = []
    for r, _shared in seen:
        a, b = vectors.get(int(r.short_id)), vectors.get(int(r.long_id))
        out.append(float(a @ b) if a is not None and b is not None else 0.0)
    return out


def _one_reading(pairs: list[Pair]) -> list[Pair]:
    """A short name two longer names would take (two Williamses) is merged with neither."""
    merging: dict[int, int] = {}
    for p in pairs:
        if p.decision == "adjudicated":
            merging[p.short_id] = merging.get(p.short_id, 0) + 1
    return [
        replace(p, decision="ambiguous", note="another longer name passes too")
        if p.decision == "adjudicated" and merging[p.short_id] > 1
        else p
        for p in pairs
    ]


async def consolidate(
    engine: AsyncEngine,
    embedder: Embedder,
    *,
    adjudicate: ContextAdjudicator | None = None,
    dry_run: bool = False,
    reconsider: bool = False,
    on_pair: Callable[[Pair], None] | None = None,
) -> Report:
    """Find the pairs, and (unless ``dry_run``) make a merge curation for each one decided:
    pending until the indexer applies it. The adjudicator's answers are kept, so a pair is
    asked about once; ``reconsider`` forgets them first (the graph has grown, the model
    changed)."""
    if reconsider and not dry_run:
        async with engine.begin() as conn:
            await conn.execute(_FORGET)
    async with engine.connect() as conn:
        pairs = await find(conn, embedder, adjudicate, remember=not dry_run)
    made: list[int] = []
    refused: list[str] = []
    for p in pairs:
        if on_pair is not None:
            on_pair(p)
        if p.decision != "adjudicated" or dry_run:
            continue
        reason = f"consolidation: an LLM read both sentences; cosine {p.cosine:.2f}"
        try:
            rule, new = await create(
                engine, "merge", p.long, p.short, reason=reason, by=BY,
                keys=(p.long_key, p.short_key),
            )  # fmt: skip
        except CurationError as exc:
            refused.append(f"{p.short!r} -> {p.long!r}: {exc.detail}")
            continue
        if new:
            made.append(rule.id)
    return Report(pairs, made, refused, dry_run)
