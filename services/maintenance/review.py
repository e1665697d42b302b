"""Review of entity links (the seed's weekly sample; issue 21, deliverable 4): draw merges and
candidate duplicate pairs with the evidence a person needs to judge them, and score a graph
against judged pairs.

A review item is two mentions, each named by its document and surface (so a verdict outlives
entity ids and rebuilds), of one of two kinds:

- ``merged``: an alias the resolver merged into an entity whose key differs from it, against
  the entity's own name: is the merge right?
- ``candidate``: two entities the graph keeps apart that a person would suspect are one
  (compatible type groups; trigram similarity >= 0.5, or one name a whole-word prefix or
  suffix of the other: looser than the resolver's own rule, bench/eval_resolution.py's):
  are they one?

Scoring keeps the kinds apart (they are drawn from different populations): of the candidates
judged the same, the share still apart (the duplicate rate); of the merges judged different,
the share still merged (the false-merge rate); with 95% Wilson intervals.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.core.curations import CurationError, create
from services.core.normalize import entity_key

KINDS = ("candidate", "merged")
VERDICTS = ("same", "different", "unsure")
CONTEXTS_PER_SIDE = 2
SENTENCE_CHARS = 400

# Within a tenant: the same name in two tenants is two entities by design (services/indexer/
# scope.py), nothing for a person to judge.
_CANDIDATES = text(
    "SELECT a.id, b.id FROM entities a JOIN entities b ON a.id < b.id"
    " AND a.tenant IS NOT DISTINCT FROM b.tenant"
    " WHERE (a.type_group = b.type_group OR 'ANY' IN (a.type_group, b.type_group))"
    "  AND (similarity(a.name, b.name) >= 0.5"
    "   OR b.key LIKE '% ' || a.key OR a.key LIKE '% ' || b.key"
    "   OR b.key LIKE a.key || ' %' OR a.key LIKE b.key || ' %')"
    " ORDER BY a.id, b.id"
)
_MERGED = text(
    "SELECT e.id, a.alias FROM aliases a JOIN entities e ON e.id = a.entity_id"
    " WHERE a.alias_key <> e.key ORDER BY e.id, a.alias"
)
_ENTITY = text("SELECT name, type FROM entities WHERE id = :e")
_NAME_COUNT = text("SELECT name, key, mention_count FROM entities WHERE id = :e")
# An entity's first mentions (with one surface, or any), their sentences and titles.
_CONTEXTS = text(
    "SELECT m.doc_id, m.surface, m.sentence, d.title FROM mentions m"
    " JOIN documents d ON d.doc_id = m.doc_id"
    " WHERE m.entity_id = :e AND (CAST(:surface AS text) IS NULL OR m.surface = :surface)"
    "  AND (CAST(:other_than AS text) IS NULL OR m.surface <> :other_than)"
    "  AND m.start_char >= 0 AND NOT d.deleted"
    " ORDER BY m.doc_id, m.start_char LIMIT :n"
)
# The entity a (document, surface) mention belongs to now.
_OWNER = text(
    "SELECT entity_id FROM mentions WHERE doc_id = :d AND surface = :s AND start_char >= 0"
    " ORDER BY start_char LIMIT 1"
)


async def side(
    conn: AsyncConnection, entity: int, surface: str | None, other_than: str | None = None
) -> dict[str, Any]:
    """One side of a review item: the entity's name and type, and its first mentions (by
    ``surface`` only, or by any surface but ``other_than``) with their sentences and titles."""
    found = (await conn.execute(_ENTITY, {"e": entity})).first()
    values = {"e": entity, "surface": surface, "other_than": other_than, "n": CONTEXTS_PER_SIDE}
    rows = (await conn.execute(_CONTEXTS, values)).all()
    contexts = [
        {"doc_id": d, "title": t, "surface": s, "sentence": x[:SENTENCE_CHARS]}
        for d, s, x, t in rows
    ]
    name, etype = (found[0], found[1]) if found else ("", "")
    return {"entity": name, "type": etype, "contexts": contexts}


async def sample(
    conn: AsyncConnection, *, candidates: int, merges: int, seed: int | None = None
) -> list[dict[str, Any]]:
    """Up to ``candidates`` candidate pairs and ``merges`` merges drawn uniformly (seeded),
    each side with its first two mentions (the entity's side of a merge: by another surface
    than the alias); an item with a side without mentions is skipped.

    The candidate pairs are found by comparing every pair of entities (no index serves the
    rule): seconds at the development corpora's ~20k entities, far too long at 100k and more
    (docs/curation.md, "Review")."""
    rng = random.Random(seed)  # noqa: S311 - a sample, not a secret
    items: list[dict[str, Any]] = []
    # merges only (candidates=0) never compares the pairs: that is what keeps it fast
    pairs = (await conn.execute(_CANDIDATES)).all() if candidates > 0 else []
    for a, b in rng.sample(pairs, min(candidates, len(pairs))):
        left, right = await side(conn, a, None), await side(conn, b, None)
        if left["contexts"] and right["contexts"]:
            items.append({"kind": "candidate", "a": left, "b": right})
    merged = (await conn.execute(_MERGED)).all()
    for entity, alias in rng.sample(merged, min(merges, len(merged))):
        # the entity's side: its first mentions by another surface than the alias
        own = await side(conn, entity, None, other_than=alias)
        aliased = await side(conn, entity, alias)
        if own["contexts"] and aliased["contexts"]:
            items.append({"kind": "merged", "a": own, "b": aliased})
    return items


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ((0, 1) without observations)."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def rate(hits: int, n: int) -> dict[str, Any]:
    """A share with its interval, for reports."""
    low, high = wilson(hits, n)
    return {
        "hits": hits,
        "of": n,
        "share": round(hits / n, 3) if n else None,
        "ci95": [round(low, 3), round(high, 3)],
    }


def check_item(item: Mapping[str, Any]) -> None:
    """ValueError naming what is wrong with a judged item."""
    if item.get("kind") not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    if item.get("label") not in VERDICTS:
        raise ValueError(f"label must be one of {', '.join(VERDICTS)}")
    for side in ("a", "b"):
        contexts = item.get(side, {}).get("contexts") if isinstance(item.get(side), dict) else None
        if (
            not isinstance(contexts, list)
            or not contexts
            or not all(isinstance(c, dict) and "doc_id" in c and "surface" in c for c in contexts)
        ):
            raise ValueError(f"{side}.contexts must list mentions with doc_id and surface")


async def _owner(conn: AsyncConnection, side: Mapping[str, Any]) -> int | None:
    for context in side["contexts"]:
        found = await conn.scalar(_OWNER, {"d": context["doc_id"], "s": context["surface"]})
        if found is not None:
            return int(found)
    return None


async def score(conn: AsyncConnection, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The graph as it is now against judged items (``unsure`` ones are left out); an item
    whose mentions are gone (its document deleted) counts as missing."""
    counts = {
        kind: {"same": 0, "same_apart": 0, "different": 0, "different_merged": 0, "missing": 0}
        for kind in KINDS
    }
    for item in items:
        check_item(item)
        if item["label"] == "unsure":
            continue
        tally = counts[item["kind"]]
        a, b = await _owner(conn, item["a"]), await _owner(conn, item["b"])
        if a is None or b is None:
            tally["missing"] += 1
        elif item["label"] == "same":
            tally["same"] += 1
            tally["same_apart"] += a != b
        else:
            tally["different"] += 1
            tally["different_merged"] += a == b
    pairs, merges = counts["candidate"], counts["merged"]
    decided = {kind: c["same"] + c["different"] for kind, c in counts.items()}
    wrong = sum(c["same_apart"] + c["different_merged"] for c in counts.values())
    return {
        "counts": counts,
        # The graph's decision (one entity or two) agrees with the verdict, over both kinds.
        "linking_accuracy": rate(sum(decided.values()) - wrong, sum(decided.values())),
        "duplicate_rate": rate(pairs["same_apart"], decided["candidate"]),
        "false_merge_rate": rate(merges["different_merged"], decided["merged"]),
        "merges_made_of_distinct_pairs": rate(pairs["different_merged"], decided["candidate"]),
        "true_merges_undone": rate(merges["same_apart"], decided["merged"]),
    }


