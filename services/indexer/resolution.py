"""Entity resolution's rules: which stored entity a mention refers to. Pure: the statements
that read and write entities are services/indexer/candidates.py (trigram candidates, read
before and inside the transaction) and services/indexer/graph_store/entities.py (inside it).

Order of evidence (docs/architecture.md, "Indexing semantics"): the normalised key within compatible
types; inside one document, short forms of a longer name (surname, acronym); across documents,
trigram candidates confirmed by name-embedding similarity. The ambiguous band goes to an adjudicator
(an LLM) when one is configured, and otherwise stays unmerged: a duplicate is cheaper than a false
merge."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Literal, Self

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
    # A curation's redirect sent a surface here: it joins the key's entity whatever its type.
    forced: bool = False


def document_surfaces(
    entities: Sequence[ExtractedEntity],
    canonical: Mapping[str, str],
    forced: Set[str] = frozenset(),
) -> dict[str, Surface]:
    """key -> Surface with the majority type group of its mentions in this document;
    ``forced``: the keys a curation's redirect sent surfaces to."""
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
        out[key] = Surface(key, names[key], group, key in forced)
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


def creation_keys(keys: Sequence[str], canonical: Mapping[str, str]) -> list[str]:
    """The name keys a writer locks to create or retype the entities of ``keys``: those keys
    and the document's short forms of them (they become aliases another writer resolves by)."""
    wanted = set(keys)
    wanted |= {own for own, key in canonical.items() if key in wanted}
    return sorted(wanted)


@dataclass(frozen=True)
class ExactMatch:
    """An entity stored under a key (or an alias of it)."""

    id: int
    type_group: str
    mention_count: int


def best_exact(surface: Surface, found: Sequence[ExactMatch]) -> ExactMatch | None:
    """Of the entities stored under a surface's key or alias, the one it resolves to: a
    compatible type group (any group when a curation sent the surface there), the same group
    over a wildcard, then the better-evidenced entity, then the oldest."""
    fits = [m for m in found if surface.forced or compatible(m.type_group, surface.group)]
    if not fits:
        return None
    return min(fits, key=lambda m: (m.type_group != surface.group, -m.mention_count, m.id))


Verdict = Literal["merge", "ask"]


def candidate_verdict(
    surface: Surface, name: str, group: str, *, sim: float, cos: float, config: ResolverConfig
) -> Verdict | None:
    """Is a trigram candidate (its name, type group, trigram similarity and name-embedding
    cosine) the surface's entity? "merge", "ask" the adjudicator (only when one is configured:
    else the ambiguous band stays apart), or None."""
    if not compatible(group, surface.group):
        return None
    if sim < config.trigram_threshold and not same_person(surface, name, group):
        return None
    if cos >= config.embedding_threshold or (
        cos >= config.ambiguous_floor and same_person(surface, name, group)
    ):
        return "merge"
    if cos >= config.ambiguous_floor and config.adjudicate is not None:
        return "ask"
    return None


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
    return replace(extraction, entities=[*extraction.entities, subject])
