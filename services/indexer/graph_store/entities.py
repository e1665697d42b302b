"""Entity resolution inside the event's transaction: the plan's surfaces to entity ids, by key
or alias, then trigram candidates, creating the entities nothing matches. Set-based: a handful
of statements per document whatever its size. Locks follow graph_store/locks.py (rules 2, 3).

Per tenant: every statement here reads and writes the entities of the document's scope only
(services/indexer/scope.py), so no tenant's entities, aliases, counts or types change how
another tenant's documents resolve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.indexer.candidates import merges, similar_candidates
from services.indexer.graph_store.locks import hold_entities, lock_names
from services.indexer.resolution import WILDCARD, ExactMatch, best_exact, creation_keys
from services.indexer.scope import in_scope
from services.indexer.write_plan import WritePlan

_BY_KEY = (
    "SELECT q.key, e.id, e.key AS entity_key, e.type_group, e.mention_count"  # noqa: S608 - constants
    " FROM unnest(CAST(:keys AS text[])) AS q(key) CROSS JOIN LATERAL ("
    "  SELECT e.id, e.key, e.type_group, e.mention_count FROM entities e WHERE e.key = q.key"
    "  AND " + in_scope("e") + "{settled_entity}"
    "  UNION SELECT e.id, e.key, e.type_group, e.mention_count FROM aliases a"
    "  JOIN entities e ON e.id = a.entity_id WHERE a.alias_key = q.key"
    "  AND " + in_scope("e") + "{settled_alias}) e"
)
_EXISTING = text(_BY_KEY.format(settled_entity="", settled_alias=""))
# While curations are applied: an entity or alias of a name the rules are about counts only
# while a document the apply is not still to do names it (services/indexer/curation_apply.py).
_SUPPORTED = (
    " EXISTS (SELECT 1 FROM mentions m WHERE m.entity_id = e.id{surface} AND NOT EXISTS"
    " (SELECT 1 FROM curation_work w WHERE w.doc_id = m.doc_id AND w.state <> 'done'))"
)
_EXISTING_SETTLED = text(
    _BY_KEY.format(
        settled_entity=" AND (e.key <> ALL(CAST(:ruled AS text[])) OR"
        + _SUPPORTED.format(surface="")
        + ")",
        settled_alias=" AND (a.alias_key <> ALL(CAST(:ruled AS text[])) OR"
        + _SUPPORTED.format(surface=" AND m.surface = a.alias")
        + ")",
    )
)
_INSERT = text(
    "INSERT INTO entities (key, name, type, type_group, embedding, tenant)"
    " SELECT k, n, g, g, CAST(v AS vector), CAST(:tenant AS text) FROM unnest("
    "  CAST(:keys AS text[]), CAST(:names AS text[]), CAST(:groups AS text[]),"
    "  CAST(:vecs AS text[])) AS u(k, n, g, v)"
    " ORDER BY k, g"
    " ON CONFLICT (key, type_group, tenant) DO UPDATE SET updated_at = now()"
    " RETURNING id, key, (xmax = 0) AS inserted"
)
# A wildcard entity (say, a title) that meets a typed mention takes the type, unless an entity
# of that key and type exists already in its scope (the document's). Decided during resolution
# (the rest of it sees the new type), written by rebuild under the update locks (locks.py,
# rule 4): an early update would hold the row from here to commit, out of order.
_TAKEN = (
    " (SELECT 1 FROM entities o WHERE o.key = e.key AND o.type_group = u.g"
    " AND o.tenant IS NOT DISTINCT FROM e.tenant)"
)
_NARROWABLE = text(
    "SELECT u.i, u.g FROM unnest(CAST(:ids AS bigint[]), CAST(:groups AS text[])) AS u(i, g)"  # noqa: S608 - constants
    " JOIN entities e ON e.id = u.i WHERE NOT EXISTS" + _TAKEN
)
_NARROW = text(
    "UPDATE entities e SET type_group = u.g FROM unnest(CAST(:ids AS bigint[]),"  # noqa: S608 - constants
    " CAST(:groups AS text[])) AS u(i, g) WHERE e.id = u.i AND NOT EXISTS" + _TAKEN
)


@dataclass
class Resolved:
    """Entity id per surface key, which of them this call created, and the wildcard entities
    to retype (id -> type group; ``retype_entities`` writes them)."""

    ids: dict[str, int]
    added: set[int]
    retype: dict[int, str] = field(default_factory=dict)


async def resolve_entities(conn: AsyncConnection, plan: WritePlan) -> Resolved:
    """Map every surface of the plan to a stored entity, creating the ones nothing matches."""
    out = Resolved({}, set())
    keys = sorted(plan.surfaces)
    if not keys:
        return out
    narrow = await _exact(conn, plan, keys, out)
    unresolved = [k for k in keys if k not in out.ids]
    if unresolved or narrow:
        # About to create or retype entities: one writer per name from here to commit, so a
        # name another indexer is creating (uncommitted, invisible) is merged into, not
        # duplicated. Look again: a holder that committed meanwhile may have created it.
        retyping = [k for k in keys if out.ids.get(k) in narrow]
        names = creation_keys(unresolved + retyping, plan.canonical)
        await lock_names(conn, plan.event.tenant, names)
        narrow |= await _exact(conn, plan, unresolved, out)
    if narrow:
        ids = sorted(narrow)
        rows = await conn.execute(_NARROWABLE, {"ids": ids, "groups": [narrow[i] for i in ids]})
        out.retype = {int(r.i): str(r.g) for r in rows.all()}
    unresolved = [k for k in keys if k not in out.ids]
    out.ids.update(await _similar(conn, plan, unresolved, out.retype))
    await hold_entities(conn, out.ids.values())
    new = [k for k in unresolved if k not in out.ids]
    if new:
        inserted = await conn.execute(
            _INSERT,
            {
                "keys": new,
                "names": [plan.surfaces[k].name for k in new],
                "groups": [plan.surfaces[k].group for k in new],
                "vecs": [plan.name_vectors.get(k) for k in new],
                "tenant": plan.event.tenant,
            },
        )
        for r in inserted.all():
            out.ids[r.key] = int(r.id)
            if r.inserted:
                out.added.add(int(r.id))
    return out


async def retype_entities(conn: AsyncConnection, retype: Mapping[int, str]) -> None:
    """Write the type groups resolution decided (the caller holds the rows' update locks)."""
    if retype:
        ids = sorted(retype)
        await conn.execute(_NARROW, {"ids": ids, "groups": [retype[i] for i in ids]})


async def _exact(
    conn: AsyncConnection, plan: WritePlan, keys: Sequence[str], out: Resolved
) -> dict[int, str]:
    """Resolve ``keys`` by key or alias into ``out``; return the wildcard entities a typed
    mention narrows (id -> type group)."""
    narrow: dict[int, str] = {}
    if not keys:
        return narrow
    by_key: dict[str, list[ExactMatch]] = {}
    scope = {"keys": list(keys), "tenant": plan.event.tenant}
    if plan.ruled_keys:
        found = await conn.execute(_EXISTING_SETTLED, scope | {"ruled": sorted(plan.ruled_keys)})
    else:
        found = await conn.execute(_EXISTING, scope)
    for r in found.all():
        if plan.rules.apart(r.key, r.entity_key):
            continue  # a curation keeps this name from that entity
        by_key.setdefault(r.key, []).append(
            ExactMatch(int(r.id), str(r.type_group), int(r.mention_count))
        )
    for key in keys:
        surface = plan.surfaces[key]
        best = best_exact(surface, by_key.get(key, []))
        if best is not None:
            out.ids[key] = best.id
            if best.type_group == WILDCARD and surface.group != WILDCARD:
                narrow[best.id] = surface.group
    return narrow


async def _similar(
    conn: AsyncConnection, plan: WritePlan, keys: Sequence[str], retyped: Mapping[int, str]
) -> dict[str, int]:
    """Trigram candidates as the graph is now (other writers may have created some since the
    compute phase looked). Ambiguous ones take the adjudicator's answer given before the
    transaction; one it was not asked about means the graph moved: StaleComputeError, and the
    event is computed again."""
    candidates = await similar_candidates(
        conn,
        plan.surfaces,
        keys,
        plan.name_vectors,
        plan.resolver,
        tenant=plan.event.tenant,
        retyped=retyped,
        rules=plan.rules,
    )
    return merges(candidates, plan.decisions)
