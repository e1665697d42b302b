from __future__ import annotations

from services.core.extraction import ExtractedEntity
from services.indexer.graph_store.locks import key_hash
from services.indexer.resolution import (
    WILDCARD,
    compatible,
    creation_keys,
    document_surfaces,
    local_canonical,
    type_group,
)


def ent(name: str, etype: str) -> ExtractedEntity:
    return ExtractedEntity(name=name, type=etype, start=0, end=len(name), sentence=name)


def test_type_groups() -> None:
    assert type_group("GPE") == type_group("LOC") == "PLACE"
    assert type_group("MISC") == WILDCARD
    assert compatible("PERSON", WILDCARD)
    assert not compatible("PERSON", "PLACE")


def test_surname_resolves_to_the_full_name_in_the_same_document() -> None:
    ents = [ent("Nolan", "PERSON"), ent("Christopher Nolan", "PERSON"), ent("London", "GPE")]
    assert local_canonical(ents) == {"nolan": "christopher nolan"}


def test_ambiguous_surname_is_left_alone() -> None:
    ents = [ent("Curie", "PERSON"), ent("Marie Curie", "PERSON"), ent("Pierre Curie", "PERSON")]
    assert local_canonical(ents) == {}


def test_acronym_resolves_to_the_org() -> None:
    ents = [ent("International Business Machines", "ORG"), ent("IBM", "ORG")]
    assert local_canonical(ents) == {"ibm": "international business machines"}


def test_surname_of_a_place_is_not_a_person() -> None:
    ents = [ent("Washington", "GPE"), ent("George Washington", "PERSON")]
    assert local_canonical(ents) == {}


def test_surfaces_take_the_full_name_and_majority_typed_group() -> None:
    ents = [
        ent("Nolan", "PERSON"),
        ent("Christopher Nolan", "TOPIC"),
        ent("Christopher Nolan", "PERSON"),
    ]
    surfaces = document_surfaces(ents, local_canonical(ents))
    assert set(surfaces) == {"christopher nolan"}
    assert surfaces["christopher nolan"].name == "Christopher Nolan"
    assert surfaces["christopher nolan"].group == "PERSON"


def test_middle_names_are_thesame_person() -> None:
    from services.indexer.resolution import Surface, same_person

    helen = Surface("helen elizabeth hunt", "Helen Elizabeth Hunt", "PERSON")
    assert same_person(helen, "Helen Hunt", "PERSON")
    assert not same_person(helen, "Helen Mirren", "PERSON")
    assert not same_person(helen, "Helen Hunt", "PLACE")


def test_middle_names_resolve_to_the_short_form_in_the_same_document() -> None:
    ents = [ent("Richard Bach", "TOPIC"), ent("Richard David Bach", "PERSON")]
    assert local_canonical(ents) == {"richard david bach": "richard bach"}


def test_creation_locks_cover_the_short_forms_of_a_new_name() -> None:
    canonical = {"nolan": "christopher nolan", "ibm": "international business machines"}
    assert creation_keys(["christopher nolan"], canonical) == ["christopher nolan", "nolan"]
    assert creation_keys(["paris"], canonical) == ["paris"]


def test_name_lock_hash_is_stable_and_fits_int4() -> None:
    assert key_hash("redmond") == key_hash("redmond")
    assert key_hash("redmond") != key_hash("seattle")
    assert all(-(2**31) <= key_hash(k) < 2**31 for k in ("", "a", "christopher nolan"))
