"""Entity resolution: which stored entity a mention refers to.

Order of evidence (docs/architecture.md, "Indexing semantics"): the normalised key within compatible
types; inside one document, short forms of a longer name (surname, acronym); across documents,
trigram candidates confirmed by name-embedding similarity. The ambiguous band goes to an adjudicator
(an LLM) when one is configured, and otherwise stays unmerged: a duplicate is cheaper than a false
merge."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.core.db.engine import vector_literal
from services.core.errors import StaleComputeError
from services.core.extraction import ExtractedEntity, Extraction
from services.core.normalize import entity_key
from services.core.settings import Settings

WILDCARD = "ANY"
_GROUPS = {
    "PERSON": "PERSON",
    "ORG": "ORG",
    "NORP": "NORP",
    "GPE": "PLACE",
    "LOC": "PLACE",
    "FAC": "PLACE",
    "WORK_OF_ART": "WORK",
    "PRODUCT": "WORK",
    "LAW": "WORK",
    "EVENT": "EVENT",
    "LANGUAGE": "LANGUAGE",
}

# (new name, candidate name, type group) -> same entity?
Adjudicator = Callable[[str, str, str], Awaitable[bool]]
# (surface key, candidate entity id) -> the adjudicator's answer, asked before the transaction
Decisions = Mapping[tuple[str, int], bool]


def type_group(entity_type: str) -> str:
    """Coarse type family; untyped or generic types (MISC, TOPIC, CONCEPT) are wildcards."""
    return _GROUPS.get(entity_type.upper(), WILDCARD)


def compatible(a: str, b: str) -> bool:
    """Two type groups may name the same thing."""
    return a == b or WILDCARD in (a, b)


def local_canonical(entities: Sequence[ExtractedEntity]) -> dict[str, str]:
    """Within one document: surface key -> key of the longer name it abbreviates.

    "Nolan" -> "christopher nolan" when exactly one multi-word PERSON ends (or starts) with it;
    "Richard David Bach" -> "richard bach" when the document also says "Richard Bach";
    "IBM" -> "international business machines" when exactly one multi-word ORG has those initials.
    """
    people: dict[str, set[str]] = {}
    orgs: dict[str, set[str]] = {}
    for ent in entities:
        words = ent.name.split()
        if len(words) < 2:
            continue
        key = entity_key(ent.name)
        group = type_group(ent.type)
        if group == "PERSON":
            for part in (words[-1], words[0]):
                people.setdefault(entity_key(part), set()).add(key)
        elif group == "ORG":
            initials = "".join(w[0] for w in words if w[:1].isupper())
            if len(initials) >= 2:
                orgs.setdefault(initials.lower(), set()).add(key)
    out = _middle_name_forms(entities)
    for ent in entities:
        if len(ent.name.split()) != 1:
            continue
        key = entity_key(ent.name)
        group = type_group(ent.type)
        if group in ("PERSON", WILDCARD) and len(people.get(key, ())) == 1:
            out[key] = next(iter(people[key]))
        elif group in ("ORG", WILDCARD) and ent.name.isupper() and len(orgs.get(key, ())) == 1:
            out[key] = next(iter(orgs[key]))
    return out


def _middle_name_forms(entities: Sequence[ExtractedEntity]) -> dict[str, str]:
    """ "Richard David Bach" -> "richard bach" when the document also uses the short form."""
    two_word = {
        entity_key(e.name)
        for e in entities
        if len(e.name.split()) == 2 and type_group(e.type) in ("PERSON", WILDCARD)
    }
    out: dict[str, str] = {}
    for ent in entities:
        words = entity_key(ent.name).split()
        if type_group(ent.type) == "PERSON" and len(words) >= 3:
            short = f"{words[0]} {words[-1]}"
            if short in two_word:
                out[" ".join(words)] = short
    return out


@dataclass(frozen=True)
class Surface:
    """One entity as a document names it, after local canonicalisation."""

    key: str
    name: str
    group: str


def document_surfaces(
    entities: Sequence[ExtractedEntity], canonical: Mapping[str, str]
) -> dict[str, Surface]:
    """key -> Surface with the majority type group of its mentions in this document."""
    names: dict[str, str] = {}
    groups: dict[str, Counter[str]] = {}
    for ent in entities:
        own = entity_key(ent.name)
        key = canonical.get(own, own)
        if own == key and entity_key(names.get(key, "")) != key:
            names[key] = ent.name  # the full name names the entity, not a short form seen first
        names.setdefault(key, ent.name)
        groups.setdefault(key, Counter())[type_group(ent.type)] += 1
    out = {}
    for key, counts in groups.items():
        typed = [(n, g) for g, n in counts.items() if g != WILDCARD]
        group = max(typed)[1] if typed else WILDCARD
        out[key] = Surface(key, names[key], group)
    return out


@dataclass(frozen=True)
class ResolverConfig:
    """Thresholds from settings, plus the optional adjudicator."""

    trigram_threshold: float
    embedding_threshold: float
    ambiguous_floor: float
    adjudicate: Adjudicator | None = None

    @classmethod
    def from_settings(cls, settings: Settings, adjudicate: Adjudicator | None = None) -> Self:
        """Thresholds as configured."""
        return cls(
            trigram_threshold=settings.resolution_trigram_threshold,
            embedding_threshold=settings.resolution_embedding_threshold,
            ambiguous_floor=settings.resolution_ambiguous_floor,
            adjudicate=adjudicate,
        )


@dataclass(frozen=True)
class Resolution:
    """What entity resolution needs besides the database: the document's short-form map,
    embeddings of names not stored yet, the thresholds, and the adjudicator's answers for the
    ambiguous candidates seen when the event was computed (no outside call happens inside the
    write transaction)."""

    canonical: Mapping[str, str]
    name_embeddings: Mapping[str, Sequence[float]]
    config: ResolverConfig
    decisions: Decisions = field(default_factory=dict)


_EXISTING = text(
    "SELECT q.key, e.id, e.type_group, e.mention_count"
    " FROM unnest(CAST(:keys AS text[])) AS q(key) CROSS JOIN LATERAL ("
    "  SELECT e.id, e.type_group, e.mention_count FROM entities e WHERE e.key = q.key"
    "  UNION SELECT e.id, e.type_group, e.mention_count FROM aliases a"
    "  JOIN entities e ON e.id = a.entity_id WHERE a.alias_key = q.key) e"
)
_SIMILAR = text(
    "SELECT q.key, e.id, e.name, e.type_group, similarity(e.name, q.name) AS sim,"
    " 1 - (e.embedding <=> CAST(q.vec AS vector)) AS cos"
    " FROM unnest(CAST(:keys AS text[]), CAST(:names AS text[]), CAST(:vecs AS text[]))"
    "  AS q(key, name, vec)"
    " CROSS JOIN LATERAL (SELECT id, name, type_group, embedding FROM entities"
    "  WHERE name % q.name AND embedding IS NOT NULL"
    "  ORDER BY similarity(name, q.name) DESC, id LIMIT 5) e"
    " ORDER BY q.key, sim DESC, e.id"
)
_INSERT = text(
    "INSERT INTO entities (key, name, type, type_group, embedding)"
    " SELECT k, n, g, g, CAST(v AS vector) FROM unnest(CAST(:keys AS text[]),"
    "  CAST(:names AS text[]), CAST(:groups AS text[]), CAST(:vecs AS text[])) AS u(k, n, g, v)"
    " ORDER BY k, g"
    " ON CONFLICT (key, type_group) DO UPDATE SET updated_at = now()"
    " RETURNING id, key, (xmax = 0) AS inserted"
)
# Held from entity creation to commit (transaction-scoped), one per name key: writers creating
# or retyping an entity of the same key (or a short form of it) go one at a time, so the second
# sees the first's entity and merges into it; writers creating different names do not wait for
# each other. Two-key advisory locks in their own namespace (the communities' RECOMPUTE_LOCK_KEY
# is a one-key lock); taken in hash order, so two writers never wait for each other's.
ENTITY_KEY_LOCK_SPACE = 0x6B67  # "kg"
_KEY_LOCKS = text(
    "SELECT pg_advisory_xact_lock(:space, h) FROM unnest(CAST(:hashes AS int[]))"
    " WITH ORDINALITY AS u(h, i) ORDER BY i"
)
# A wildcard entity (say, a title) that meets a typed mention takes the type, unless an entity
# of that key and type exists already. Decided during resolution (the rest of it sees the new
# type), written by graph_writer.rebuild under its ordered row locks: an early update would
# hold the row from here to commit, out of order.
_NARROWABLE = text(
    "SELECT u.i, u.g FROM unnest(CAST(:ids AS bigint[]), CAST(:groups AS text[])) AS u(i, g)"
    " JOIN entities e ON e.id = u.i WHERE NOT EXISTS"
    " (SELECT 1 FROM entities o WHERE o.key = e.key AND o.type_group = u.g)"
)
_HOLD = text("SELECT id FROM entities WHERE id = ANY(:ids) ORDER BY id FOR KEY SHARE")
_NARROW = text(
    "UPDATE entities e SET type_group = u.g FROM unnest(CAST(:ids AS bigint[]),"
    " CAST(:groups AS text[])) AS u(i, g) WHERE e.id = u.i AND NOT EXISTS"
    " (SELECT 1 FROM entities o WHERE o.key = e.key AND o.type_group = u.g)"
)


@dataclass
class Resolved:
    """Entity id per surface key, which of them this call created, and the wildcard entities
    to retype (id -> type group; ``retype_entities`` writes them)."""

    ids: dict[str, int]
    added: set[int]
    retype: dict[int, str] = field(default_factory=dict)


async def resolve_entities(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    resolution: Resolution,
) -> Resolved:
    """Map every surface to a stored entity, creating the ones nothing matches. Set-based: a
    handful of statements per document whatever its size."""
    out = Resolved({}, set())
    keys = sorted(surfaces)
    if not keys:
        return out
    narrow = await _exact(conn, surfaces, keys, out)
    unresolved = [k for k in keys if k not in out.ids]
    if unresolved or narrow:
        # About to create or retype entities: one writer per name from here to commit, so a
        # name another indexer is creating (uncommitted, invisible) is merged into, not
        # duplicated. Look again: a holder that committed meanwhile may have created it.
        retyping = [k for k in keys if out.ids.get(k) in narrow]
        await lock_names(conn, creation_keys(unresolved + retyping, resolution.canonical))
        narrow |= await _exact(conn, surfaces, unresolved, out)
    if narrow:
        ids = sorted(narrow)
        rows = await conn.execute(_NARROWABLE, {"ids": ids, "groups": [narrow[i] for i in ids]})
        out.retype = {int(r.i): str(r.g) for r in rows.all()}
    unresolved = [k for k in keys if k not in out.ids]
    out.ids.update(await _similar(conn, surfaces, unresolved, resolution, out.retype))
    await _hold(conn, set(out.ids.values()))
    new = [k for k in unresolved if k not in out.ids]
    if new:
        vecs = [resolution.name_embeddings.get(k) for k in new]
        inserted = await conn.execute(
            _INSERT,
            {
                "keys": new,
                "names": [surfaces[k].name for k in new],
                "groups": [surfaces[k].group for k in new],
                "vecs": [vector_literal(v) if v is not None else None for v in vecs],
            },
        )
        for r in inserted.all():
            out.ids[r.key] = int(r.id)
            if r.inserted:
                out.added.add(int(r.id))
    return out


def creation_keys(keys: Sequence[str], canonical: Mapping[str, str]) -> list[str]:
    """The name keys a writer locks to create or retype the entities of ``keys``: those keys
    and the document's short forms of them (they become aliases another writer resolves by)."""
    wanted = set(keys)
    wanted |= {own for own, key in canonical.items() if key in wanted}
    return sorted(wanted)


