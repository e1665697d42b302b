"""Document event v2: the publisher's facts (services/core/facts.py). v1 events stay valid as
they are; a v2 event's facts are checked field by field, and a bad one is a contract violation
with the field's path, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.core.contracts import event_problems, parse_document_event
from services.core.errors import PermanentError
from services.core.facts import ProvidedEntity, ProvidedRelationship
from services.indexer.provided import provided_aliases, provided_mentions, provided_relations

V1 = {
    "event_id": "e1",
    "type": "upsert",
    "doc_id": "d1",
    "title": "Order 7",
    "text": "Acme Corp ordered ten valves from Bolt Works.",
    "occurred_at": "2024-01-01T00:00:00Z",
}
V2: dict[str, Any] = {
    **V1,
    "schema_version": 2,
    "extraction": "provided",
    "entities": [
        {"name": "Acme Corp", "type": "ORG", "aliases": ["Acme Industries", "AI"]},
        {"name": "Jane Roe", "type": "PERSON", "description": "Acme's buyer."},
    ],
    "relationships": [
        {"source": "Jane Roe", "target": "acme industries", "type": "WORKS_AT", "weight": 0.5},
    ],
}


def problems(event: dict[str, Any]) -> list[str]:
    return event_problems(event, 1 << 20)


def test_v1_events_are_valid_unchanged_and_have_no_facts() -> None:
    event = parse_document_event(json.dumps(V1).encode(), 1 << 20)
    assert (event.extraction, event.entities, event.relationships) == ("auto", (), ())
    assert event.facts() is None
    assert problems({**V1, "schema_version": 1}) == []


def test_a_v2_event_parses_into_typed_facts() -> None:
    event = parse_document_event(json.dumps(V2).encode(), 1 << 20)
    assert event.extraction == "provided"
    assert event.entities[0] == ProvidedEntity(
        name="Acme Corp", type="ORG", aliases=("Acme Industries", "AI")
    )
    assert event.relationships == (
        ProvidedRelationship(
            source="Jane Roe", target="acme industries", type="WORKS_AT", weight=0.5
        ),
    )
    stored = json.loads(event.facts() or "")
    assert stored["extraction"] == "provided"
    assert [e["name"] for e in stored["entities"]] == ["Acme Corp", "Jane Roe"]


def test_a_v2_event_without_facts_is_stored_as_a_v1_one() -> None:
    event = parse_document_event(json.dumps({**V1, "schema_version": 2}).encode(), 1 << 20)
    assert event.facts() is None


def test_facts_need_schema_version_2() -> None:
    got = problems({**V1, "entities": V2["entities"]})
    assert "$: extraction, entities, relationships need schema_version 2" in got


def test_unknown_schema_version() -> None:
    assert problems({**V1, "schema_version": 3}) == [
        "$.schema_version: 3 is not a known version [1, 2]"
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"entities": [{"name": "", "type": "ORG"}]},
            "$.entities[0].name: '' should be non-empty",
        ),
        (
            {"entities": [{"name": "Acme", "type": "COMPANY"}]},
            "$.entities[0].type: 'COMPANY' is not one of",
        ),
        (
            {"entities": [{"name": "...", "type": "ORG"}]},
            "$.entities[0].name: '...' has no letter or digit",
        ),
        (
            {"entities": [{"name": "Acme", "type": "ORG"}, {"name": "ACME Inc", "type": "ORG"}]},
            "$.entities[1].name: 'ACME Inc' also names $.entities[0]",
        ),
        (
            {
                "entities": [
                    {"name": "Acme", "type": "ORG", "aliases": ["Bolt"]},
                    {"name": "Bolt", "type": "ORG"},
                ]
            },
            "$.entities[1].name: 'Bolt' also names $.entities[0]",
        ),
        (
            {"relationships": [{"source": "Jane Roe", "target": "Nobody"}]},
            "$.relationships[0].target: 'Nobody' names no entity of this event",
        ),
        (
            {"relationships": [{"source": "AI", "target": "Acme Corp"}]},
            "$.relationships[0]: source and target name the same entity",
        ),
        (
            {"relationships": [{"source": "Jane Roe", "target": "Acme", "weight": 0}]},
            "$.relationships[0].weight: 0 is less than or equal to the minimum of 0",
        ),
        (
            {"relationships": [{"source": "Jane Roe", "target": "Acme", "weight": 1.5}]},
            "$.relationships[0].weight: 1.5 is greater than the maximum of 1",
        ),
        (
            {"relationships": [{"source": "Jane Roe", "target": "Acme", "type": "works at"}]},
            "$.relationships[0].type: 'works at' does not match",
        ),
        ({"extraction": "none"}, "$.extraction: 'none' is not one of ['auto', 'provided']"),
        (
            {"entities": [{"name": f"E{i}", "type": "MISC"} for i in range(201)]},
            "$.entities: [",
        ),
        ({"entities": [{"name": "Acme", "type": "ORG", "url": "x"}]}, "$.entities[0]: Additional"),
        ({"title": " ", "text": "\n"}, "$.entities: a document with neither title nor text"),
        (
            {"entities": [{"name": "Acme", "type": "ORG", "aliases": ["a\x01b"]}]},
            "$.entities[0].aliases[0]: must not contain control characters",
        ),
        (
            {
                "entities": [
                    {"name": "Acme", "type": "ORG", "aliases": [f"A{i}" for i in range(21)]}
                ]
            },
            "$.entities[0].aliases: [",
        ),
        (
            {"entities": [{"name": "Acme", "type": "ORG", "description": "x" * 2001}]},
            "$.entities[0].description: 'xxxx",
        ),
    ],
)
def test_bad_facts_are_named_by_field(change: dict[str, Any], expected: str) -> None:
    base = {**V2, "relationships": []} if "entities" in change else V2
    event = {**base, **change}
    got = problems(event)
    assert any(p.startswith(expected) for p in got), got
    with pytest.raises(PermanentError) as info:
        parse_document_event(json.dumps(event).encode(), 1 << 20)
    assert info.value.reason == "contract_violation"


@pytest.mark.parametrize("field", ["extraction", "entities", "relationships"])
def test_a_delete_carries_no_facts(field: str) -> None:
    delete = {
        "schema_version": 2,
        "event_id": "e2",
        "type": "delete",
        "doc_id": "d1",
        "occurred_at": "2024-01-01T00:00:00Z",
    }
    assert problems(delete) == []
    assert problems({**delete, field: V2[field]}) == [f"$.{field}: a delete carries no facts"]


def test_provided_facts_become_mentions_aliases_and_relations_of_their_entities() -> None:
    event = parse_document_event(json.dumps(V2).encode(), 1 << 20)
    mentions = provided_mentions(event)
    assert [(m.name, m.type, m.start) for m in mentions] == [
        ("Acme Corp", "ORG", -2),
        ("Acme Industries", "ORG", -3),
        ("AI", "ORG", -4),
        ("Jane Roe", "PERSON", -5),
    ]
    assert mentions[3].sentence == "Acme's buyer."
    # "Acme Corp" normalises to "acme" (the corporate suffix goes).
    assert provided_aliases(event, {}) == {"acme industries": "acme", "ai": "acme"}
    # The publisher's word wins over the document's guessed short forms.
    assert provided_aliases(event, {"ai": "artificial intelligence"})["ai"] == "acme"
    (rel,) = provided_relations(event)
    assert (rel.source, rel.target, rel.type, rel.strength) == (
        "Jane Roe",
        "Acme Corp",
        "WORKS_AT",
        0.5,
    )