@dataclass(frozen=True)
class Proposal:
    """The curation a verdict asks for, on the graph as it is now (``kind`` None: nothing
    to do, or nothing a rule by name can do; ``why`` says which)."""

    line: int
    kind: str | None
    name: str = ""
    other: str = ""
    why: str = ""
    keys: tuple[str, str] | None = None  # the two names' keys, from the graph


async def proposals(
    conn: AsyncConnection, items: Sequence[tuple[int, Mapping[str, Any]]]
) -> list[Proposal]:
    """For each judged (line, item): a pair judged the same that the graph keeps apart is a
    ``merge`` (into the better-evidenced entity); a pair judged different that the graph
    merged is a ``split`` of the other side's surface; a pair judged different and kept apart
    is a ``block`` (so no later merge joins them)."""
    out: list[Proposal] = []
    for line, item in items:
        check_item(item)
        if item["label"] == "unsure":
            out.append(Proposal(line, None, why="unsure"))
            continue
        a, b = await _owner(conn, item["a"]), await _owner(conn, item["b"])
        if a is None or b is None:
            out.append(Proposal(line, None, why="its mentions are gone"))
            continue
        same = item["label"] == "same"
        if same and a == b:
            out.append(Proposal(line, None, why="merged already"))
            continue
        (name_a, key_a, count_a) = await _named(conn, a)
        (name_b, key_b, count_b) = await _named(conn, b)
        if same:
            first = count_a >= count_b
            keep, into = (name_a, name_b) if first else (name_b, name_a)
            keys = (key_a, key_b) if first else (key_b, key_a)
            out.append(Proposal(line, "merge", keep, into, keys=keys))
        elif a != b:
            out.append(Proposal(line, "block", name_a, name_b, keys=(key_a, key_b)))
        else:
            surfaces = [c["surface"] for side in ("b", "a") for c in item[side]["contexts"]]
            alias = next((x for x in surfaces if entity_key(x) != key_a), None)
            if alias is None:
                out.append(Proposal(line, None, why="one name to resolution: no rule can split"))
            else:
                out.append(Proposal(line, "split", name_a, alias, keys=(key_a, entity_key(alias))))
    return out


