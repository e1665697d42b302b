"""entity_key: the exact-match normalisation step of entity resolution."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.core.normalize import entity_key


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Christopher Nolan", "christopher nolan"),
        ("  Christopher   NOLAN ", "christopher nolan"),
        ("Apple Inc.", "apple"),
        ("Apple, Inc", "apple"),
        ("Apple Corporation", "apple"),
        ("Acme Holdings Co., Ltd.", "acme holdings"),
        ("Siemens GmbH", "siemens"),
        ("Nestlé S.A.", "nestle"),
        ("BP plc", "bp"),
        ("Smith & Co.", "smith"),
        ("The Beatles", "beatles"),
        ("A Tribe Called Quest", "tribe called quest"),
        ("Shaw's", "shaw"),
        ("Shaw’s", "shaw"),
        ("U.S.", "us"),
        ("O'Brien", "obrien"),
        ("Beyoncé", "beyonce"),
        ("Jay-Z", "jay z"),
        ("Johnson & Johnson", "johnson and johnson"),
        ("ＡＢＣ Corp", "abc"),  # fullwidth letters fold under NFKC
        ("STRASSE", "strasse"),
        ("Straße", "strasse"),  # casefold, not lower
    ],
)
def test_examples(name: str, key: str) -> None:
    assert entity_key(name) == key


@pytest.mark.parametrize("name", ["The", "Inc.", "Ltd", "A", "the inc"])
def test_never_empty_for_alphanumeric_names(name: str) -> None:
    assert entity_key(name) != ""


def test_non_latin_marks_are_kept() -> None:
    # Dropping combining marks would change these letters.
    assert entity_key("ガンダム") == "ガンダム"
    assert entity_key("हिन्दी") == "हिन्दी"


def test_variants_share_a_key() -> None:
    variants = ["The Walt Disney Company Inc.", "walt disney company", "Walt Disney Company, Inc"]
    assert len({entity_key(v) for v in variants}) == 1


def test_symbol_only_names_are_deterministic() -> None:
    assert entity_key("!!!") == entity_key("!!!")
    assert entity_key("") == ""


@given(st.text(max_size=40))
def test_deterministic_and_nonempty(name: str) -> None:
    key = entity_key(name)
    assert entity_key(name) == key
    assert key == key.strip()
    assert "  " not in key
    if any(ch.isalnum() for ch in name):
        assert key != ""
