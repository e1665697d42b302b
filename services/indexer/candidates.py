"""Merge candidates across documents: stored entities whose names are trigram-similar to a
surface, judged by services/indexer/resolution.py's ``candidate_verdict``. Read-only; run by the
compute phase (to ask the adjudicator before any transaction) and inside the event's
transaction (services/indexer/graph_store/entities.py), which must see the graph as it is at
commit time: other writers may have created a candidate since the compute phase looked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.curation_rules import NO_RULES, CurationRules
from services.core.errors import StaleComputeError
from services.indexer.resolution import (
    Decisions,
    ResolverConfig,
    Surface,
    Verdict,
    candidate_verdict,
)
from services.indexer.scope import in_scope

# In the document's scope (services/indexer/scope.py): another tenant's names are no candidates.
_SIMILAR = text(
    "SELECT q.key, e.id, e.key AS entity_key, e.name, e.type_group,"  # noqa: S608 - constants
    " similarity(e.name, q.name) AS sim,"
    " 1 - (e.embedding <=> CAST(q.vec AS vector)) AS cos"
    " FROM unnest(CAST(:keys AS text[]), CAST(:names AS text[]), CAST(:vecs AS text[]))"
    "  AS q(key, name, vec)"
    " CROSS JOIN LATERAL (SELECT id, key, name, type_group, embedding FROM entities c"
    "  WHERE name % q.name AND embedding IS NOT NULL AND "
    + in_scope("c")
    + "  ORDER BY similarity(name, q.name) DESC, id LIMIT 5) e"
    " ORDER BY q.key, sim DESC, e.id"
)
# Keys shorter than this are not searched by trigram: too few trigrams to tell names apart.
MIN_SEARCH_KEY = 4


@dataclass(frozen=True)
class Candidate:
    """A stored entity a surface may be (best first per key)."""

    key: str
    entity_id: int
    name: str
    verdict: Verdict


async def similar_candidates(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    keys: Sequence[str],
    name_vectors: Mapping[str, str],
    config: ResolverConfig,
    *,
    tenant: str | None,
    retyped: Mapping[int, str] | None = None,
    rules: CurationRules = NO_RULES,
) -> list[Candidate]:
    """Every candidate worth merging or asking about for ``keys`` (those with a name
    embedding in ``name_vectors``, as pgvector text), best first per key, among the entities
    of ``tenant``'s scope. ``retyped``: type groups the caller's transaction gives entities but
    has not written yet; ``rules``: the curations, whose blocks leave candidates out."""
    retyped = retyped or {}
    asks = [k for k in keys if k in name_vectors and len(k) >= MIN_SEARCH_KEY]
    if not asks:
        return []
    rows = await conn.execute(
        _SIMILAR,
        {
            "keys": asks,
            "names": [surfaces[k].name for k in asks],
            "vecs": [name_vectors[k] for k in asks],
            "tenant": tenant,
        },
    )
    out: list[Candidate] = []
    for r in rows.all():
        if rules.apart(str(r.key), str(r.entity_key)):
            continue
        group = retyped.get(int(r.id), r.type_group)
        verdict = candidate_verdict(
            surfaces[r.key], str(r.name), group, sim=r.sim, cos=r.cos, config=config
        )
        if verdict is not None:
            out.append(Candidate(str(r.key), int(r.id), str(r.name), verdict))
    return out


def merges(candidates: Sequence[Candidate], decisions: Decisions) -> dict[str, int]:
    """Surface key -> the entity it merges into: the first candidate that is a "merge" or that
    the adjudicator accepted. StaleComputeError when an "ask" candidate has no answer in
    ``decisions``: it appeared after the adjudicator was asked, and the event recomputes."""
    found: dict[str, int] = {}
    for c in candidates:
        if c.key in found:
            continue
        if c.verdict == "ask":
            answer = decisions.get((c.key, c.entity_id))
            if answer is None:
                raise StaleComputeError(f"new merge candidate for {c.key!r} since compute")
            if not answer:
                continue
        found[c.key] = c.entity_id
    return found


async def adjudicate_candidates(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    name_vectors: Mapping[str, str],
    config: ResolverConfig,
    rules: CurationRules = NO_RULES,
    *,
    tenant: str | None,
) -> dict[tuple[str, int], bool]:
    """Ask the adjudicator about every ambiguous candidate the transaction will meet (read-only
    ``conn``, no transaction held while the model answers), in ``tenant``'s scope."""
    if config.adjudicate is None:
        return {}
    candidates = await similar_candidates(
        conn, surfaces, sorted(surfaces), name_vectors, config, tenant=tenant, rules=rules
    )
    await conn.rollback()  # end the read before the slow calls
    decisions: dict[tuple[str, int], bool] = {}
    for c in candidates:
        if c.verdict == "ask" and (c.key, c.entity_id) not in decisions:
            surface = surfaces[c.key]
            decisions[(c.key, c.entity_id)] = await config.adjudicate(
                surface.name, c.name, surface.group
            )
    return decisions
