"""Facts the publisher already knows (document event v2: ``entities``, ``relationships``,
``extraction``): their typed form, the rules JSON Schema cannot state, and the one stored form
that the documents row keeps (``documents.facts``) so that every re-resolution, replay and
rebuild writes them again exactly (docs/ingest.md, "Facts the publisher already knows").

Rules checked here, after the schema: every name has a letter or digit, no two entities of an
event share a key (by name or alias), a relationship's ends each name an entity of the event (by
name or alias, normalised) and not the same one, and a delete carries no facts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from services.core.normalize import entity_key

Extraction = Literal["auto", "provided"]
RELATED_TO = "RELATED_TO"
FIELDS = ("extraction", "entities", "relationships")


class ProvidedEntity(BaseModel):
    """An entity the publisher says the document names."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: str
    aliases: tuple[str, ...] = ()
    description: str = ""

    def names(self) -> tuple[str, ...]:
        """Its name, then its aliases."""
        return (self.name, *self.aliases)


class ProvidedRelationship(BaseModel):
    """A relationship the publisher states between two of its entities (by name or alias)."""

    model_config = ConfigDict(frozen=True)

    source: str
    target: str
    type: str = RELATED_TO
    description: str = ""
    weight: float = 1.0


def fact_problems(obj: Mapping[str, Any]) -> list[str]:
    """What the schema cannot say about a schema-valid event's facts, as '<json path>:
    <message>' (see the module docstring); empty when they hold."""
    if obj.get("type") == "delete":
        return [f"$.{f}: a delete carries no facts" for f in FIELDS if f in obj]
    problems: list[str] = []
    has_facts = bool(obj.get("entities") or obj.get("relationships"))
    if has_facts and not (str(obj.get("title", "")).strip() or str(obj.get("text", "")).strip()):
        # Facts ride on the first chunk (services/indexer/provided.py): refused here, where
        # HTTP ingest answers 422, not later as a dead letter.
        problems.append("$.entities: a document with neither title nor text carries no facts")
    owner: dict[str, int] = {}  # key of a name or alias -> index of its entity
    for i, ent in enumerate(obj.get("entities", ())):
        for j, name in enumerate((ent["name"], *ent.get("aliases", ()))):
            path = f"$.entities[{i}].name" if j == 0 else f"$.entities[{i}].aliases[{j - 1}]"
            key = entity_key(name)
            if not any(ch.isalnum() for ch in name):
                problems.append(f"{path}: {name!r} has no letter or digit")
            elif owner.setdefault(key, i) != i:
                problems.append(f"{path}: {name!r} also names $.entities[{owner[key]}]")
    for i, rel in enumerate(obj.get("relationships", ())):
        ends = []
        for end in ("source", "target"):
            found = owner.get(entity_key(rel[end]))
            if found is None:
                problems.append(
                    f"$.relationships[{i}].{end}: {rel[end]!r} names no entity of"
                    " this event (an entity's name or alias)"
                )
            ends.append(found)
        if ends[0] is not None and ends[0] == ends[1]:
            problems.append(f"$.relationships[{i}]: source and target name the same entity")
    return problems


def stored_form(
    extraction: Extraction,
    entities: Sequence[ProvidedEntity],
    relationships: Sequence[ProvidedRelationship],
) -> str | None:
    """The facts as ``documents.facts`` keeps them (canonical JSON), None for an event with no
    facts that extracts as usual: such a document is stored and hashed as a v1 event is."""
    if extraction == "auto" and not entities and not relationships:
        return None
    return json.dumps(
        {
            "extraction": extraction,
            "entities": [e.model_dump() for e in entities],
            "relationships": [r.model_dump() for r in relationships],
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def from_stored(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The event fields ``stored_form`` kept (none for NULL)."""
    if not stored:
        return {}
    return {
        "extraction": stored["extraction"],
        "entities": tuple(ProvidedEntity.model_validate(e) for e in stored["entities"]),
        "relationships": tuple(
            ProvidedRelationship.model_validate(r) for r in stored["relationships"]
        ),
    }