def key_hash(key: str) -> int:
    """A stable signed 32-bit hash of a name key (the advisory lock's second key)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), signed=True)


async def lock_names(conn: AsyncConnection, keys: Sequence[str]) -> None:
    """Take the creation locks of ``keys`` until commit, in hash order."""
    if keys:
        hashes = sorted({key_hash(k) for k in keys})
        await conn.execute(_KEY_LOCKS, {"space": ENTITY_KEY_LOCK_SPACE, "hashes": hashes})


async def _hold(conn: AsyncConnection, entity_ids: set[int]) -> None:
    """Key-share lock the entities this document resolved to, so none is deleted before its
    mentions are in (a writer that removed an entity's last mention skips locked ones); one
    deleted since it was read means the plan is stale: StaleComputeError, and it recomputes."""
    if not entity_ids:
        return
    ids = sorted(entity_ids)
    held = await conn.execute(_HOLD, {"ids": ids})
    gone = set(ids) - {int(r[0]) for r in held.all()}
    if gone:
        raise StaleComputeError(f"entities {sorted(gone)} were deleted since they were resolved")


async def _exact(
    conn: AsyncConnection, surfaces: Mapping[str, Surface], keys: Sequence[str], out: Resolved
) -> dict[int, str]:
    """Resolve ``keys`` by key or alias into ``out``; return the wildcard entities a typed
    mention narrows (id -> type group)."""
    narrow: dict[int, str] = {}
    if not keys:
        return narrow
    by_key: dict[str, list[Any]] = {}
    for r in (await conn.execute(_EXISTING, {"keys": list(keys)})).all():
        by_key.setdefault(r.key, []).append(r)
    for key in keys:
        surface = surfaces[key]
        fits = [r for r in by_key.get(key, []) if compatible(r.type_group, surface.group)]
        if fits:
            # Same group over a wildcard, then the better-evidenced entity, then the oldest.
            best = min(fits, key=lambda r: (r.type_group != surface.group, -r.mention_count, r.id))
            out.ids[key] = int(best.id)
            if best.type_group == WILDCARD and surface.group != WILDCARD:
                narrow[int(best.id)] = surface.group
    return narrow


async def retype_entities(conn: AsyncConnection, retype: Mapping[int, str]) -> None:
    """Write the type groups resolution decided (the caller holds the rows' locks)."""
    if retype:
        ids = sorted(retype)
        await conn.execute(_NARROW, {"ids": ids, "groups": [retype[i] for i in ids]})


async def _similar(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    keys: Sequence[str],
    resolution: Resolution,
    retyped: Mapping[int, str],
) -> dict[str, int]:
    """Trigram candidates confirmed by name-embedding similarity; None-safe, order-stable.
    Ambiguous candidates take the adjudicator's answer given before the transaction; one it
    was not asked about means the graph moved since: TransientError, and the event recomputes."""
    found: dict[str, int] = {}
    decisions = resolution.decisions
    for key, entity_id, _, verdict in await similar_candidates(
        conn, surfaces, keys, resolution.name_embeddings, resolution.config, retyped=retyped
    ):
        if key in found:
            continue
        if verdict == "ask":
            if (key, entity_id) not in decisions:
                raise StaleComputeError(f"new merge candidate for {key!r} since compute")
            if not decisions[(key, entity_id)]:
                continue
        found[key] = entity_id
    return found


Verdict = Literal["merge", "ask"]


async def similar_candidates(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    keys: Sequence[str],
    name_embeddings: Mapping[str, Sequence[float]],
    config: ResolverConfig,
    *,
    retyped: Mapping[int, str] | None = None,
) -> list[tuple[str, int, str, Verdict]]:
    """(surface key, entity id, entity name, merge | ask) for every candidate worth merging,
    best first per key; "ask" only when an adjudicator is configured (else the ambiguous band
    stays apart). ``retyped``: type groups this transaction gives entities but has not written
    yet."""
    retyped = retyped or {}
    asks = [k for k in keys if k in name_embeddings and len(k) >= 4]
    if not asks:
        return []
    rows = await conn.execute(
        _SIMILAR,
        {
            "keys": asks,
            "names": [surfaces[k].name for k in asks],
            "vecs": [vector_literal(name_embeddings[k]) for k in asks],
        },
    )
    out: list[tuple[str, int, str, Verdict]] = []
    for r in rows.all():
        surface = surfaces[r.key]
        group = retyped.get(int(r.id), r.type_group)
        if not compatible(group, surface.group):
            continue
        if r.sim < config.trigram_threshold and not same_person(surface, r.name, group):
            continue
        if r.cos >= config.embedding_threshold or (
            r.cos >= config.ambiguous_floor and same_person(surface, r.name, group)
        ):
            out.append((r.key, int(r.id), str(r.name), "merge"))
        elif r.cos >= config.ambiguous_floor and config.adjudicate is not None:
            out.append((r.key, int(r.id), str(r.name), "ask"))
    return out


async def adjudicate_candidates(
    conn: AsyncConnection,
    surfaces: Mapping[str, Surface],
    name_embeddings: Mapping[str, Sequence[float]],
    config: ResolverConfig,
) -> dict[tuple[str, int], bool]:
    """Ask the adjudicator about every ambiguous candidate the transaction will meet (read-only
    ``conn``, no transaction held while the model answers)."""
    if config.adjudicate is None:
        return {}
    candidates = await similar_candidates(conn, surfaces, sorted(surfaces), name_embeddings, config)
    await conn.rollback()  # end the read before the slow calls
    decisions: dict[tuple[str, int], bool] = {}
    for key, entity_id, name, verdict in candidates:
        if verdict == "ask" and (key, entity_id) not in decisions:
            surface = surfaces[key]
            decisions[(key, entity_id)] = await config.adjudicate(surface.name, name, surface.group)
    return decisions


def same_person(surface: Surface, other_name: str, other_group: str) -> bool:
    """ "Helen Elizabeth Hunt" and "Helen Hunt": same first and last name, one has middle names."""
    if surface.group != "PERSON" or other_group != "PERSON":
        return False
    a, b = surface.key.split(), entity_key(other_name).split()
    return min(len(a), len(b)) >= 2 and a[0] == b[0] and a[-1] == b[-1] and a != b


_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")


def with_title(title: str, extraction: Extraction) -> Extraction:
    """Every chunk is about its document's title: the prototype's passage-title node."""
    if not title.strip():
        return extraction
    # Wikipedia-style disambiguation ("Twins (group)") is not part of the name.
    name = _DISAMBIGUATION.sub("", title).strip() or title.strip()
    subject = ExtractedEntity(name=name, type="TOPIC", start=-1, end=-1, sentence=title)
    return Extraction(entities=[*extraction.entities, subject], relations=extraction.relations)
