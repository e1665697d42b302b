"""The publisher's facts (document event v2, services/core/facts.py) as the write plan takes
them: mentions and relations in the extractor's own form, so they resolve, count and rebuild
exactly as extracted ones do. Pure.

A provided fact is anchored to the document's first chunk (mentions and evidence reference a
chunk) with no span: its name and each alias is one mention at its own negative position
(-2, -3, ...; a title's mention is at -1), so none has offsets into the text and none collides
with another. Its rows carry the origin ``publisher`` (mentions.origin, relationship_evidence.
origin). They live and die with the first chunk, whose hash includes the facts (services/
indexer/compute.py ``hash_salt``): new facts make a new first chunk, and a delete removes them
with the document's chunks."""

from __future__ import annotations

from collections.abc import Mapping

from services.core.contracts import DocumentEvent
from services.core.extraction import ExtractedEntity, ExtractedRelation
from services.core.normalize import entity_key

EXTRACTED = "extracted"
PUBLISHER = "publisher"
FIRST_POSITION = -2  # the title's mention is at -1 (resolution.with_title)


def provided_mentions(event: DocumentEvent) -> list[ExtractedEntity]:
    """One mention per provided name and alias, typed as its entity, described by its
    entity's description."""
    out: list[ExtractedEntity] = []
    for ent in event.entities:
        for name in ent.names():
            at = FIRST_POSITION - len(out)
            out.append(ExtractedEntity(name, ent.type, at, at, ent.description))
    return out


def provided_aliases(event: DocumentEvent, canonical: Mapping[str, str]) -> dict[str, str]:
    """The document's short forms (``canonical``: own key -> key of the longer name) with the
    publisher's aliases: each alias key -> where its entity's name resolves. The publisher's
    word wins over the extractor's guesses."""
    out = dict(canonical)
    for ent in event.entities:
        own = entity_key(ent.name)
        target = canonical.get(own, own)
        for alias in ent.aliases:
            key = entity_key(alias)
            if key != target:
                out[key] = target
    return out


def provided_relations(event: DocumentEvent) -> list[ExtractedRelation]:
    """The provided relationships, each end given as its entity's name (a relationship may name
    an entity by an alias), described by the publisher or, without a description, by the fact
    itself ("Jane Roe works at Acme Corp")."""
    name_of = {entity_key(n): ent.name for ent in event.entities for n in ent.names()}
    out = []
    for r in event.relationships:
        source, target = name_of[entity_key(r.source)], name_of[entity_key(r.target)]
        # The evidence sentence: the publisher's description, else the fact in words (an
        # empty sentence would be cited, and ranked, as evidence saying nothing).
        said = r.description or f"{source} {r.type.lower().replace('_', ' ')} {target}"
        out.append(ExtractedRelation(source, target, r.type, r.weight, said))
    return out
