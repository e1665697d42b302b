"""Curation rules as resolution applies them (services/core/curation_rules.py): redirects
followed to the end, blocks both ways round, a document's short forms under both, and the keys
a person's word joins whatever their types."""

from __future__ import annotations

from services.core.curation_rules import MAX_REDIRECTS, NO_RULES, CurationRules
from services.core.extraction import ExtractedEntity
from services.indexer.resolution import document_surfaces

RULES = CurationRules(
    version=3,
    redirects={"mao": "mao zedong", "chairman mao": "mao", "nixon": "richard nixon"},
    blocks=frozenset({frozenset(("christopher nolan", "nolan"))}),
)


def test_redirects_are_followed_to_the_end_and_stop_on_a_loop() -> None:
    assert RULES.target("chairman mao") == "mao zedong"
    assert RULES.target("zhou enlai") == "zhou enlai"
    loop = CurationRules(redirects={"a": "b", "b": "a"})
    assert loop.target("a") in {"a", "b"}  # bounded: MAX_REDIRECTS steps, no hang
    assert MAX_REDIRECTS >= 2


def test_blocks_hold_both_ways_and_never_for_one_key() -> None:
    assert RULES.apart("nolan", "christopher nolan")
    assert RULES.apart("christopher nolan", "nolan")
    assert not RULES.apart("nolan", "nolan")
    assert not RULES.apart("nolan", "jonathan nolan")


def test_a_documents_short_forms_under_the_rules() -> None:
    local = {"nolan": "christopher nolan", "nixon": "richard milhous nixon", "zhou": "zhou enlai"}
    keys = {"nolan", "christopher nolan", "nixon", "richard milhous nixon", "zhou", "chairman mao"}
    canonical, forced = RULES.canonical(local, keys)
    assert "nolan" not in canonical  # blocked from its long form: its own name
    assert canonical["nixon"] == "richard nixon"  # a person's redirect beats the short form
    assert canonical["zhou"] == "zhou enlai"  # no rule: the document's reading stands
    assert canonical["chairman mao"] == "mao zedong"
    assert forced == {"richard nixon", "mao zedong"}


def test_a_redirect_target_is_forced_even_under_its_own_name() -> None:
    """Whichever of the joined names arrives first creates the entity: every surface of the
    target joins it whatever its type, so the graph does not depend on arrival order."""
    canonical, forced = RULES.canonical({}, {"mao zedong"})
    assert canonical == {}
    assert forced == {"mao zedong"}
    entities = [ExtractedEntity("Mao Zedong", "PERSON", 0, 10, "s")]
    (surface,) = document_surfaces(entities, canonical, forced).values()
    assert surface.forced


def test_no_rules_change_nothing() -> None:
    local = {"nolan": "christopher nolan"}
    assert NO_RULES.canonical(local, {"nolan", "christopher nolan"}) == (local, set())