async def _named(conn: AsyncConnection, entity: int) -> tuple[str, str, int]:
    row = (await conn.execute(_NAME_COUNT, {"e": entity})).one()
    return str(row.name), str(row.key), int(row.mention_count)


async def apply_verdicts(
    engine: AsyncEngine,
    judged: Sequence[tuple[int, Mapping[str, Any]]],
    *,
    by: str,
    source: str,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Judged (line, item)s turned into curations (``proposals``), made by ``by`` with the
    reason "review SOURCE:LINE" unless ``dry_run``, with the linking figures they measure:
    ``{"figures": score's report, "curations": [{line, kind, name, other, result}]}``.
    `kgstream review apply` and ``POST /v1/review/verdicts`` (the explorer) both use it."""
    async with engine.connect() as conn:
        report = await score(conn, [item for _, item in judged])
        found = await proposals(conn, judged)
    made: list[dict[str, Any]] = []
    for p in found:
        row: dict[str, Any] = {"line": p.line, "kind": p.kind, "name": p.name}
        row |= {"other": p.other, "result": p.why or "would make"}
        if p.kind is not None and not dry_run:
            try:
                rule, new = await create(
                    engine,
                    p.kind,
                    p.name,
                    p.other,
                    reason=f"review {source}:{p.line}",
                    by=by,
                    keys=p.keys,
                )
                row["result"] = f"made #{rule.id}" if new else f"in force already (#{rule.id})"
            except CurationError as exc:
                row["result"] = f"refused: {exc.detail}"
        made.append(row)
    return {"figures": report, "curations": made}
